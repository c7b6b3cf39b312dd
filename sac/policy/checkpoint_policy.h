// The per-op answer of selective activation checkpointing, and what a policy
// is told when it is asked.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <cstddef>
#include <string_view>

namespace sac {

// What to do with the outputs of one op call in a checkpointed region:
//   * save: keep them on their device for the backward pass;
//   * recompute: drop them; the backward's recomputation runs the op again;
//   * offload: keep them in the region's copy target (host memory by
//     default) and bring them back when the recomputation reaches the call.
//     A tensor the target does not take (host_memory() takes accelerator
//     tensors only: a CPU tensor is in host memory already) is saved where
//     it is instead.
// `Must*` and `Prefer*` act alike in one policy's answer. They differ when
// answers that keep alike are combined (sac/policy/combinators.h: the Must
// one wins) and tell compilers whether a choice may be overridden, as in
// PyTorch. The six values are PyTorch 2.13's CheckpointPolicy.
enum class CheckpointPolicy {
  MustSave,
  PreferSave,
  MustRecompute,
  PreferRecompute,
  MustCpuOffload,
  PreferCpuOffload,
};

std::string_view to_string(CheckpointPolicy answer);

// What a policy is told about the call it decides on. As in PyTorch 2.13, a
// policy is asked once per call, in the forward, after the op ran; the
// recomputation reuses the forward's answers by (op, call index) and never
// asks again.
struct SelectiveCheckpointContext {
  // Always false: kept so that code written for older PyTorch compiles.
  // PyTorch 2.13 deprecates it for the same reason.
  bool is_recompute = false;
  // What the op returned (its outputs, as on the dispatcher's stack). Valid
  // during the call only: copy what must outlive it.
  c10::ArrayRef<c10::IValue> op_output;
  // Which call of this op in the region's forward it is: 0 for the first.
  // A policy that treats calls by position (every second matmul) needs no
  // state of its own.
  size_t call = 0;
};

}  // namespace sac
