// Policies made of other policies.
//
// One rule combines answers (any_of, all_of):
//   * any_of takes the answer that leaves the most on the device (save, then
//     offload, then recompute), all_of the one that leaves the least: any_of
//     keeps a call if any policy keeps it, all_of only if all of them do;
//   * between answers that keep alike, a Must answer beats a Prefer one;
//   * a tie goes to the earlier policy.
// A policy asked about an op not in its domain answers PreferRecompute,
// so `any_of({save_ops({"aten::mm"}), dots_saveable()})` asks both about mm
// and keeps it if either does.
//
//   auto policy = sac::except(sac::compute_intensive_ops(),
//                             sac::every_nth("aten::mm", 2));  // torchtitan
#pragma once

#include <sac/policy/policy.h>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace sac {

// Keeps a call if any policy keeps it (see the rule above). Throws on an
// empty list.
Policy any_of(std::vector<Policy> policies);

// Keeps a call only if every policy keeps it. Throws on an empty list.
Policy all_of(std::vector<Policy> policies);

// `policy`'s answer, but recompute wherever `excluded` keeps (save or
// offload): MustRecompute if either answer is a Must one, else
// PreferRecompute. JAX's save_anything_except_these_names is
// except(everything_saveable(), save_only_these_names(...)).
Policy except(Policy policy, Policy excluded);

// MustSave for every n-th call of the op (calls n-1, 2n-1, ... counted
// from 0 in each region's forward) and PreferRecompute for the others.
// With except(), "every second matmul recomputed" (torchtitan). `op_name` is
// resolved as by Policy::save_ops; n must be at least 1.
Policy every_nth(const std::string& op_name, int64_t n);

// `policy`'s answer for calls whose every tensor output has sizes that
// satisfy `keep_if`; PreferRecompute for the others.
Policy for_shapes(Policy policy, std::function<bool(c10::IntArrayRef sizes)> keep_if);

// `policy`'s answer, but offload (of the same strength) instead of save for
// calls whose every tensor output satisfies `offload`.
Policy offload_if(Policy policy, std::function<bool(const at::Tensor&)> offload);
// Offloads the saved calls whose outputs are `min_bytes` or larger in all.
Policy offload_if(Policy policy, int64_t min_bytes);

}  // namespace sac
