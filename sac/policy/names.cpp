#include <sac/policy/names.h>
#include <sac/policy/internal/tag.h>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <unordered_map>
#include <utility>

namespace sac {
namespace {

// An answer per listed name, and `otherwise` for the other names. Every
// cacheable op is in the domain, answered PreferRecompute: the call that
// returned a tagged value must be in the cache for its tag to keep it.
class NameRule final : public Policy::Rule {
 public:
  NameRule(std::string description, std::unordered_map<std::string, CheckpointPolicy> answers,
           CheckpointPolicy otherwise)
      : description_(std::move(description)), answers_(std::move(answers)), otherwise_(otherwise) {}

  CheckpointPolicy decide(const SelectiveCheckpointContext&, const c10::OperatorHandle& op,
                          c10::ArrayRef<c10::IValue> args) const override {
    if (!detail::is_tag(op)) {
      return CheckpointPolicy::PreferRecompute;
    }
    const auto it = answers_.find(detail::tag_name(args));
    return it == answers_.end() ? otherwise_ : it->second;
  }
  Policy::Domain domain() const override {
    Policy::Domain domain = Policy::Domain::every_cacheable();
    domain.tags = true;
    for (const auto& [name, answer] : answers_) {
      domain.names.push_back(name);
    }
    std::sort(domain.names.begin(), domain.names.end());
    return domain;
  }
  std::string describe() const override { return description_; }

 private:
  std::string description_;
  std::unordered_map<std::string, CheckpointPolicy> answers_;
  CheckpointPolicy otherwise_;
};

// Adds `names` to `answers` with `answer`, checking each.
void add_names(const char* factory, const std::vector<std::string>& names, CheckpointPolicy answer,
               std::unordered_map<std::string, CheckpointPolicy>& answers) {
  for (const auto& name : names) {
    TORCH_CHECK(!name.empty(), "sac::", factory,
                " got an empty name; list the names "
                "given to sac::tag.");
    const auto [it, added] = answers.emplace(name, answer);
    TORCH_CHECK(added || it->second == answer, "sac::", factory, ": the name '", name,
                "' is listed both to save and to offload. List it once.");
  }
}

}  // namespace

Policy save_only_these_names(const std::vector<std::string>& names) {
  TORCH_CHECK(!names.empty(), "sac::save_only_these_names got no names, which would "
                              "save nothing; say sac::nothing_saveable() if that is meant.");
  std::unordered_map<std::string, CheckpointPolicy> answers;
  add_names("save_only_these_names", names, CheckpointPolicy::MustSave, answers);
  return Policy(std::make_shared<NameRule>("save_only_these_names(" + c10::Join(", ", names) + ")",
                                           std::move(answers), CheckpointPolicy::PreferRecompute));
}

Policy save_and_offload_only_these_names(const std::vector<std::string>& save,
                                         const std::vector<std::string>& offload) {
  TORCH_CHECK(!save.empty() || !offload.empty(),
              "sac::save_and_offload_only_these_names "
              "got no names, which would keep nothing; say sac::nothing_saveable() if "
              "that is meant.");
  std::unordered_map<std::string, CheckpointPolicy> answers;
  add_names("save_and_offload_only_these_names", save, CheckpointPolicy::MustSave, answers);
  add_names("save_and_offload_only_these_names", offload, CheckpointPolicy::MustCpuOffload,
            answers);
  return Policy(std::make_shared<NameRule>("save_and_offload_only_these_names(save=[" +
                                               c10::Join(", ", save) + "], offload=[" +
                                               c10::Join(", ", offload) + "])",
                                           std::move(answers), CheckpointPolicy::PreferRecompute));
}

Policy save_any_names_but_these(const std::vector<std::string>& names) {
  std::unordered_map<std::string, CheckpointPolicy> answers;
  add_names("save_any_names_but_these", names, CheckpointPolicy::PreferRecompute, answers);
  return Policy(
      std::make_shared<NameRule>("save_any_names_but_these(" + c10::Join(", ", names) + ")",
                                 std::move(answers), CheckpointPolicy::MustSave));
}

}  // namespace sac
