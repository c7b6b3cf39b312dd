// A Python function as a sac policy: PyTorch's policy_fn(ctx, op, *args,
// **kwargs), asked once per call in the forward after the op ran (as in
// PyTorch 2.13), with a torch.utils.checkpoint.SelectiveCheckpointContext,
// the op as its torch.ops overload and the call's arguments as Python
// objects. Each call takes the GIL and a trip into the interpreter; lists,
// presets and combinators stay in C++.
#pragma once

#include <sac/policy/policy.h>

#include <pybind11/pybind11.h>

namespace sac::python {

// The policy asking `fn`. Its answer is a torch.utils.checkpoint.
// CheckpointPolicy or a bool (true saves); anything else is an error that
// names the op. An exception raised by `fn` reaches the caller of the op.
Policy policy_from_python(pybind11::function fn);

// `policy`'s answer for one call as PyTorch's modes ask it (under
// torch.compile, where Inductor plans from PyTorch's own modes): the op as
// its torch.ops overload, the call's arguments and output as Python objects,
// and which call of the op it is. An op sac does not know, or one outside
// the policy's domain, is PREFER_RECOMPUTE.
pybind11::object answer_for_pytorch(const Policy& policy, pybind11::handle op, pybind11::tuple args,
                                    pybind11::dict kwargs, pybind11::handle output, size_t call);

// PyTorch's CheckpointPolicy value for sac's answer, and back.
pybind11::object to_python(CheckpointPolicy answer);
CheckpointPolicy checkpoint_policy_from_python(pybind11::handle answer,
                                               const c10::OperatorHandle* op = nullptr);

}  // namespace sac::python
