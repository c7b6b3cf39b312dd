// The GPT of examples/gpt_train and examples/policy_lab: plain torch::nn
// code that knows nothing of checkpointing.
#pragma once

#include "examples/support.h"

#include <torch/torch.h>

#include <sac/policy/policy.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sac_examples {

struct Config {
  int64_t layers, embed, heads, seq, batch, vocab, steps;
  double dropout = 0.1;
};

// A GPT-2 style decoder. It is plain torch::nn code: checkpointing is applied
// to it from outside. The blocks live in a Sequential because that is where
// sac::apply_activation_checkpointing can replace them (C++ forwards are not
// virtual; a Sequential calls its entries type-erased).
struct GptImpl : torch::nn::Module {
  explicit GptImpl(const Config& c) {
    tokens = register_module("tokens", torch::nn::Embedding(c.vocab, c.embed));
    positions = register_module("positions", torch::nn::Embedding(c.seq, c.embed));
    for (int64_t i = 0; i < c.layers; ++i) {
      blocks->push_back(GptBlock(c.embed, c.heads, c.dropout));
    }
    register_module("blocks", blocks);
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embed})));
    head = register_module(
        "head", torch::nn::Linear(torch::nn::LinearOptions(c.embed, c.vocab).bias(false)));
  }

  // [B, T] token ids -> [B, T, vocab] logits.
  at::Tensor forward(const at::Tensor& ids) { return logits(blocks->forward(embed(ids))); }

  // Mean cross-entropy of predicting `targets` from `inputs`.
  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) {
    return loss_of(forward(inputs), targets);
  }

  // The pieces of forward(), for running the blocks one by one: token ids
  // -> the first block's input; the last block's output -> logits.
  at::Tensor embed(const at::Tensor& ids) {
    const auto where = torch::arange(ids.size(1), ids.options());
    return tokens->forward(ids) + positions->forward(where);
  }
  at::Tensor logits(const at::Tensor& h) { return head->forward(ln_f->forward(h)); }
  static at::Tensor loss_of(const at::Tensor& logits, const at::Tensor& targets) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                                targets.reshape({-1}));
  }

  torch::nn::Embedding tokens{nullptr}, positions{nullptr};
  torch::nn::Sequential blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Gpt);

struct Batch {
  at::Tensor inputs, targets;
};

// One fixed batch of random tokens: the model learns to predict the next one.
inline Batch synthetic_batch(const Config& c, const torch::Device& device) {
  torch::manual_seed(1);
  const auto ids = torch::randint(c.vocab, {c.batch, c.seq + 1}).to(device);
  using torch::indexing::Slice;
  return {ids.index({Slice(), Slice(0, -1)}),
          ids.index({Slice(), Slice(1, torch::indexing::None)})};
}

// GptBlock's linears run as aten::addmm, and its attention as one of these,
// depending on the device and dtype. save_ops resolves names against the
// dispatcher, where every aten op is registered whatever the build, so one
// list serves CPU and CUDA; the names that never run cost nothing.
inline const std::vector<std::string> kAttentionOps = {
    "aten::_scaled_dot_product_flash_attention_for_cpu",  // CPU
    "aten::_scaled_dot_product_efficient_attention",      // CUDA, float32
    "aten::_scaled_dot_product_flash_attention",          // CUDA, half types
    "aten::_scaled_dot_product_cudnn_attention",          // CUDA, cuDNN
};

inline sac::Policy save_matmuls_and_attention() {
  std::vector<std::string> ops = {"aten::addmm"};
  ops.insert(ops.end(), kAttentionOps.begin(), kAttentionOps.end());
  return sac::Policy::save_ops(ops);
}

}  // namespace sac_examples
