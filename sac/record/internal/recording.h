// The aten op calls a region made below autograd, kept as a program that can
// run again.
//
// A recording is a list of instructions. Instructions make tensor *values*, numbered in the
// order they are made, or hand one back to the recording's owner:
//
//   Call      an op call: the op, the dispatch keys it ran with, and its
//             arguments, where each tensor is a value; it makes one value per
//             tensor it returns.
//   Outside   memory the region read but no instruction made: a parameter, a
//             buffer, a tensor made before the region. It is kept as
//             autograd keeps a saved input (a SavedVariable): then the whole
//             storage is one value (the tensor itself when it spans it, else
//             a one-dimensional tensor over it), and the tensors the region
//             read on it are Alias instructions of that value, so that whoever keeps
//             it (autograd, an OffloadGuard's copy target) keeps one tensor,
//             and views of it stay views of one copy. Or it is kept as a copy
//             of the storage, which all its tensors share in replay, taken
//               * before the region first writes it (a BatchNorm's running
//                 statistics): replay writes into a copy of the copy, never
//                 into the live tensor;
//               * when it is first seen, if the tensor does not own its memory
//                 (torch::from_blob), which may be gone by backward.
//             Or it is fresh memory of its layout, when the region
//             overwrites all of the storage before anything reads it (FSDP
//             copies gathered parameters into theirs): nothing of it is kept.
//             Each tensor read on outside memory is watched: replay refuses
//             to start if one was modified in place since (OutsideRead).
//   Fill      bytes that host code wrote into memory the
//             recording follows (torch::tensor(std::vector) fills what
//             at::empty returned; a from_blob tensor's owner writes): taken
//             when an op, or autograd, next reads that memory, and written
//             into it again at that point of the replay. Memory is compared
//             with its last fill at each such read, while only host code
//             writes it: fresh memory from an empty-like op
//             until an op writes it, memory sac does not own always.
//   Alias     a tensor on an earlier value's memory that appeared without an
//             op (the autograd-level result of .data(), a non-differentiable
//             view, a tensor on outside memory): as_strided of that value.
//   Mark      a value the owner asked for at this point of the region (a
//             tensor autograd saved).
//
// Nothing in a recording keeps a tensor the region made alive, except the
// copies: calls name their tensors by value, and replay (replay.h) computes
// the values again.
#pragma once

#include <sac/base/internal/version_watch.h>
#include <sac/record/internal/communication.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/DispatchKeySet.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sac::detail {

using ValueId = uint32_t;

// One argument of a recorded call.
struct Argument {
  enum class Kind : uint8_t {
    Constant,   // `constant` as it is
    Tensor,     // the value tensors[0]
    List,       // `constant` (a list) with element i replaced by tensors[i]
    Generator,  // a copy of `constant` (the generator's state before the call)
  };
  Kind kind = Kind::Constant;
  c10::IValue constant;
  std::vector<std::optional<ValueId>> tensors;
};

struct Call {
  explicit Call(c10::OperatorHandle op) : op(std::move(op)) {}

  c10::OperatorHandle op;
  // What it ran with below sac's interception point.
  c10::DispatchKeySet below;
  // The interceptor of the region handled it (the region's own selective
  // mode, not a nested region's): replay sends it through the interceptor
  // active then, whose call indices then match the forward's.
  bool intercepted = false;
  // False for calls that return no tensor and write none (item(), equal()):
  // nothing that replays needs them, and they may synchronize a device.
  bool replayed = true;
  std::vector<Argument> arguments;
  ValueId first_output = 0;
  uint32_t outputs = 0;  // defined tensors among its returns
};

struct Outside {
  ValueId value = 0;
  // Kept as autograd keeps an input it saves (empty with a copy, or fresh).
  torch::autograd::SavedVariable saved;
  // Replay makes new memory of this layout (the region overwrites it whole).
  bool fresh = false;
  // With a copy: the index of the copied storage (in `snapshots`). Where the
  // value lies in its storage (saved: all of it):
  std::optional<size_t> snapshot;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;
  c10::TensorOptions options;
};

// A tensor on outside memory, as the region first read it: replay needs it
// unchanged (unless its storage was copied).
struct OutsideRead {
  VersionWatch version;
  std::vector<int64_t> sizes;
  size_t outside = 0;  // the Outside entry of its storage
};

struct Fill {
  ValueId value = 0;    // a value on the memory
  size_t snapshot = 0;  // its bytes (index into `snapshots`)
};

struct Alias {
  ValueId value = 0;
  ValueId base = 0;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;
};

struct Instruction {
  enum class Kind : uint8_t { Call, Outside, Fill, Alias, Mark };
  Kind kind;
  // Index into the recording's vector of that kind; for Mark, the value
  // handed back.
  uint32_t index;
};

struct Recording {
  std::vector<Instruction> instructions;
  std::vector<Call> calls;
  std::vector<Outside> outside;
  std::vector<OutsideRead> outside_reads;
  // The copied storages (see Outside and Fill), as byte tensors.
  std::vector<at::Tensor> snapshots;
  std::vector<Fill> fills;
  std::vector<Alias> aliases;
  ValueId values = 0;  // values made so far
  // The collectives among the calls, for the ranks' agreement before a
  // replay communicates.
  Communication communication;

  ValueId new_value() { return values++; }

  // The instructions, one per line (for debugging).
  std::string str() const;

  // Drops every instruction, and what it keeps.
  void clear() { *this = Recording(); }
};

// A byte tensor over all of `storage`: what a snapshot copies.
at::Tensor bytes_of(const c10::Storage& storage);

}  // namespace sac::detail
