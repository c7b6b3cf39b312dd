// A tensor's alias without its autograd graph, made without an op.
//
// The cache keeps the outputs it saves this way, and offload keeps the
// tensors it leaves in place: the alias shares the storage and the version
// counter (in-place changes through either are seen by the other's version
// watch), holds no grad_fn (no reference cycle through a saved output's
// graph), and no interceptor or observer sees it being made.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

namespace sac::detail {

inline at::Tensor detached_alias(const at::Tensor& t) {
  if (!t.defined()) {
    return t;
  }
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return at::Tensor(impl->shallow_copy_and_detach(
      /*version_counter=*/impl->version_counter(),
      /*allow_tensor_metadata_change=*/true));
}

}  // namespace sac::detail
