// Per-op cost of sac's interception in instructions (deterministic, unlike
// time on a shared machine). Run under callgrind, collecting only inside
// `measured_loop`:
//   SAC_DISPATCH=per_op valgrind --tool=callgrind --collect-atstart=no \
//     --toggle-collect='*measured_loop*' --callgrind-out-file=/dev/null \
//     build/benchmarks/per_op_instructions VARIANT
// VARIANT: no_sac | held | null_kernel | idle | unlisted | listed | callback | replay
// (benchmarks/per_op_cost.cpp says what each is). benchmarks/side_by_side.py
// runs them all and divides by the number of calls.
#include <sac/sac.h>

#include "benchmarks/null_kernel.h"

#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

constexpr int kCalls = 1000;

extern "C" __attribute__((noinline)) void measured_loop(const at::Tensor& a, const at::Tensor& b) {
  for (int i = 0; i < kCalls; ++i) {
    at::Tensor c = at::mul(a, b);
    asm volatile("" : : "r"(c.unsafeGetTensorImpl()) : "memory");
  }
}

// The same calls, each output held until the end, as a saving mode keeps
// them: the allocator then finds no freed block to reuse and frees none in
// the loop. The difference to measured_loop is what keeping costs without
// sac; `listed` pays it too.
extern "C" __attribute__((noinline)) void measured_loop_held(const at::Tensor& a,
                                                             const at::Tensor& b,
                                                             std::vector<at::Tensor>& held) {
  for (int i = 0; i < kCalls; ++i) {
    held.push_back(at::mul(a, b));
  }
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s no_sac|held|null_kernel|idle|unlisted|listed|callback|replay\n",
                 argv[0]);
    return 2;
  }
  const std::string variant = argv[1];
  auto a = torch::ones({1}), b = torch::ones({1});
  // The null kernel goes first: asking sac anything chooses its mechanism.
  std::optional<sac_benchmarks::NullKernel> null_kernel;
  if (variant == "null_kernel") null_kernel.emplace(c10::OperatorName{"aten::mul", "Tensor"});
  std::optional<sac::Policy> policy;
  if (variant == "idle" || variant == "listed" || variant == "replay") {
    policy = sac::Policy::save_ops({"aten::mul.Tensor"});
  } else if (variant == "unlisted") {
    policy = sac::Policy::save_ops({"aten::mm"});
  } else if (variant == "callback") {
    policy =
        sac::Policy::from_fn([](const sac::SelectiveCheckpointContext&, const c10::OperatorHandle&,
                                c10::ArrayRef<c10::IValue>) { return false; });
  } else if (variant != "no_sac" && variant != "held" && variant != "null_kernel") {
    std::fprintf(stderr, "unknown variant %s\n", argv[1]);
    return 2;
  }
  std::optional<sac::SelectiveCheckpointContexts> modes;
  if (policy) {
    modes = sac::create_selective_checkpoint_contexts(*policy);
  }
  // Replay: the caching mode saves the warm-up and measured calls, and the
  // cached mode serves them; its first 10 are the warm-up.
  constexpr int kWarmUp = 10;
  if (variant == "replay") {
    sac::RegionContext::Scope caching(modes->caching.get());
    for (int i = 0; i < kWarmUp + kCalls; ++i) at::mul(a, b);
  }
  std::optional<sac::RegionContext::Scope> active;
  if (modes && variant != "idle") {
    active.emplace(variant == "replay" ? static_cast<sac::RegionContext*>(modes->cached.get())
                                       : modes->caching.get());
  }
  for (int i = 0; i < kWarmUp; ++i) {
    at::mul(a, b);  // warm up: first-call initialisation is not measured
  }
  if (variant == "held") {
    std::vector<at::Tensor> held;
    held.reserve(kCalls);
    measured_loop_held(a, b, held);
  } else {
    measured_loop(a, b);
  }
  active.reset();
  std::printf("%s: %d calls measured (dispatch: %s)\n", variant.c_str(), kCalls,
              null_kernel
                  ? "null kernel, sac unused"
                  : std::string(sac::dispatch::to_string(sac::dispatch::mechanism())).c_str());
  return 0;
}
