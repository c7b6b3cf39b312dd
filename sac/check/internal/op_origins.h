// The naming half of the value check (sac/check/internal/checksum.h):
// While a region's forward runs with the check on, an OriginScope
// notes for every op (RecordFunction callbacks: all ops, under either
// dispatch mechanism) which storage its outputs hold, and which op is
// running; a saved tensor is then described as "made by aten::topk (its
// call 0 in the region), saved for backward by aten::index_select".
#pragma once

#include <sac/check/internal/recorded_op.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/SmallVector.h>

#include <cstddef>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace sac::detail {

// Where a tensor the forward saved came from.
struct SavedOrigin {
  struct CallId {
    const RecordedOp* op = nullptr;
    size_t index = 0;  // of `op`'s calls in the region
  };
  std::optional<CallId> made;         // the last op of the region that wrote its storage
  std::optional<CallId> drawn;        // the last random op that wrote it (bernoulli_, ...)
  const RecordedOp* saver = nullptr;  // the op whose backward saves it, if one was running
  // A state argument of the saver (RecordedOp::state_arguments): its value
  // depends on how often such ops ran, which a recomputation changes.
  bool state = false;

  // "made by aten::topk (its call 0 in the region), saved for backward by
  // aten::index_select"; "made and saved for backward by aten::tanh (its
  // call 2 in the region)"; host data (a storage that aten::empty made and
  // no op wrote: torch::tensor's) named as such; for a tensor no op of the
  // region wrote, "not made in the region (an input, a parameter, ...)".
  std::string describe() const;
};

// What made the tensors a region's forward saves, in the order it saves
// them.
class OpOrigins {
 public:
  // The forward saves `saved` (its next tensor). Autograd saves an op's own
  // output (tanh's, exp's) before the op has returned: such a tensor's maker
  // is known when the op that was running at the save returns.
  void note_saved(const at::Tensor& saved);
  // Of the `index`th tensor saved.
  const SavedOrigin& saved(size_t index) const { return saved_[index]; }

  // From OriginScope's callbacks: `op` began with `inputs`; `op` returned
  // `outputs`.
  void note_running(const RecordedOp* op, c10::ArrayRef<c10::IValue> inputs);
  void note_outputs(const RecordedOp* op, c10::ArrayRef<c10::IValue> outputs);

 private:
  // A tensor saved while an op ran, until the op returns.
  struct Pending {
    size_t index;                     // in saved_
    size_t depth;                     // running_.size() at the save
    const c10::StorageImpl* storage;  // alive: the saving op holds it
  };
  std::unordered_map<const void*, SavedOrigin::CallId> by_storage_;
  std::unordered_map<const void*, SavedOrigin::CallId> drawn_by_storage_;  // random writers
  std::unordered_map<const RecordedOp*, size_t> calls_;
  struct Running {
    const RecordedOp* op;
    c10::SmallVector<const c10::StorageImpl*, 2> state;  // of its state arguments
  };
  std::vector<Running> running_;
  std::vector<SavedOrigin> saved_;
  std::vector<Pending> pending_;
};

// While alive, the ops run on this thread are noted in `origins`.
class OriginScope {
 public:
  explicit OriginScope(OpOrigins& origins);
  ~OriginScope();
  OriginScope(const OriginScope&) = delete;
  OriginScope& operator=(const OriginScope&) = delete;
};

}  // namespace sac::detail
