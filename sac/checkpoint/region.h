// sac::CheckpointRegion: checkpointing whatever code runs while a guard
// lives, with nothing to wrap into a function.
//
//   torch::Tensor y;
//   {
//     sac::CheckpointRegion region(sac::CheckpointOptions().policy(policy));
//     y = model->forward(x);  // any code: modules, loops, branches, logging
//   }                         // the region ends here
//   loss_fn(y).backward();    // replays the region's recorded aten ops
//
// While the guard lives, the aten ops its thread runs are recorded below
// autograd (sac/record/), and the tensors autograd saves are replaced by
// holders, as in sac::checkpoint. The first holder a backward pass needs
// replays the recorded calls below autograd: not the code, so no function
// to call again, no second autograd graph, and exactly the forward's op
// sequence (a branch on item() cannot go the other way). With a policy, the
// outputs of the calls it saves are kept and served instead of replayed;
// replay stops once every holder is filled (early stop).
//
// Outside tensors (parameters, buffers, tensors made before the region) are
// kept as autograd keeps the inputs it saves: modifying one in place before
// backward is autograd's "modified by an inplace operation" error. Memory of
// outside tensors that the region writes (a BatchNorm's running statistics)
// is copied before the first write and replay writes a copy: the running
// statistics are updated once, by the forward.
//
// Guards nest, with each other and with sac::checkpoint. Under no_grad a
// guard does nothing. If the code throws, the guard's destructor ends the
// region and frees what it recorded; tensors the region made cannot be
// backwarded through then.
//
// The guard needs sac's fallback-key dispatch mechanism, the only one that
// sees views and in-place ops (Note [The interceptor]); under per-op
// kernels it throws, and sac::checkpoint is the way. Limits of recording are
// listed in sac/record/internal/recorder.h: memory written through data_ptr() into a
// tensor that already held data is not seen, nor side effects of custom ops
// beyond the writes their schema declares. Collectives are replayed, after
// the ranks agree on what they replay (Note [Ranks agree before a replay]).
#pragma once

#include <sac/checkpoint/options.h>

#include <memory>

namespace sac {

class CheckpointRegion;
namespace detail {
// Ends `region` now, as its destructor does, after code that completed or
// threw: for hosts whose exceptions do not unwind C++ (Python's `with`).
void end_region(CheckpointRegion& region, bool threw);
}  // namespace detail

class CheckpointRegion {
 public:
  // Begins the region on this thread. Throws (leaving nothing active) if the
  // fallback key is unavailable or the options contradict each other.
  // `outside_tensor_check` cannot be turned off: outside tensors are always
  // checked, as autograd's saved inputs are.
  explicit CheckpointRegion(const CheckpointOptions& options);
  // With the options of the innermost CheckpointScope on this thread, or the
  // defaults (full recomputation).
  CheckpointRegion();
  // Ends the region. Regions on a thread end in the reverse order they began.
  ~CheckpointRegion();
  CheckpointRegion(const CheckpointRegion&) = delete;
  CheckpointRegion& operator=(const CheckpointRegion&) = delete;

 private:
  friend void detail::end_region(CheckpointRegion& region, bool threw);
  void end(bool threw);

  struct Active;
  std::unique_ptr<Active> active_;
};

}  // namespace sac
