// sac::OffloadGuard: keep the tensors saved for backward in host memory.
//
//   {
//     sac::OffloadGuard offload(sac::OffloadOptions().leave_in_place(model->parameters()));
//     loss = model->forward(x);   // what autograd saves moves to the host
//   }
//   loss.backward();              // and comes back as backward needs it
//
// PyTorch's torch.autograd.graph.save_on_cpu and offload_wrapper. While the
// guard lives, every tensor autograd saves on this thread is copied to host
// memory (pinned, asynchronously, when it is on an accelerator) and the
// original is released; backward copies it back to its device. It composes
// with checkpoints: a checkpoint inside the guard keeps its inputs and the
// outputs its policy caches on the host too (PyTorch's SAC keeps its cache on
// the device whatever hooks are active: PyTorch issue 191236), while what the
// checkpoint will recompute is not saved at all. Put the guard outside the
// checkpoints: inside a checkpointed function, the innermost hooks win and
// the guard would save on the host what the checkpoint meant to recompute.
//
// A tensor saved for backward and then modified in place is an error at
// backward, as it is in autograd without hooks (PyTorch's hooks lose that
// check; sac keeps it).
#pragma once

#include <sac/base/copy_target.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace sac {

namespace detail {
class SavedTensorHooksGuard;
class StashScope;
}  // namespace detail

class OffloadOptions {
 public:
  // Tensors of fewer bytes stay where they are: copying many small tensors
  // costs more than it saves (Megatron's min_offloaded_tensor_size).
  // Default 0: everything moves, as with save_on_cpu.
  OffloadOptions& min_bytes(int64_t bytes) {
    min_bytes_ = bytes;
    return *this;
  }
  // Tensors on these tensors' storages stay where they are. Pass the model's
  // parameters: they stay on the device anyway, so a host copy would only
  // add traffic and host memory (save_on_cpu copies them).
  OffloadOptions& leave_in_place(const std::vector<at::Tensor>& tensors) {
    in_place_.insert(in_place_.end(), tensors.begin(), tensors.end());
    return *this;
  }
  // Where tensors go. Default host_memory().
  OffloadOptions& target(std::shared_ptr<CopyTarget> target) {
    target_ = std::move(target);
    return *this;
  }

  int64_t min_bytes() const { return min_bytes_; }
  const std::vector<at::Tensor>& left_in_place() const { return in_place_; }
  const std::shared_ptr<CopyTarget>& target() const { return target_; }

 private:
  int64_t min_bytes_ = 0;
  std::vector<at::Tensor> in_place_;
  std::shared_ptr<CopyTarget> target_;
};

// While alive, tensors saved for backward on this thread, and the tensors
// checkpoints inside keep, go to the options' target. Guards nest (the
// innermost wins) and undo themselves however the scope ends.
class OffloadGuard {
 public:
  explicit OffloadGuard(OffloadOptions options = OffloadOptions());
  ~OffloadGuard();
  OffloadGuard(const OffloadGuard&) = delete;
  OffloadGuard& operator=(const OffloadGuard&) = delete;

 private:
  std::unique_ptr<detail::SavedTensorHooksGuard> hooks_;
  std::unique_ptr<detail::StashScope> stash_;
};

}  // namespace sac
