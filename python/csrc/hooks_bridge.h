// sac's saved-tensor hooks in a Python process. sac::CheckpointRegion (and
// every guard of sac that replaces what autograd saves) asks the autograd
// engine to consult sac's hooks; LibTorch's base engine consults nobody, so
// in C++ sac installs its own engine. Python's engine consults torch's stack
// of saved_tensors_hooks instead, so here each of sac's guards pushes a pack
// and an unpack hook onto that stack, which hand the tensor to sac's C++
// hooks: a trip into the interpreter per saved tensor, as PyTorch's own
// checkpoint makes.
#pragma once

#include <pybind11/pybind11.h>

namespace sac::python {

// Registers the holder type of packed tensors in `m` and sets the bridge
// (sac/base/internal/saved_tensor_hooks.h) for the process.
void install_hooks_bridge(pybind11::module_& m);

}  // namespace sac::python
