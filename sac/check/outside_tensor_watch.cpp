#include <sac/check/internal/outside_tensor_watch.h>

#include <sac/dispatch/internal/op_facts.h>
#include <sac/base/internal/check.h>
#include <sac/dispatch/internal/boxed.h>
#include <sac/policy/internal/op_traits.h>

#include <torch/csrc/autograd/variable.h>

namespace sac::detail {
namespace {

// Whether `op`'s outputs are new tensors (not views or written arguments).
bool makes_new_tensors(const c10::OperatorHandle& op) {
  for (const auto& ret : op.schema().returns()) {
    if (ret.alias_info() != nullptr) {
      return false;
    }
  }
  return true;
}

}  // namespace

// Calls `f(index, tensor)` for each tensor that `op` reads in `args`.
template <class F>
void for_each_read(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, F&& f) {
  if (only_aliases(op)) {
    return;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    if (!detail::writes_argument(op, i, args)) {
      detail::for_each_tensor(args[i], [&](const at::Tensor& t) { f(i, t); });
    }
  }
}

OutsideTensorWatch::OutsideTensorWatch() {
  // Every op that reaches below autograd and is not a view or in-place op:
  // exactly the ops a policy callback may be asked about.
  detail::intercept_ops_matching(&detail::is_cacheable);
}

OutsideTensorWatch::~OutsideTensorWatch() {
  for (const void* identity : written_) {
    forget_written_by_region(identity);
  }
}

void OutsideTensorWatch::note(const at::Tensor& t, Origin origin) {
  const void* identity = version_counter_identity(t.unsafeGetTensorImpl()->version_counter());
  // Inference tensors have no counter, and cannot be modified in place.
  if (identity == nullptr || seen_.find(identity) != seen_.end()) {
    return;
  }
  seen_.emplace(identity, Seen{ReadWatch(t), origin});
}

void OutsideTensorWatch::note_written(const at::Tensor& t) {
  const void* identity = version_counter_identity(t.unsafeGetTensorImpl()->version_counter());
  const auto it = seen_.find(identity);
  if (identity == nullptr || (it != seen_.end() && it->second.origin == Origin::kMade) ||
      !written_.insert(identity).second) {
    return;
  }
  note_written_by_region(identity);
  // Autograd keeps a written view's history at its base.
  const at::TensorBase& whole = t.is_view() ? t._base() : t;
  histories_.emplace_back(c10::weak_intrusive_ptr<c10::TensorImpl>(
      c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(whole.unsafeGetTensorImpl())));
}

OutsideTensorWatch::KeptHistories::KeptHistories(const OutsideTensorWatch& watch) {
  for (const auto& weak : watch.histories_) {
    if (c10::intrusive_ptr<c10::TensorImpl> impl = weak.lock()) {
      at::Tensor t(std::move(impl));
      torch::autograd::Edge history(t.grad_fn(), static_cast<uint32_t>(t.output_nr()));
      kept_.push_back({std::move(t), std::move(history)});
    }
  }
}

OutsideTensorWatch::KeptHistories::~KeptHistories() {
  for (const Kept& k : kept_) {
    if (k.tensor.grad_fn() != k.history.function) {
      torch::autograd::impl::set_gradient_edge(k.tensor, k.history);
    }
  }
}

bool OutsideTensorWatch::owned_by_region(const void* counter) const {
  const auto it = seen_.find(counter);
  return it != seen_.end() && it->second.origin != Origin::kOutside;
}

void OutsideTensorWatch::Noter::before_op(const detail::ObservedOp& call,
                                          c10::ArrayRef<c10::IValue> args) {
  const c10::OperatorHandle& op = call.op;
  for_each_read(op, args, [&](size_t, const at::Tensor& t) { watch_.note(t, Origin::kOutside); });
  // Note [Overwritten before read]: a tensor from outside that the region
  // overwrites whole (buf.copy_(a), an out= argument) before any op reads
  // it holds, from then on, what the region wrote: the recomputation writes
  // it again before reading it, and reads what the forward read. It is the
  // region's own, as a tensor the region made is. (Written in part, or
  // read first, it stays outside and is checked.) Whatever the region
  // writes of a tensor from outside, whole or in part, is written again by
  // the recomputation: the reads of it, the region's own later ones and
  // other regions', watch its bytes (Note [Rewritten by a recomputation]).
  for (size_t i = 0; i < args.size(); ++i) {
    if (!detail::writes_argument(op, i, args)) {
      continue;
    }
    detail::for_each_tensor(args[i], [&](const at::Tensor& t) {
      if (detail::overwrites_argument(op, i) && detail::spans_storage(t)) {
        watch_.note(t, Origin::kOverwritten);
      }
      watch_.note_written(t);
    });
  }
}

void OutsideTensorWatch::Noter::after_op(const detail::ObservedOp& call,
                                         c10::ArrayRef<c10::IValue> outputs) {
  const c10::OperatorHandle& op = call.op;
  if (!makes_new_tensors(op)) {
    return;  // a view or an in-place op: its output's counter is its input's
  }
  for (const auto& output : outputs) {
    detail::for_each_tensor(output, [&](const at::Tensor& t) { watch_.note(t, Origin::kMade); });
  }
}

void OutsideTensorWatch::Checker::before_op(const detail::ObservedOp& call,
                                            c10::ArrayRef<c10::IValue> args) {
  const c10::OperatorHandle& op = call.op;
  for_each_read(op, args, [&](size_t arg, const at::Tensor& t) {
    const auto it =
        watch_.seen_.find(version_counter_identity(t.unsafeGetTensorImpl()->version_counter()));
    if (it == watch_.seen_.end() || it->second.origin != Origin::kOutside) {
      return;
    }
    const ReadWatch& read = it->second.first_read;
    SAC_CHECKPOINT_CHECK(!read.changed(),
                         "sac::checkpoint: the recomputation reads a tensor that the "
                         "checkpointed region did not make (argument '",
                         op.schema().arguments()[arg].name(), "' of ", op.operator_name(),
                         ", shape ", t.sizes(),
                         ": a captured tensor, a module's buffer or parameter, a global), and "
                         "it was modified in place after the forward read it (version ",
                         read.version().version(), " when read, ", read.version().current_version(),
                         " now). The recomputation would read the modified value and give "
                         "wrong gradients. Do not modify such a tensor in place inside the "
                         "region after an op used it, nor between forward and backward: modify "
                         "a clone, pass the tensor as an argument of sac::checkpoint (arguments "
                         "are saved and checked like autograd's inputs), or move the "
                         "modification out of the region. If the change cannot affect the "
                         "result, turn this check off with .outside_tensor_check(false).");
  });
}

}  // namespace sac::detail
