// sac::GraphExecGroup: several backward passes that recompute each region once.
//
//   {
//     sac::GraphExecGroup group;
//     auto g1 = torch::autograd::grad({loss1}, {w1}, {}, /*retain_graph=*/true);
//     auto g2 = torch::autograd::grad({loss2}, {w2});
//   }
//
// PyTorch's torch.utils.checkpoint.GraphExecGroup. Each backward pass
// normally recomputes every checkpointed region it reaches. Inside one group,
// a region is recomputed by the first backward pass that needs it, and the
// later passes use what that recomputation made. Backward passes of one group
// must therefore cover parts of the graph that do not overlap: a saved tensor
// needed by two of them is an error at its second use. Groups do not nest.
// The group is the thread's, and it reaches the autograd engine's device
// threads with the rest of the thread's state.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

namespace sac {

class GraphExecGroup {
 public:
  // Throws if this thread is inside a group already.
  GraphExecGroup();
  ~GraphExecGroup();
  GraphExecGroup(const GraphExecGroup&) = delete;
  GraphExecGroup& operator=(const GraphExecGroup&) = delete;

  // The id under which checkpoints key the current group's
  // recomputations, or nullopt outside a group.
  static std::optional<int64_t> current_id();

 private:
  struct Guard;
  std::unique_ptr<Guard> guard_;
};

}  // namespace sac
