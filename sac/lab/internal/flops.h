// The floating-point operations of one op call, by the formulas of
// torch.utils.flop_counter, so that sac's counts and PyTorch's agree.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>

namespace sac::detail {

// Whether `op` has a formula: matrix products (mm, addmm, bmm, baddbmm,
// _scaled_mm), convolutions, and fused attention (the scaled-dot-product
// kernels, CPU's among them, which flop_counter leaves out). Other ops count
// 0, as in flop_counter: pointwise work and reductions are not counted.
bool counts_flops(const c10::OperatorHandle& op);

// The FLOPs of a call of `op` with `args`, which returned `outputs`: a
// multiply and an add each count one, as in flop_counter. 0 for an op
// without a formula.
int64_t flops_of(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                 c10::ArrayRef<c10::IValue> outputs);

}  // namespace sac::detail
