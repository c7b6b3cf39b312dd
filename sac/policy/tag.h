// Named values: sac::tag, JAX's checkpoint_name for LibTorch.
//
//   at::Tensor h = sac::tag(torch::mm(x, w), "proj");
//
// `sac::tag(t, name)` returns `t` itself: autograd sees no op and no new
// tensor. Below autograd it is a registered operator, `sac::tag(Tensor(a)
// self, str name) -> Tensor(a)`, so the policies of a selective region see
// it with its name and can keep, recompute or offload the value by name
// (sac/policy/names.h). Not in a region, or under a policy that asks about
// no names, it does nothing.
#pragma once

#include <ATen/core/Tensor.h>

#include <string_view>

namespace sac {

// Names `t` `name` for the policy of the selective region it runs in and
// returns `t`. `t` must be defined and `name` not empty.
at::Tensor tag(const at::Tensor& t, std::string_view name);

}  // namespace sac
