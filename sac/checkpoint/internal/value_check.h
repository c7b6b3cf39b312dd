// The value check of DeterminismCheck::Values: a checksum of each tensor
// autograd saves in a region's forward, compared with the recomputation's
// as it saves the same tensor, so that the first one that differs is named
// before a wrong value reaches a gradient (or a shape error deep in
// backward).
//
// A checksum is bit for bit: equal bits give equal checksums, and a changed
// bit (one ulp, a flipped index) changes it but for a collision (64 bits).
// It is taken on the tensor's device: on the CPU by reading its memory
// (no op is dispatched), elsewhere by a few tensor ops that no sac mode,
// observer, log or profiler sees (the result stays on the device; comparing
// two synchronizes).
//
// Naming: while a region's forward runs with the check on, an OriginScope
// notes for every op (RecordFunction callbacks: all ops, under either
// dispatch mechanism) which storage its outputs hold, and which op is
// running; a saved tensor is then described as "made by aten::topk (its
// call 0 in the region), saved for backward by aten::index_select".
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/operator_name.h>

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace sac::detail {

class ValueChecksum {
 public:
  // Of `t`'s values (strided tensors; others give an empty checksum, equal
  // to any: the shape check still applies).
  static ValueChecksum of(const at::Tensor& t);
  bool matches(const ValueChecksum& other) const;
  std::string str() const;

 private:
  bool empty_ = true;
  uint64_t host_ = 0;
  at::Tensor device_;  // two int64 sums, on the tensor's device
};

// The accelerators' path, for CPU tensors too while set (a test seam: CI
// has no accelerator).
void checksum_with_tensor_ops_for_testing(bool on);

// Where a tensor the forward saved came from.
struct SavedOrigin {
  struct Call {
    std::string op;
    size_t call = 0;  // of `op` in the region
  };
  std::optional<Call> made;  // the last op of the region that wrote its storage
  std::string saver;         // the op whose backward saves it, if one was running

  // "made by aten::topk (its call 0 in the region), saved for backward by
  // aten::index_select", or, for a tensor no op of the region wrote, "not
  // made in the region (an input, a parameter, a buffer or a constant)".
  std::string describe() const;
};

// What made the tensors a region's forward saves.
class OpOrigins {
 public:
  SavedOrigin of(const at::Tensor& saved) const;

  // From OriginScope's callbacks: `op` began; `op` returned `outputs`.
  void note_running(const char* op);
  void note_outputs(const char* op, const std::optional<c10::OperatorName>& name,
                    const std::vector<c10::IValue>& outputs);

 private:
  struct Op {
    size_t calls = 0;
    bool view = false;  // a view makes no values
  };
  std::unordered_map<const void*, SavedOrigin::Call> by_storage_;
  std::unordered_map<std::string, Op> ops_;
  std::vector<std::string> running_;
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
