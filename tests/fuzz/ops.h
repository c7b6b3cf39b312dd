// sac_fuzz's custom pieces: an op with state of its own (drift), a copy
// target of host copies, and a custom autograd Function.
#pragma once

#include "common.h"

namespace {

// A custom op with state of its own, as a kernel that draws from its own
// generator: the scale of step `key` grows with each call of it in an
// iteration (reset by run()). A forward calls each step once, so the
// forward's values match the reference's; a recomputation's do not, which
// only DeterminismCheck::Values catches (the regions around it turn it on).
std::map<int64_t, int> drift_calls;
at::Tensor drift_kernel(const at::Tensor& x, int64_t key) {
  return at::full_like(x, 1.0 + 0.25 * drift_calls[key]++);
}
TORCH_LIBRARY(sac_fuzz, m) { m.def("drift(Tensor x, int key) -> Tensor"); }
TORCH_LIBRARY_IMPL(sac_fuzz, CPU, m) { m.impl("drift", drift_kernel); }

at::Tensor drift(const at::Tensor& x, int64_t key) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("sac_fuzz::drift", "")
                             .typed<at::Tensor(const at::Tensor&, int64_t)>();
  return op.call(x, key);
}

// Where the fuzzer's offload answers go: copies in memory of their own, as a
// host would hold them (a CPU tensor has nowhere else to go). Dense copies,
// a broadcast (stride 0) dimension copied once, back with the strides they
// left with, as host_memory() makes them. It takes every tensor: as
// host_memory() takes an accelerator's.
class HostCopies final : public sac::CopyTarget {
 public:
  bool accepts(const at::Tensor&) const override { return true; }
  at::Tensor copy_out(const at::Tensor& t) override {
    return sac::CopyTarget::without_broadcast(t)
        .clone(at::MemoryFormat::Contiguous)
        .expand(t.sizes());
  }
  at::Tensor copy_back(const at::Tensor& copy, const sac::CopyTarget::Origin& from) override {
    const at::Tensor source = sac::CopyTarget::without_broadcast(copy);
    at::Tensor back =
        at::empty_strided(source.sizes(), from.strides, source.options().device(from.device));
    return back.copy_(source).expand(copy.sizes());
  }
};

// The custom Function of Op::FunctionGrad: its forward re-enables grad, runs
// nested checkpoints on detached copies of its inputs, and keeps the graph;
// its backward differentiates that graph with autograd::grad. The reference
// runs the same without checkpoints. `variant`'s bits: 1 the outer
// checkpoint checks values, 2 the inner one saves mm and bmm, 4 the graph is
// kept by save_for_backward (packed by an enclosing region's hooks) instead
// of saved_data, 8 the inner function is checkpointed once more inside.
struct FunctionGrad : torch::autograd::Function<FunctionGrad> {
  static at::Tensor inner(const at::Tensor& a, const at::Tensor& b) {
    return at::tanh(a * b).matmul(b.transpose(-2, -1)).matmul(a) / b.size(-1);
  }
  // In one order: the order of the ops is the order autograd accumulates
  // gradients in (C++ leaves the order of `f * b + a.sin()`'s operands open).
  static at::Tensor outer(const at::Tensor& f, const at::Tensor& a, const at::Tensor& b) {
    const at::Tensor scaled = f * b;
    return scaled + a.sin();
  }

  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a,
                            const at::Tensor& b, int64_t variant, bool checkpointed) {
    at::AutoGradMode grad(true);
    const at::Tensor ad = a.detach().requires_grad_();
    const at::Tensor bd = b.detach().requires_grad_();
    at::Tensor y;
    if (!checkpointed) {
      y = outer(inner(ad, bd), ad, bd);
    } else {
      sac::CheckpointOptions around;
      if (variant & 1) around.determinism_check(sac::DeterminismCheck::Values);
      sac::CheckpointOptions inside;
      if (variant & 2) inside.policy(sac::Policy::save_ops({"aten::mm", "aten::bmm"}));
      const bool deeper = (variant & 8) != 0;
      y = sac::checkpoint(
          around,
          [inside, deeper](const at::Tensor& x, const at::Tensor& w) {
            const at::Tensor f = sac::checkpoint(
                inside,
                [deeper](const at::Tensor& u, const at::Tensor& v) {
                  return deeper ? sac::checkpoint(&FunctionGrad::inner, u, v) : inner(u, v);
                },
                x, w);
            return outer(f, x, w);
          },
          ad, bd);
    }
    if (variant & 4) {
      ctx->save_for_backward({y, ad, bd});
    } else {
      ctx->saved_data["y"] = y;
      ctx->saved_data["a"] = ad;
      ctx->saved_data["b"] = bd;
    }
    return y.detach();
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    at::Tensor y, a, b;
    if (ctx->saved_data.find("y") == ctx->saved_data.end()) {
      const auto saved = ctx->get_saved_variables();
      y = saved[0], a = saved[1], b = saved[2];
    } else {
      y = ctx->saved_data["y"].toTensor();
      a = ctx->saved_data["a"].toTensor();
      b = ctx->saved_data["b"].toTensor();
    }
    // retain_graph: a second backward of the loss runs this again.
    const auto g = torch::autograd::grad({y}, {a, b}, {grads[0]}, /*retain_graph=*/true);
    return {g[0], g[1], at::Tensor(), at::Tensor()};
  }
};

}  // namespace
