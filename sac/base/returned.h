// The tensors a region returns, whatever it returns them in: what
// sac::profile (sac/lab/profile.h) and sac::fit's wrappers
// (sac/nn/checkpoint_wrapper.h) read of a region's outputs.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>
#include <vector>

namespace sac::detail {

inline void collect_returned(const at::Tensor& t, std::vector<at::Tensor>& out) {
  out.push_back(t);
}
inline void collect_returned(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out) {
  out.insert(out.end(), ts.begin(), ts.end());
}
template <class... T>
void collect_returned(const std::tuple<T...>& ts, std::vector<at::Tensor>& out) {
  std::apply([&](const auto&... t) { (collect_returned(t, out), ...); }, ts);
}
template <class T>
void collect_returned(const T&, std::vector<at::Tensor>&) {
  static_assert(sizeof(T) == 0,
                "sac: the region returns a type sac reads no tensors from. Return a tensor, "
                "a std::vector or std::tuple of tensors, or nothing.");
}

}  // namespace sac::detail
