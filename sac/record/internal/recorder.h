// Records the ops of a region as they run (see recording.h).
//
// The recorder is an op observer (sac/dispatch/internal/interceptor.h) on the
// region's thread: it sees every op that reaches below autograd, views,
// in-place and out= ops included, which takes the fallback-key mechanism
// (detail::observers_see_every_op). It names each tensor an op reads by the
// value that made it, found by identity (the TensorImpl an earlier op
// returned; autograd returns the same one above), else by memory (an alias of
// a value, made without an op), else it is an outside tensor. Its owner adds
// the tensors autograd saves as marks.
//
// Collectives are recorded as any op, and noted for the ranks' agreement
// before a replay communicates (communication.h).
//
// What it refuses, with a CheckpointError-style c10::Error naming the op:
//   * ops run as part of a compile trace (torch.compile, make_fx, export);
//   * ops with a Storage argument (set_ on a storage): a storage is not a
//     value the recording can follow;
//   * tensors inside other containers than lists (none in aten today).
// Memory written by host code (torch::tensor(std::vector),
// torch::from_blob) is followed by its bytes while only such code writes it
// (recording.h: Fill). What it cannot see: memory written through data_ptr()
// or accessors after an op wrote it, or that a tensor made before the region
// holds, and side effects of custom kernels other than the writes their
// schema declares. Such regions must not be recorded.
#pragma once

#include <sac/dispatch/internal/interceptor.h>
#include <sac/record/internal/recording.h>

#include <c10/util/intrusive_ptr.h>

#include <functional>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace sac::detail {

class Recorder final : public detail::OpObserver {
 public:
  // Makes the SavedVariable that keeps an outside tensor.
  using SaveOutside = std::function<torch::autograd::SavedVariable(const at::Tensor&)>;

  // Records into `recording`. `region_interceptor` is the interceptor active
  // on the thread when the region began (its selective mode, or null): calls
  // it handles are recorded as `intercepted`.
  Recorder(Recording& recording, const detail::OpInterceptor* region_interceptor,
           SaveOutside save_outside);
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Appends a Mark instruction for `t` (defined), the tensor autograd saves now.
  void mark(const at::Tensor& t);

  // The region is over: forgets the tensors it identified.
  void finish();

  void before_op(const detail::ObservedOp& call, c10::ArrayRef<c10::IValue> args) override;
  void after_op(const detail::ObservedOp& call, c10::ArrayRef<c10::IValue> outputs) override;

 private:
  using WeakTensorImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  // A tensor the recorder has named. The weak reference keeps the
  // TensorImpl's address from being reused by another tensor while it is
  // remembered (its memory is freed as usual).
  struct Known {
    WeakTensorImpl impl;
    ValueId value;
  };
  // What the recorder knows of a storage.
  struct StorageState {
    explicit StorageState(c10::weak_intrusive_ptr<c10::StorageImpl> storage)
        : storage(std::move(storage)) {}

    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    std::optional<ValueId> latest;  // the last value made on it
    caffe2::TypeMeta latest_dtype;
    // Host code may write it: memory sac does not own, or
    // fresh memory from an empty-like op that no op has overwritten whole.
    bool host_written = false;
    bool foreign = false;  // not from an allocator (torch::from_blob)
    // With host_written: its bytes as replay holds them at this point
    // (undefined before the first Fill), compared at each read.
    at::Tensor seen;
    // Outside values on it, and the copy replay uses once it is written.
    std::vector<size_t> outside;
    std::optional<size_t> snapshot;
  };

  // The value `t` is now, appending Outside or Alias instructions as needed.
  ValueId resolve(const at::Tensor& t);
  ValueId add_alias(const at::Tensor& t, ValueId base);
  ValueId add_outside(const at::Tensor& t);
  // `t`, read on the memory of Outside entry `outside`, must be unchanged
  // when replay starts.
  void watch_read(const at::Tensor& t, size_t outside);
  // An outside value that lies in the copy of `state`'s storage.
  ValueId add_copied(const at::Tensor& t, StorageState& state);
  Outside layout_of(const at::Tensor& t);
  size_t append_outside(Outside outside);
  StorageState& state_of(const at::Tensor& t);  // made if new
  void remember(const at::Tensor& t, ValueId value);
  StorageState* storage_of(const at::Tensor& t);
  // Before a call writes `t` (`whole`: all of it, without reading it):
  // outside memory gets its copy; fresh memory is no longer host-written.
  void before_write(const at::Tensor& t, bool whole);
  void take_snapshot(const at::Tensor& t, StorageState& state);
  at::Tensor copy_bytes(const c10::Storage& storage);
  // Before a call or autograd reads `t`: bytes written by host
  // code since they were last taken become a Fill instruction.
  void before_read(const at::Tensor& t);
  // An op or autograd reads `t`: its storage can no longer be made fresh.
  void note_read(const at::Tensor& t);
  void fill_if_changed(const at::Tensor& t, StorageState& state);
  Argument record_argument(const c10::OperatorHandle& op, size_t index, const c10::IValue& arg);

  Recording& recording_;
  const detail::OpInterceptor* region_interceptor_;
  SaveOutside save_outside_;
  std::unordered_map<const c10::TensorImpl*, Known> known_;
  std::unordered_map<const c10::StorageImpl*, StorageState> storages_;
  // The storages an op or autograd read (a weak reference in storages_ or
  // known_ keeps the address from being reused).
  std::unordered_set<const c10::StorageImpl*> read_;
  // The call between before_op and after_op (an op that throws never gets
  // its after_op: the next before_op drops it).
  std::optional<Call> pending_;
  // Host-written memory it writes: seen again after it ran.
  std::vector<StorageState*> pending_host_writes_;
};

}  // namespace sac::detail
