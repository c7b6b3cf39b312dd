// A generator's state, copied and set under the generator's own mutex, as
// ATen's kernels draw from it: what a checkpoint snapshots before its
// forward, a cache keeps per kept call, and a recording keeps per call.
#pragma once

#include <ATen/core/Generator.h>

#include <mutex>

namespace sac::detail {

// A generator with `generator`'s state now, drawing independently of it.
inline at::Generator locked_clone(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.clone();
}

// Its state as a tensor (allocates).
inline at::Tensor locked_state(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

// Sets a state taken by locked_state (allocates nothing, so a destructor
// may).
inline void locked_set_state(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

}  // namespace sac::detail
