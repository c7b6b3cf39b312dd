// sac::checkpoint needs LibTorch's base autograd engine, to install its
// saved-tensor hooks. Where another engine is the default (Python's, when
// torch's Python module is loaded), it refuses instead of breaking it. This
// file is its own process: sac must not have installed its engine yet.
#include "support.h"

#include <torch/csrc/autograd/engine.h>

namespace base_engine_test {

// Stands in for Python's engine.
struct OtherEngine : torch::autograd::Engine {
  static torch::autograd::Engine& get() {
    static OtherEngine* engine = new OtherEngine();
    return *engine;
  }
};

TEST(Engine, RefusesAnotherEngineAndInstallsOverTheBaseOne) {
  torch::manual_seed(0);
  auto w = torch::randn({8, 8}, torch::requires_grad());
  auto x = torch::randn({2, 8});
  auto f = [&](const at::Tensor& in) { return torch::tanh(in.mm(w)); };

  torch::autograd::set_default_engine_stub(&OtherEngine::get);
  auto message = sac_test::error_of<sac::CheckpointError>([&] { sac::checkpoint(f, x); });
  EXPECT_NE(message.find("not LibTorch's base engine"), std::string::npos) << message;
  EXPECT_NE(message.find("sac's Python package"), std::string::npos) << message;

  // With the base engine back, the next checkpoint installs sac's and works.
  torch::autograd::set_default_engine_stub(&torch::autograd::Engine::get_base_engine);
  const auto expected = torch::autograd::grad({f(x).sum()}, {w})[0];
  const auto actual = torch::autograd::grad({sac::checkpoint(f, x).sum()}, {w})[0];
  EXPECT_TRUE(torch::equal(expected, actual));

  // Replacing sac's engine afterwards is caught too.
  torch::autograd::set_default_engine_stub(&OtherEngine::get);
  message = sac_test::error_of<sac::CheckpointError>([&] { sac::checkpoint(f, x); });
  EXPECT_NE(message.find("replaced after sac installed"), std::string::npos) << message;
}

}  // namespace base_engine_test
