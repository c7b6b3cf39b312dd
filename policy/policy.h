// A selective checkpointing policy: which op calls to save, which to recompute.
#pragma once

#include <sac/policy/checkpoint_policy.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace sac {

// A policy is asked about every cacheable op call (see
// sac/policy/op_traits.h) in a region run under a caching mode. It is cheap to
// copy: copies share one immutable description (and one callback object: a
// stateful callback keeps its state across copies).
class Policy {
 public:
  using Fn = std::function<CheckpointPolicy(const SelectiveCheckpointContext&,
                                            const c10::OperatorHandle& op,
                                            c10::ArrayRef<c10::IValue> args)>;
  using BoolFn = std::function<bool(const SelectiveCheckpointContext&,
                                    const c10::OperatorHandle& op,
                                    c10::ArrayRef<c10::IValue> args)>;

  // Saves (MustSave) the outputs of the listed ops and recomputes
  // (PreferRecompute) everything else. Names are resolved now, strictly (see
  // sac/policy/op_names.h): an unknown name, an ambiguous one, or one that
  // sac can never cache (a view, an in-place op, a composite op that never
  // reaches below autograd, an op PyTorch ignores) throws a c10::Error that
  // says why and what to write instead. An empty list is an error too: it
  // would be full recomputation in disguise.
  static Policy save_ops(const std::vector<std::string>& op_names);

  // Asks `fn` for each cacheable op call. `args` are the op's boxed
  // arguments; the call has not run yet.
  static Policy from_fn(Fn fn);
  // As above; true means MustSave and false PreferRecompute.
  static Policy from_fn(BoolFn fn);

  // Whether this policy is asked about `op` at all: the listed ops for
  // save_ops, every cacheable op (sac/policy/op_traits.h) for a callback.
  // Both passes of a region consult it, so they record and replay the same
  // calls whatever else sac intercepts.
  bool decides_about(const c10::OperatorHandle& op) const;

  // The decision for one op call. `decides_about(op)` must hold.
  CheckpointPolicy decide(const SelectiveCheckpointContext& ctx,
                          const c10::OperatorHandle& op,
                          c10::ArrayRef<c10::IValue> args) const;

  // Asks the dispatch layer to intercept every op this policy may save: the
  // listed ops for save_ops, every cacheable op for a callback.
  void prepare_interception() const;

  // For save_ops: the resolved operators. Empty for callbacks.
  const std::vector<c10::OperatorHandle>& saved_ops() const;

  // "save_ops(aten::mm, aten::addmm)" or "callback".
  std::string describe() const;

 private:
  struct Impl;
  explicit Policy(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

}  // namespace sac
