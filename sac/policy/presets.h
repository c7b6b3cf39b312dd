// Ready-made policies, each where it comes from. Combine them with
// sac/policy/combinators.h; name-based ones are in sac/policy/names.h.
//
// An op that this LibTorch build does not register (the c10d collectives of
// a build without distributed support) is left out of a preset's list.
#pragma once

#include <sac/policy/policy.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sac {

// Recomputes everything: full activation checkpointing. JAX's
// `nothing_saveable`, and PyTorch's policy that always answers
// PREFER_RECOMPUTE.
Policy nothing_saveable();

// PreferSave for every cacheable op. JAX's `everything_saveable`. Not the
// same as no checkpointing: it keeps outputs autograd would not have saved.
Policy everything_saveable();

// MustSave for the compute-intensive ops: mm, bmm, addmm, baddbmm, _scaled_mm,
// the convolutions, and every scaled-dot-product-attention kernel (flash,
// efficient, cuDNN, the CPU flash kernel, the overrideable one). The op list
// of PyTorch's SAC examples and of torchtitan.
Policy compute_intensive_ops();

// torchtitan's op-level default: MustSave for the compute-intensive ops, max,
// topk and the collectives reduce_scatter_tensor and all_to_all_single,
// except every second aten::mm, which is recomputed.
Policy torchtitan_default();

// PreferSave for every matrix product, batched or not: mm, bmm, addmm,
// baddbmm, addbmm, mv, addmv, dot, vdot, _scaled_mm. JAX's `dots_saveable`.
Policy dots_saveable();

// PreferSave for the matrix products without batch dimensions: mm, addmm,
// mv, addmv, dot, vdot (a torch::nn::Linear runs mm or addmm whatever its
// input's rank). JAX's `dots_with_no_batch_dims_saveable`.
Policy dots_with_no_batch_dims_saveable();

// The same products offloaded (PreferCpuOffload) instead of saved. JAX's
// `offload_dot_with_no_batch_dims`.
Policy offload_dot_with_no_batch_dims();

// PreferSave for calls whose tensor outputs hold more than `bytes` in all;
// PreferRecompute for the rest. A selector for combinators:
// except(everything_saveable(), outputs_larger_than(n)) keeps what is cheap
// to keep.
Policy outputs_larger_than(int64_t bytes);

// MustSave for the functional collectives (_c10d_functional: all_reduce,
// all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single,
// broadcast and their coalesced forms). Recomputing one would run the
// collective again in backward: extra traffic, and a hang when the ranks'
// backward passes do not line up. Combine: any_of({p, never_recompute_collectives()}).
Policy never_recompute_collectives();

// MustSave for the ops whose outputs decide shapes and control flow, so that
// a recomputation can never route, count or branch differently from its
// forward (a router's top-k flipped by one ulp, a nonzero count that
// changes): the ops of shape_deciding_op_names(), and copies from an
// accelerator to the host (aten::_to_copy to the CPU). A selector to
// combine, whatever the other policy says:
//   any_of({policy, shape_deciding_ops()})
// Not inside the other presets: each of them is the policy of its source
// (JAX, PyTorch, torchtitan) call for call, which sac's tests compare byte
// for byte. The saved outputs are small (indices, counts, scalars).
Policy shape_deciding_ops();

// "aten::topk", "aten::sort", ..., "aten::nonzero", ..., "aten::_local_scalar_dense"
// (item()), ... : indices and orders, output sizes read from values, values
// read on the host. (aten::argsort and aten::is_nonzero decompose into sort
// and _local_scalar_dense.)
const std::vector<std::string>& shape_deciding_op_names();

}  // namespace sac
