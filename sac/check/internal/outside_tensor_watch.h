// Note [Watching tensors made outside]
//
// Tensors a checkpointed region reads but did not make.
//
// A recomputation runs the region's ops again on whatever its captured
// tensors hold *then*: a buffer, a parameter or a global that was modified in
// place after the forward read it (later in the region, or between forward
// and backward) silently changes the recomputed values, and so the gradients.
// Autograd cannot see this: such tensors are not saved (a buffer that does
// not require grad never is), and the region's function captures them.
//
// The watch observes every op of the region (sac/dispatch/internal/interceptor.h):
// in forward it notes the version of each tensor an op reads that no op of
// the region made; in recomputation it checks that each such tensor, when it
// is read again, still has that version, and throws a CheckpointError
// otherwise. Tensors an op only writes (a BatchNorm's running statistics)
// are not reads; tensors made by the region are new in each pass, and never
// checked.
//
// Under per-op kernels an observer sees the functional ops only: the reads
// of in-place and out= ops (h.add_(buf)) reach it through a RecordFunction
// callback (in_place_reads.h), where the forward and the recomputation
// install it.
#pragma once

#include <sac/check/internal/read_watch.h>
#include <sac/dispatch/internal/interceptor.h>

#include <torch/csrc/autograd/edge.h>

#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace sac::detail {

class OutsideTensorWatch {
 public:
  // Makes sure every op an observer can see is intercepted (per-op kernels).
  OutsideTensorWatch();
  // Forgets the tensors the forward wrote (Note [Rewritten by a
  // recomputation]): nothing can recompute them any more.
  ~OutsideTensorWatch();
  OutsideTensorWatch(const OutsideTensorWatch&) = delete;
  OutsideTensorWatch& operator=(const OutsideTensorWatch&) = delete;

  // Add this on the thread for the region's forward: it notes reads.
  detail::OpObserver* forward_observer() { return &noter_; }
  // Add this on the thread for each recomputation: it checks reads. (A
  // backward inside the region's forward can recompute while the forward
  // still records: two observers, not one with a switch.)
  detail::OpObserver* recompute_observer() { return &checker_; }

  // Whether the forward overwrote whole before any op read it, or made, the
  // tensors of version counter `counter` (Note [Overwritten before read]).
  bool owned_by_region(const void* counter) const;

  // Note [A recomputation keeps their history]: a recomputation writes the
  // tensors from outside that the forward overwrote again, and with grad,
  // autograd gives each a new grad_fn, of the recomputation's graph. The
  // graph backward runs is the forward's (saved tensors keep their
  // forward's grad_fn), so a gradient with respect to such a tensor, or one
  // through its history, would miss it: None where not checkpointing gives
  // one. While alive, this puts back the grad_fn each tensor the forward
  // wrote had before the recomputation, wherever the recomputation changed it.
  class KeptHistories {
   public:
    explicit KeptHistories(const OutsideTensorWatch& watch);
    ~KeptHistories();
    KeptHistories(const KeptHistories&) = delete;
    KeptHistories& operator=(const KeptHistories&) = delete;

   private:
    struct Kept {
      at::Tensor tensor;
      torch::autograd::Edge history;  // its grad_fn and output_nr
    };
    std::vector<Kept> kept_;
  };

 private:
  enum class Origin {
    kOutside,      // read first, from outside
    kMade,         // made by an op of the region
    kOverwritten,  // from outside, overwritten whole before any op read it
  };
  struct Seen {
    ReadWatch first_read;  // keeps the counter, so its identity stays unique
    Origin origin;
  };
  class Noter final : public detail::OpObserver {
   public:
    explicit Noter(OutsideTensorWatch& watch) : watch_(watch) {}
    void before_op(const detail::ObservedOp& call, c10::ArrayRef<c10::IValue> args) override;
    void after_op(const detail::ObservedOp& call, c10::ArrayRef<c10::IValue> outputs) override;

   private:
    OutsideTensorWatch& watch_;
  };
  class Checker final : public detail::OpObserver {
   public:
    explicit Checker(const OutsideTensorWatch& watch) : watch_(watch) {}
    void before_op(const detail::ObservedOp& call, c10::ArrayRef<c10::IValue> args) override;
    void after_op(const detail::ObservedOp&, c10::ArrayRef<c10::IValue>) override {}

   private:
    const OutsideTensorWatch& watch_;
  };

  // Notes `t` the first time its version counter is seen.
  void note(const at::Tensor& t, Origin origin);
  // Notes that the region writes `t`, unless it made it.
  void note_written(const at::Tensor& t);

  std::unordered_map<const void*, Seen> seen_;  // by version counter identity
  // Tensors from outside that the forward wrote (whole or in part): their
  // version counters, and the tensors (a view's base for a view) while alive.
  std::unordered_set<const void*> written_;
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> histories_;
  Noter noter_{*this};
  Checker checker_{*this};
};

}  // namespace sac::detail
