// sac::checkpoint_sequential: PyTorch's
// torch.utils.checkpoint.checkpoint_sequential for torch::nn::Sequential.
//
//   torch::nn::Sequential model(...);
//   auto y = sac::checkpoint_sequential(model, /*segments=*/4, x);
#pragma once

#include <sac/checkpoint/options.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>

namespace sac {

// Runs `sequential` on `input` in `segments` parts of size()/segments modules
// each, the last part taking the rest. Every part but the last runs under
// sac::checkpoint with `options` (run again in backward); the last runs as
// usual, since backward needs its tensors first. Throws unless
// 1 <= segments <= sequential->size().
at::Tensor checkpoint_sequential(const torch::nn::Sequential& sequential, int64_t segments,
                                 const at::Tensor& input, const CheckpointOptions& options);

// With the options of the innermost CheckpointScope on this thread, or the
// defaults (full recomputation).
at::Tensor checkpoint_sequential(const torch::nn::Sequential& sequential, int64_t segments,
                                 const at::Tensor& input);

}  // namespace sac
