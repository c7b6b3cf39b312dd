// The aten op calls a region made below autograd, kept as a program that can
// run again.
//
// A recording is a list of steps. Steps make tensor *values*, numbered in the
// order they are made, or hand one back to the recording's owner:
//
//   Call      an op call: the op, the dispatch keys it ran with, and its
//             arguments, where each tensor is a value; it makes one value per
//             tensor it returns.
//   Outside   a tensor the region read but no step made: a parameter, a
//             buffer, a tensor made before the region. The recording keeps it
//             as autograd keeps a saved input (a SavedVariable, so modifying
//             it before it is replayed is autograd's error), or as a copy of
//             its memory (its whole storage, so that views keep their
//             offsets), taken
//               * before the region first writes it (a BatchNorm's running
//                 statistics): replay writes into a copy of the copy, never
//                 into the live tensor;
//               * when it is first seen, if the tensor does not own its memory
//                 (torch::from_blob), which may be gone by backward;
//               * when an op first reads memory that an empty-like op returned
//                 and code outside the dispatcher filled, as
//                 torch::tensor(std::vector) does. (If ops then also write
//                 that memory through the empty-like op's own tensor, replay
//                 writes a different copy than the reads see: not supported.)
//   Alias     a tensor on an earlier value's memory that appeared without an
//             op (the autograd-level result of .data(), a non-differentiable
//             view): as_strided of that value.
//   Mark      a value the owner asked for at this point of the region (a
//             tensor autograd saved).
//
// Nothing in a recording keeps a tensor the region made alive, except the
// copies: calls name their tensors by value, and replay (replay.h) computes
// the values again.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/DispatchKeySet.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sac::record {

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
  // Kept as autograd keeps an input it saves (empty with a copy).
  torch::autograd::SavedVariable saved;
  // With a copy: the index of the copied storage (in `snapshots`), and where
  // the tensor lies in it.
  std::optional<size_t> snapshot;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;
  c10::TensorOptions options;
};

struct Alias {
  ValueId value = 0;
  ValueId base = 0;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;
};

struct Step {
  enum class Kind : uint8_t { Call, Outside, Alias, Mark };
  Kind kind;
  // Index into the recording's vector of that kind; for Mark, the value
  // handed back.
  uint32_t index;
};

struct Recording {
  std::vector<Step> steps;
  std::vector<Call> calls;
  std::vector<Outside> outside;
  // The copied storages (see Outside), as byte tensors.
  std::vector<at::Tensor> snapshots;
  std::vector<Alias> aliases;
  ValueId values = 0;  // values made so far

  ValueId new_value() { return values++; }

  // The steps, one per line (for debugging).
  std::string str() const;

  // Drops every step, and what it keeps.
  void clear() { *this = Recording(); }
};

}  // namespace sac::record
