#include <sac/nn/checkpoint_sequential.h>

#include <sac/checkpoint/checkpoint.h>
#include <sac/checkpoint/scope.h>

#include <c10/util/Exception.h>

namespace sac {
namespace {

// Modules [begin, end) of `sequential`, one after the other.
at::Tensor run_modules(torch::nn::Sequential sequential, int64_t begin, int64_t end, at::Tensor x) {
  for (auto it = sequential->begin() + begin; it != sequential->begin() + end; ++it) {
    x = it->forward(x);
  }
  return x;
}

}  // namespace

at::Tensor checkpoint_sequential(const torch::nn::Sequential& sequential, int64_t segments,
                                 const at::Tensor& input, const CheckpointOptions& options) {
  const auto size = static_cast<int64_t>(sequential->size());
  TORCH_CHECK(segments >= 1 && segments <= size,
              "sac::checkpoint_sequential: segments must be between 1 and the "
              "number of modules in the Sequential (",
              size, "), got ", segments, ".");
  const int64_t segment_size = size / segments;
  at::Tensor x = input;
  int64_t begin = 0;
  for (int64_t segment = 0; segment + 1 < segments; ++segment, begin += segment_size) {
    const int64_t end = begin + segment_size;
    x = checkpoint(
        options,
        [sequential, begin, end](const at::Tensor& in) {
          return run_modules(sequential, begin, end, in);
        },
        x);
  }
  return run_modules(sequential, begin, size, x);
}

at::Tensor checkpoint_sequential(const torch::nn::Sequential& sequential, int64_t segments,
                                 const at::Tensor& input) {
  return checkpoint_sequential(sequential, segments, input, detail::scoped_options());
}

}  // namespace sac
