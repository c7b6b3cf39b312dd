#include <sac/checkpoint/graph_exec_group.h>

#include <c10/util/Exception.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <atomic>
#include <limits>
#include <memory>
#include <string_view>

namespace sac {
namespace {

// ThreadLocalDebugInfo is part of the state the autograd engine carries to
// its device threads (at::ThreadLocalState): a group entered on the calling
// thread is seen where the unpack hooks run.
constexpr std::string_view kGroupKindName = "sac::GraphExecGroup";
const c10::DebugInfoKind kGroupKind(&kGroupKindName);

struct GroupInfo final : c10::DebugInfoBase {
  explicit GroupInfo(int64_t id) : id(id) {}
  const int64_t id;
};

}  // namespace

struct GraphExecGroup::Guard {
  explicit Guard(int64_t id) : info(kGroupKind, std::make_shared<GroupInfo>(id)) {}
  c10::DebugInfoGuard info;
};

std::optional<int64_t> GraphExecGroup::current_id() {
  const auto* info = static_cast<const GroupInfo*>(c10::ThreadLocalDebugInfo::get(kGroupKind));
  return info == nullptr ? std::nullopt : std::optional<int64_t>(info->id);
}

GraphExecGroup::GraphExecGroup() {
  const auto outer = current_id();
  TORCH_CHECK(!outer.has_value(),
              "sac::GraphExecGroup groups cannot be nested: this thread is "
              "already inside group ",
              *outer, ". End the outer group first, or put the backward passes into it.");
  // Graph task ids count up from 0 and a checkpoint's ids for unpacks
  // outside backward down from -2: groups count up from far below both.
  static std::atomic<int64_t> next{std::numeric_limits<int64_t>::min() / 2};
  guard_ = std::make_unique<Guard>(next.fetch_add(1));
}

GraphExecGroup::~GraphExecGroup() = default;

}  // namespace sac
