// Per-op cost of sac's interception in instructions (deterministic, unlike
// time on a shared machine). Run under callgrind, collecting only inside
// `measured_loop`:
//   SAC_DISPATCH=per_op valgrind --tool=callgrind --collect-atstart=no \
//     --toggle-collect='*measured_loop*' --callgrind-out-file=/dev/null \
//     build/benchmarks/per_op_instructions VARIANT
// VARIANT: no_sac | idle | listed | unlisted | callback. benchmarks/run.sh
// runs them all and divides by the number of calls.
#include <sac/sac.h>

#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <optional>

constexpr int kCalls = 1000;

extern "C" __attribute__((noinline)) void measured_loop(const at::Tensor& a, const at::Tensor& b) {
  for (int i = 0; i < kCalls; ++i) {
    at::Tensor c = at::mul(a, b);
    asm volatile("" : : "r"(c.unsafeGetTensorImpl()) : "memory");
  }
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s no_sac|idle|listed|unlisted|callback\n", argv[0]);
    return 2;
  }
  const std::string variant = argv[1];
  auto a = torch::ones({1}), b = torch::ones({1});
  std::optional<sac::Policy> policy;
  if (variant == "idle" || variant == "listed") {
    policy = sac::Policy::save_ops({"aten::mul.Tensor"});
  } else if (variant == "unlisted") {
    policy = sac::Policy::save_ops({"aten::mm"});
  } else if (variant == "callback") {
    policy = sac::Policy::from_fn([](const sac::SelectiveCheckpointContext&, const c10::OperatorHandle&,
                                     c10::ArrayRef<c10::IValue>) { return false; });
  } else if (variant != "no_sac") {
    std::fprintf(stderr, "unknown variant %s\n", argv[1]);
    return 2;
  }
  std::optional<sac::SelectiveCheckpointContexts> modes;
  if (policy) {
    modes = sac::create_selective_checkpoint_contexts(*policy);
  }
  std::optional<sac::ContextScope> active;
  if (modes && variant != "idle") {
    active.emplace(modes->caching.get());
  }
  for (int i = 0; i < 10; ++i) {
    at::mul(a, b);  // warm up: first-call initialisation is not measured
  }
  measured_loop(a, b);
  std::printf("%s: %d calls measured (dispatch: %s)\n", variant.c_str(), kCalls,
              std::string(sac::dispatch::to_string(sac::dispatch::mechanism())).c_str());
  return 0;
}
