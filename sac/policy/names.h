// Policies that keep values by the name sac::tag gave them (sac/policy/tag.h),
// as JAX's do.
//
//   auto q = sac::tag(torch::mm(x, wq), "q");
//   ...
//   CheckpointOptions().policy(sac::save_only_these_names({"q", "k"}));
//
// How a tag's answer acts. The policy is asked about each tag in a region's
// forward like about an op call (op sac::tag, args (tensor, name), op_output
// the tensor), and its answer applies to the call that returned the tensor
// (the op whose output storage the tensor is on, so views and reshapes of
// an output name that output):
//   * save or offload keeps that call, which its own answer recomputes: all
//     of its outputs, as if the policy had answered so for it;
//   * MustRecompute recomputes that call, which its own answer keeps;
//   * any other answer changes nothing. Between save and offload, the
//     call's own answer stands.
// So a name only adds to what the op-level answers keep, unless a Must
// recompute takes it away: any_of({dots_saveable(), save_only_these_names(
// {"x"})}) keeps the products and x, and except(everything_saveable(),
// save_only_these_names({"x"})) keeps everything but x (JAX's
// save_anything_except_these_names).
//
// A tag can keep only what the region's forward still holds as returned:
//   * a tensor no op of the region returned (a region input, a parameter)
//     has no call to keep; the tag changes nothing;
//   * an output modified in place since the op returned (LibTorch's
//     nn::Linear on 3-D input adds its bias in place) cannot be served as
//     the op returned it; it stays recomputed, with a warning;
//   * neither can a call one of whose outputs the forward has freed.
// A name the policy mentions that the region's forward never tags is
// reported (a warning, once per name): a misspelled name would otherwise
// keep nothing, silently.
#pragma once

#include <sac/policy/policy.h>

#include <string>
#include <vector>

namespace sac {

// MustSave for the values tagged with one of `names`; everything else
// recomputed. JAX's `save_only_these_names`.
Policy save_only_these_names(const std::vector<std::string>& names);

// MustSave for the values tagged with one of `save`, MustCpuOffload for
// those tagged with one of `offload` (to the region's copy target, host
// memory by default); everything else recomputed. The two lists must not
// share a name. JAX's `save_and_offload_only_these_names`.
Policy save_and_offload_only_these_names(const std::vector<std::string>& save,
                                         const std::vector<std::string>& offload);

// MustSave for every tagged value but those tagged with one of `names`;
// untagged values recomputed. JAX's `save_any_names_but_these`.
Policy save_any_names_but_these(const std::vector<std::string>& names);

}  // namespace sac
