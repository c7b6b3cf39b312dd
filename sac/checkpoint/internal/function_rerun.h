// Recomputation by calling the checkpointed function again: sac::checkpoint's
// (and PyTorch's non-reentrant checkpoint's) way.
//
// The function runs with autograd, under hooks that hand each tensor autograd
// saves to the frame's next holder; the function's tensor arguments are kept
// as autograd keeps the inputs it saves. With the outside-tensor check on,
// the reads of tensors the region did not make are watched
// (outside_tensor_watch.h).
#pragma once

#include <sac/checkpoint/checkpoint.h>
#include <sac/check/internal/outside_tensor_watch.h>
#include <sac/check/internal/read_watch.h>
#include <sac/checkpoint/internal/recomputation.h>

#include <torch/csrc/autograd/saved_variable.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace sac::detail {

class FunctionRerun final : public Recomputation {
 public:
  FunctionRerun(RecomputeFn fn, bool outside_tensor_check);

  // Saves the inputs as autograd would (version-checked at unpack). Called
  // before the forward hooks are installed, so that an enclosing
  // checkpoint's hooks see them (that is how checkpoints nest).
  void save_inputs(const std::vector<at::Tensor>& inputs);

  // What observes the forward's ops, or null (outside-tensor check off).
  detail::OpObserver* forward_observer() {
    return outside_tensors_ ? outside_tensors_->forward_observer() : nullptr;
  }

  std::unique_ptr<Pass> begin(CheckpointFrame& frame, int64_t graph_task) override;

  // Known only with the outside-tensor check on (its watch sees the writes).
  bool overwrites_before_reading(const void* counter) const override {
    return outside_tensors_ && outside_tensors_->owned_by_region(counter);
  }

 private:
  class RerunPass;

  RecomputeFn fn_;
  std::unique_ptr<OutsideTensorWatch> outside_tensors_;
  std::vector<torch::autograd::SavedVariable> saved_inputs_;
  // Their versions when saved: modified in place since is an error of its
  // own, told apart from what unpacking them raises (an enclosing region's
  // recomputation).
  std::vector<std::optional<ReadWatch>> input_versions_;
};

}  // namespace sac::detail
