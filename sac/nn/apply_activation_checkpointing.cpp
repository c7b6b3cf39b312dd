#include <sac/nn/apply_activation_checkpointing.h>

#include <sac/nn/checkpoint_wrapper.h>

#include <c10/util/Exception.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstddef>
#include <sstream>
#include <vector>

namespace sac {
namespace {

// A chosen module and where it is held.
struct Target {
  std::string name;  // qualified
  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<torch::nn::Module> parent;
  std::string key;  // its name in the parent
};

// Every chosen module below `parent`, parents before their children.
void choose(const std::shared_ptr<torch::nn::Module>& parent, const std::string& prefix,
            const ModulePredicate& predicate, std::vector<Target>& chosen) {
  for (const auto& child : parent->named_children()) {
    const std::string name = prefix.empty() ? child.key() : prefix + "." + child.key();
    if (predicate(name, *child.value())) {
      chosen.push_back(Target{name, child.value(), parent, child.key()});
    }
    choose(child.value(), name, predicate, chosen);
  }
}

// The Sequential entry holding `target`, or null if it is not one. A
// Sequential registers its entries in order, so the entry is the one at the
// position of the target's name among the children.
torch::nn::AnyModule* sequential_entry(const Target& target) {
  auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(target.parent.get());
  if (sequential == nullptr) {
    return nullptr;
  }
  const auto children = sequential->named_children();
  for (size_t i = 0; i < children.size() && i < sequential->size(); ++i) {
    if (children[i].key() == target.key) {
      auto& entry = *(sequential->begin() + static_cast<std::ptrdiff_t>(i));
      return entry.ptr() == target.module ? &entry : nullptr;
    }
  }
  return nullptr;
}

// Where a module that cannot be wrapped in place is held, for the error.
std::string where_held(const Target& target, const std::string& parent_name) {
  const std::string parent = parent_name.empty() ? "the root module" : "`" + parent_name + "`";
  if (dynamic_cast<torch::nn::ModuleListImpl*>(target.parent.get()) != nullptr) {
    return "an entry of the torch::nn::ModuleList " + parent;
  }
  if (dynamic_cast<torch::nn::ModuleDictImpl*>(target.parent.get()) != nullptr) {
    return "an entry of the torch::nn::ModuleDict " + parent;
  }
  return "a child of " + parent + " (" + target.parent->name() + ")";
}

[[noreturn]] void throw_not_wrappable(const std::vector<const Target*>& targets) {
  std::ostringstream message;
  message << "sac::apply_activation_checkpointing: cannot wrap in place";
  for (const Target* target : targets) {
    const auto dot = target->name.rfind('.');
    const std::string parent_name =
        dot == std::string::npos ? std::string() : target->name.substr(0, dot);
    message << "\n  `" << target->name << "` (" << target->module->name() << "), "
            << where_held(*target, parent_name);
  }
  message << "\nIts parent calls its forward through its own C++ type, which no "
             "wrapper can redirect (forward is not virtual); only entries of a "
             "torch::nn::Sequential are called type-erased. Instead: hold the "
             "module in a torch::nn::Sequential; or declare it as "
             "sac::CheckpointWrapper<"
          << targets.front()->module->name()
          << "> (parameter names do not change); or call sac::checkpoint around its "
             "forward in the parent's forward. Nothing was wrapped.";
  TORCH_CHECK(false, message.str());
}

}  // namespace

int64_t apply_activation_checkpointing(const std::shared_ptr<torch::nn::Module>& model,
                                       const ModulePredicate& predicate,
                                       std::optional<CheckpointOptions> options) {
  TORCH_CHECK(model != nullptr, "sac::apply_activation_checkpointing: got no model (null).");
  TORCH_CHECK(predicate != nullptr,
              "sac::apply_activation_checkpointing: got no predicate to choose modules by.");
  std::vector<Target> chosen;
  choose(model, "", predicate, chosen);

  // All or nothing: check every chosen module before changing any.
  std::vector<const Target*> not_wrappable;
  for (const Target& target : chosen) {
    if (sequential_entry(target) == nullptr) {
      not_wrappable.push_back(&target);
    }
  }
  if (!not_wrappable.empty()) {
    throw_not_wrappable(not_wrappable);
  }

  // Children before their parents, so that a chosen module inside another
  // is wrapped before the outer wrapper takes over the outer module's children.
  for (auto it = chosen.rbegin(); it != chosen.rend(); ++it) {
    torch::nn::AnyModule* entry = sequential_entry(*it);
    auto wrapper = std::make_shared<CheckpointWrapperImpl<torch::nn::AnyModule>>(*entry, options);
    wrapper->set_region_name(it->name);  // for errors: "region `blocks.3`", scoped options too
    *entry = torch::nn::AnyModule(wrapper);
    it->parent->replace_module(it->key, wrapper);
  }
  return static_cast<int64_t>(chosen.size());
}

}  // namespace sac
