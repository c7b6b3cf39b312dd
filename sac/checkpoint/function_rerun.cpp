#include <sac/checkpoint/internal/function_rerun.h>

#include <sac/base/internal/check.h>
#include <sac/base/internal/saved_tensor_hooks.h>
#include <sac/checkpoint/internal/frame.h>
#include <sac/check/internal/in_place_reads.h>

#include <ATen/core/grad_mode.h>
#include <c10/util/irange.h>

#include <optional>

namespace sac::detail {
namespace {

class RecomputeHooks final : public torch::autograd::SavedVariableHooks {
 public:
  RecomputeHooks(std::weak_ptr<CheckpointFrame> frame, int64_t graph_task)
      : frame_(std::move(frame)), graph_task_(graph_task) {}
  void call_pack_hook(const at::Tensor& tensor) override {
    value_ = tensor.requires_grad() ? tensor.detach() : tensor;
    auto frame = frame_.lock();
    TORCH_INTERNAL_ASSERT(frame, "sac: checkpoint frame freed during its recomputation");
    frame->save_recomputed(graph_task_, value_);
  }
  // A graph built during recomputation is only backwarded through by a
  // backward inside the checkpointed function; it sees the tensor as saved.
  at::Tensor call_unpack_hook() override { return value_; }

 private:
  std::weak_ptr<CheckpointFrame> frame_;
  int64_t graph_task_;
  at::Tensor value_;
};

}  // namespace

class FunctionRerun::RerunPass final : public Recomputation::Pass {
 public:
  RerunPass(FunctionRerun& rerun, CheckpointFrame& frame, int64_t graph_task,
            std::vector<at::Tensor> inputs)
      : rerun_(rerun),
        frame_(frame.weak_from_this()),
        graph_task_(graph_task),
        inputs_(std::move(inputs)) {}

  void run() override {
    std::optional<detail::ObserverGuard> watch;
    std::optional<InPlaceReadsScope> in_place_reads;
    std::optional<OutsideTensorWatch::KeptHistories> histories;
    if (rerun_.outside_tensors_) {
      histories.emplace(*rerun_.outside_tensors_);
      watch.emplace(rerun_.outside_tensors_->recompute_observer());
      in_place_reads.emplace(rerun_.outside_tensors_->recompute_observer());
    }
    SavedTensorHooksGuard hooks([frame = frame_, graph_task = graph_task_] {
      return std::make_unique<RecomputeHooks>(frame, graph_task);
    });
    at::AutoGradMode enable_grad(true);
    try {
      rerun_.fn_(inputs_);
    } catch (...) {
      if (in_place_reads) {
        in_place_reads->rethrow_pending();  // what went wrong first
      }
      throw;
    }
    if (in_place_reads) {
      in_place_reads->rethrow_pending();
    }
  }

 private:
  FunctionRerun& rerun_;
  std::weak_ptr<CheckpointFrame> frame_;
  int64_t graph_task_;
  std::vector<at::Tensor> inputs_;
};

FunctionRerun::FunctionRerun(RecomputeFn fn, bool outside_tensor_check) : fn_(std::move(fn)) {
  if (outside_tensor_check) {
    outside_tensors_ = std::make_unique<OutsideTensorWatch>();
  }
}

void FunctionRerun::save_inputs(const std::vector<at::Tensor>& inputs) {
  saved_inputs_.reserve(inputs.size());
  input_versions_.reserve(inputs.size());
  for (const auto& input : inputs) {
    input_versions_.emplace_back(input.defined() ? std::optional<ReadWatch>(input) : std::nullopt);
    saved_inputs_.push_back(save_input(input));  // Note [Saving a stale view]
  }
}

std::unique_ptr<Recomputation::Pass> FunctionRerun::begin(CheckpointFrame& frame,
                                                          int64_t graph_task) {
  std::vector<at::Tensor> inputs;
  inputs.reserve(saved_inputs_.size());
  for (const auto i : c10::irange(saved_inputs_.size())) {
    const std::optional<ReadWatch>& version = input_versions_[i];
    SAC_CHECKPOINT_CHECK(!(version.has_value() && version->changed()),
                         "sac::checkpoint: tensor argument ", i,
                         " of the checkpointed function cannot be given to its recomputation: "
                         "it was modified by an inplace operation after the checkpoint call "
                         "(version ",
                         version->version().version(), " then, ",
                         version->version().current_version(),
                         " now).\nsac::checkpoint keeps its tensor arguments as autograd keeps the "
                         "inputs it saves, so they must not be modified in place between the "
                         "checkpoint call and backward; the checkpointed function modifying "
                         "its own argument counts too. Pass a clone (sac::checkpoint(fn, "
                         "x.clone())), or move the modification out of the region.");
    // An enclosing region may hold it: unpacking recomputes that region,
    // whose errors are its own.
    inputs.push_back(saved_inputs_[i].unpack());
  }
  return std::make_unique<RerunPass>(*this, frame, graph_task, std::move(inputs));
}

}  // namespace sac::detail
