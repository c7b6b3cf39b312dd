#include <sac/record/internal/communication.h>

#include <sac/base/internal/check.h>
#include <sac/dispatch/internal/boxed.h>
#include <sac/dispatch/internal/interceptor.h>
#include <sac/policy/internal/op_traits.h>

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>

namespace sac::detail {
namespace {

struct NamedGroup {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  std::string name;
};

// The group a collective runs on: its ProcessGroup argument (c10d:: ops), or
// the group its group_name names (functional collectives).
std::optional<NamedGroup> group_of(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  const auto& arguments = op.schema().arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& arg = args[i];
    if (arg.isCustomClass() && arg.type()->str().find("ProcessGroup") != std::string::npos) {
      auto group = arg.toCustomClass<c10d::ProcessGroup>();
      std::string name = group->getGroupName();
      return NamedGroup{std::move(group), std::move(name)};
    }
    if (arg.isString() && arguments[i].name() == "group_name") {
      return NamedGroup{c10d::resolve_process_group(arg.toStringRef()), arg.toStringRef()};
    }
  }
  return std::nullopt;
}

std::optional<c10::Device> device_of(c10::ArrayRef<c10::IValue> args) {
  std::optional<c10::Device> device;
  for (const c10::IValue& arg : args) {
    detail::for_each_tensor(arg, [&](const at::Tensor& t) {
      if (!device.has_value()) {
        device = t.device();
      }
    });
  }
  return device;
}

// How many collectives regions of this process recorded on each group so
// far: the number the next one gets.
int64_t next_index(const void* group) {
  static std::mutex mutex;
  static std::unordered_map<const void*, int64_t> recorded;
  std::lock_guard<std::mutex> lock(mutex);
  return recorded[group]++;
}

// "collective 3", "collectives 3 to 5": a region's calls among its group's.
std::string span(int64_t first, int64_t calls) {
  return calls == 1 ? c10::str("collective ", first)
                    : c10::str("collectives ", first, " to ", first + calls - 1);
}

uint64_t fnv1a(uint64_t hash, const std::string& text) {
  for (const unsigned char c : text) {
    hash = (hash ^ c) * 1099511628211ull;
  }
  return hash;
}

}  // namespace

void Communication::note(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  std::optional<NamedGroup> group = group_of(op, args);
  TORCH_CHECK(group.has_value(), "sac::CheckpointRegion: the region calls the collective ",
              op.operator_name(),
              ", which names no process group (no ProcessGroup or "
              "group_name argument): its replay could not agree with the other ranks before "
              "communicating again. Run it outside the region, or checkpoint this code with "
              "sac::checkpoint.");
  Group* entry = nullptr;
  for (Group& known : groups_) {
    if (known.group.get() == group->group.get()) {
      entry = &known;
      break;
    }
  }
  const std::string call =
      c10::str(op.operator_name(), "(", detail::collective_signature(args), ")");
  const int64_t index = next_index(group->group.get());
  if (entry == nullptr) {
    Group added;
    added.name = group->name;
    added.device = device_of(args).value_or(c10::Device(c10::kCPU));
    added.first = index;
    added.first_call = call;
    added.group = group->group;
    groups_.push_back(std::move(added));
    entry = &groups_.back();
  }
  ++entry->calls;
  entry->hash = fnv1a(entry->hash, call);
}

size_t Communication::agree() const {
  // sac's own collectives: no observer or cache of a region sees them.
  detail::IsolationGuard unseen;
  for (const Group& entry : groups_) {
    auto group = c10::static_intrusive_pointer_cast<c10d::ProcessGroup>(entry.group);
    const int64_t ranks = group->getSize();
    const auto options = at::TensorOptions().dtype(at::kLong);
    at::Tensor mine = at::empty({3}, options);
    int64_t* p = mine.mutable_data_ptr<int64_t>();
    p[0] = entry.first;
    p[1] = entry.calls;
    p[2] = static_cast<int64_t>(entry.hash);
    at::Tensor all = at::empty({ranks * 3}, options.device(entry.device));
    mine = mine.to(entry.device);
    group->all_gather_single(all, mine)->wait();
    all = all.cpu();
    const int64_t* each = all.const_data_ptr<int64_t>();
    bool same = true;
    for (int64_t r = 0; r < ranks; ++r) {
      same = same && each[3 * r] == entry.first && each[3 * r + 1] == entry.calls &&
             each[3 * r + 2] == static_cast<int64_t>(entry.hash);
    }
    if (same) {
      continue;
    }
    std::ostringstream ranks_say;
    for (int64_t r = 0; r < ranks; ++r) {
      ranks_say << "\n  rank " << r << " of the group: the group's "
                << span(each[3 * r], each[3 * r + 1])
                << (each[3 * r + 2] == static_cast<int64_t>(entry.hash) ? "" : " (other calls)");
    }
    SAC_CHECKPOINT_CHECK(
        false, "sac::CheckpointRegion: the ranks of process group '", entry.name,
        "' are about to replay different regions. A region's replay issues its forward's "
        "collectives again; this rank (",
        group->getRank(),
        " in the group) is about to "
        "replay the region that issued the group's ",
        span(entry.first, entry.calls), " (the first: ", entry.first_call,
        "), and the ranks are replaying:", ranks_say.str(),
        "\nsac stops every rank here instead of pairing collectives that do not match (a hang, "
        "or parameters exchanged with the wrong layer's). A rank's backward replays regions in "
        "another order or skips one when its loss does not use a region's outputs or its code "
        "took another branch: every rank must run its forward and backward through the same "
        "regions in the same order.");
  }
  return groups_.size();
}

void wait_for_work(c10::ArrayRef<c10::IValue> outputs) {
  for (const c10::IValue& output : outputs) {
    if (output.isCustomClass() && output.type()->str().find("Work") != std::string::npos) {
      output.toCustomClass<c10d::Work>()->wait();
    }
  }
}

}  // namespace sac::detail
