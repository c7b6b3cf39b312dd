// torch::nn integration: sac::checkpoint_sequential, sac::CheckpointWrapper,
// sac::apply_activation_checkpointing.
#include "support.h"

#include <sac/nn/apply_activation_checkpointing.h>
#include <sac/nn/checkpoint_sequential.h>
#include <sac/nn/checkpoint_wrapper.h>

#include <sstream>

namespace nn_test {

using sac_test::CountingAllocator;

torch::nn::Sequential six_modules() {
  return torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                               torch::nn::Linear(32, 32), torch::nn::GELU(),
                               torch::nn::Linear(32, 8), torch::nn::ReLU());
}

// A policy that counts the calls it is asked about and answers `save`.
sac::Policy counting_policy(const std::shared_ptr<int>& asked, bool save) {
  return sac::Policy::from_fn([asked, save](const sac::SelectiveCheckpointContext&,
                                            const c10::OperatorHandle&,
                                            c10::ArrayRef<c10::IValue>) {
    ++*asked;
    return save;
  });
}

TEST(CheckpointSequential, GradientsBitIdenticalForEverySegmentCount) {
  sac_test::expect_configured_mechanism();
  torch::manual_seed(0);
  auto model = six_modules();
  auto x = torch::randn({4, 16}, torch::requires_grad());
  const auto params = model->parameters();
  const auto expected = sac_test::run_and_grad([&] { return model->forward(x); }, {x}, params);
  for (int64_t segments = 1; segments <= 6; ++segments) {
    for (const auto& options :
         {sac::CheckpointOptions(),
          sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::addmm"}))}) {
      const auto actual = sac_test::run_and_grad(
          [&] { return sac::checkpoint_sequential(model, segments, x, options); }, {x}, params);
      SCOPED_TRACE("segments " + std::to_string(segments));
      sac_test::expect_bit_identical(expected, actual);
    }
  }
}

// Three segments of two modules: the first two are checkpointed and keep
// only their outputs (the next segment's input); the last keeps what
// autograd saves (its Linear's input, its ReLU's output).
TEST(CheckpointSequential, KeepsTheSegmentBoundariesOnly) {
  sac_test::expect_configured_mechanism();
  CountingAllocator::install();
  torch::manual_seed(0);
  auto model = six_modules();
  auto x = torch::randn({4, 16}, torch::requires_grad());
  sac::checkpoint_sequential(model, 3, x).sum().backward();  // warm-up
  const int64_t base = CountingAllocator::live_bytes();
  {
    auto y = sac::checkpoint_sequential(model, 3, x);
    EXPECT_EQ(CountingAllocator::live_bytes() - base, (4 * 32 + 4 * 32 + 4 * 8) * 4);
    y.sum().backward();
  }
  EXPECT_EQ(CountingAllocator::live_bytes(), base);
  {
    auto y = model->forward(x);
    EXPECT_GT(CountingAllocator::live_bytes() - base, (4 * 32 + 4 * 32 + 4 * 8) * 4)
        << "without checkpointing more stays";
  }
}

TEST(CheckpointSequential, UsesTheScopesOptionsAndChecksSegments) {
  sac_test::expect_configured_mechanism();
  auto model = six_modules();
  auto x = torch::randn({4, 16}, torch::requires_grad());
  auto asked = std::make_shared<int>(0);
  {
    sac::CheckpointScope scope(sac::CheckpointOptions().policy(counting_policy(asked, false)));
    sac::checkpoint_sequential(model, 2, x);
  }
  EXPECT_GT(*asked, 0);
  for (const int64_t segments : {0, 7}) {
    const auto message =
        sac_test::error_of([&] { sac::checkpoint_sequential(model, segments, x); });
    EXPECT_NE(message.find("segments must be between 1 and the number of modules"),
              std::string::npos)
        << message;
  }
}

// ---- sac::CheckpointWrapper ---------------------------------------------------

// A user module with parameters, a buffer and children of its own.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t width) {
    fc = register_module("fc", torch::nn::Linear(width, 2 * width));
    out = register_module("out", torch::nn::Linear(2 * width, width));
    gain = register_parameter("gain", torch::full({width}, 0.5));
    scale = register_buffer("scale", torch::linspace(0.5, 1.5, width));
  }
  at::Tensor forward(const at::Tensor& x) {
    return x + out->forward(torch::gelu(fc->forward(x))) * gain * scale;
  }
  torch::nn::Linear fc{nullptr}, out{nullptr};
  at::Tensor gain, scale;
};
TORCH_MODULE(Block);

TEST(CheckpointWrapper, KeepsTheModulesNamesAndTensors) {
  torch::manual_seed(0);
  Block block(8);
  auto wrapped = sac::checkpoint_wrapper(block);
  EXPECT_EQ(wrapped->named_parameters().keys(), block->named_parameters().keys());
  EXPECT_EQ(wrapped->named_buffers().keys(), block->named_buffers().keys());
  EXPECT_EQ(wrapped->named_parameters().keys(),
            (std::vector<std::string>{"gain", "fc.weight", "fc.bias", "out.weight", "out.bias"}));
  // The same tensors, not copies: an optimizer on either moves both.
  const auto mine = wrapped->parameters();
  const auto theirs = block->parameters();
  ASSERT_EQ(mine.size(), theirs.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_TRUE(mine[i].is_same(theirs[i]));
  }
  torch::optim::SGD sgd(wrapped->parameters(), torch::optim::SGDOptions(0.1));
  const auto before = block->gain.clone();
  wrapped->forward(torch::randn({2, 8})).sum().backward();
  sgd.step();
  EXPECT_FALSE(torch::equal(block->gain, before));
  // Names inside a parent do not change either.
  torch::nn::Sequential plain(Block(8), Block(8));
  torch::nn::Sequential wrapping(sac::checkpoint_wrapper(torch::nn::AnyModule(Block(8))),
                                 sac::checkpoint_wrapper(torch::nn::AnyModule(Block(8))));
  EXPECT_EQ(wrapping->named_parameters().keys(), plain->named_parameters().keys());
}

std::string saved(const std::shared_ptr<torch::nn::Module>& module) {
  std::ostringstream stream;
  torch::serialize::OutputArchive archive;
  module->save(archive);
  archive.save_to(stream);
  return stream.str();
}

void load(const std::shared_ptr<torch::nn::Module>& module, const std::string& bytes) {
  std::istringstream stream(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(stream);
  module->load(archive);
}

void expect_same_state(torch::nn::Module& a, torch::nn::Module& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.keys(), pb.keys());
  for (const auto& item : pa) {
    EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << item.key();
  }
  const auto ba = a.named_buffers(), bb = b.named_buffers();
  ASSERT_EQ(ba.keys(), bb.keys());
  for (const auto& item : ba) {
    EXPECT_TRUE(torch::equal(item.value(), bb[item.key()])) << item.key();
  }
}

// Seed 003's test_load_activation_checkpointed_module, both directions.
TEST(CheckpointWrapper, SavedStateLoadsIntoTheUnwrappedModuleAndBack) {
  torch::manual_seed(0);
  auto wrapped = sac::checkpoint_wrapper(Block(8));
  Block plain(8);
  load(plain.ptr(), saved(wrapped.ptr()));
  expect_same_state(*wrapped, *plain);

  torch::NoGradGuard no_grad;
  for (auto& p : plain->parameters()) {
    p.add_(0.5);
  }
  plain->scale.mul_(3);
  load(wrapped.ptr(), saved(plain.ptr()));
  expect_same_state(*wrapped, *plain);
  // Loading into the wrapper loaded into the wrapped module itself.
  EXPECT_TRUE(torch::equal(wrapped->module()->scale, plain->scale));
}

TEST(CheckpointWrapper, TrainEvalToAndCloneReachTheModule) {
  auto wrapped = sac::checkpoint_wrapper(Block(4));
  wrapped->eval();
  EXPECT_FALSE(wrapped->is_training());
  EXPECT_FALSE(wrapped->module()->is_training());
  EXPECT_FALSE(wrapped->module()->fc->is_training());
  wrapped->train();
  EXPECT_TRUE(wrapped->module()->is_training());
  EXPECT_TRUE(wrapped->module()->out->is_training());
  wrapped->to(torch::kFloat64);
  EXPECT_EQ(wrapped->module()->fc->weight.scalar_type(), torch::kFloat64);
  EXPECT_EQ(wrapped->module()->gain.scalar_type(), torch::kFloat64);
  for (const auto& p : wrapped->parameters()) {
    EXPECT_EQ(p.scalar_type(), torch::kFloat64);
  }
  // Cloning clones the module (Linear is Cloneable; Block is not, and says so).
  auto linear = sac::checkpoint_wrapper(torch::nn::Linear(4, 4));
  auto copy =
      std::dynamic_pointer_cast<sac::CheckpointWrapperImpl<torch::nn::LinearImpl>>(linear->clone());
  ASSERT_NE(copy, nullptr);
  EXPECT_FALSE(copy->module()->weight.is_same(linear->module()->weight));
  expect_same_state(*copy, *linear);
  const auto message = sac_test::error_of([&] { wrapped->clone(); });
  EXPECT_NE(message.find("Subclass torch::nn::Cloneable"), std::string::npos) << message;
  std::ostringstream printed;
  printed << *wrapped;
  EXPECT_NE(printed.str().find("sac::CheckpointWrapper("), std::string::npos) << printed.str();
}

// A forward with a non-tensor argument and a default.
struct ScaledImpl : torch::nn::Module {
  ScaledImpl() { lin = register_module("lin", torch::nn::Linear(6, 6)); }
  at::Tensor forward(const at::Tensor& x, double gain = 2.0) {
    return torch::tanh(lin->forward(x)) * gain;
  }
  torch::nn::Linear lin{nullptr};
};
TORCH_MODULE(Scaled);

TEST(CheckpointWrapper, GradientsBitIdenticalUnderEveryPolicy) {
  sac_test::expect_configured_mechanism();
  torch::manual_seed(0);
  Block block(8);
  Scaled scaled;
  auto x = torch::randn({3, 2, 8}, torch::requires_grad());  // 3-D: mm, then bias in place
  auto z = torch::randn({5, 6}, torch::requires_grad());
  const auto expected = sac_test::run_and_grad(
      [&] {
        return block->forward(x).sum() + scaled->forward(z).sum() + scaled->forward(z, 0.5).sum();
      },
      {x, z}, block->parameters());
  for (const auto& options :
       {sac::CheckpointOptions(),
        sac::CheckpointOptions().policy(sac::Policy::save_ops({"aten::mm", "aten::_unsafe_view"})),
        sac::CheckpointOptions().policy(sac::Policy::from_fn(
            [](const sac::SelectiveCheckpointContext&, const c10::OperatorHandle&,
               c10::ArrayRef<c10::IValue>) { return true; }))}) {
    auto wrapped = sac::checkpoint_wrapper(block, options);
    auto wrapped_scaled = sac::checkpoint_wrapper(scaled, options);
    const auto actual = sac_test::run_and_grad(
        [&] {
          return wrapped->forward(x).sum() + wrapped_scaled->forward(z).sum() +
                 wrapped_scaled->forward(z, 0.5).sum();
        },
        {x, z}, wrapped->parameters());
    sac_test::expect_bit_identical(expected, actual);
  }
}

// Seed 003's test_checkpoint_wrapper_parity: a model of eight Sequentials of
// three Linears, checkpointed by wrapping each or by sac::checkpoint around
// each, holds the same bytes after forward and at its peak.
TEST(CheckpointWrapper, HoldsTheSameBytesAsTheFunctionalForm) {
  sac_test::expect_configured_mechanism();
  CountingAllocator::install();
  torch::manual_seed(0);
  std::vector<torch::nn::Sequential> layers;
  for (int i = 0; i < 8; ++i) {
    layers.emplace_back(torch::nn::Linear(64, 64), torch::nn::Linear(64, 64),
                        torch::nn::Linear(64, 64));
  }
  std::vector<sac::CheckpointWrapper<torch::nn::SequentialImpl>> wrapped;
  for (const auto& layer : layers) {
    wrapped.push_back(sac::checkpoint_wrapper(layer));
  }
  auto x = torch::randn({100, 64}, torch::requires_grad());
  struct Bytes {
    int64_t after_forward, peak;
  };
  auto measure = [&](const std::function<at::Tensor(size_t, const at::Tensor&)>& layer) {
    const int64_t base = CountingAllocator::live_bytes();
    CountingAllocator::reset_peak();
    at::Tensor h = x;
    for (size_t i = 0; i < layers.size(); ++i) {
      h = layer(i, h);
    }
    auto loss = h.sum();
    const int64_t after_forward = CountingAllocator::live_bytes() - base;
    loss.backward();
    return Bytes{after_forward, CountingAllocator::peak_bytes() - base};
  };
  auto functional = [&](size_t i, const at::Tensor& h) {
    return sac::checkpoint([&layers, i](const at::Tensor& in) { return layers[i]->forward(in); },
                           h);
  };
  auto wrapper = [&](size_t i, const at::Tensor& h) { return wrapped[i]->forward(h); };
  auto plain = [&](size_t i, const at::Tensor& h) { return layers[i]->forward(h); };
  measure(wrapper);  // warm-up: gradients allocated
  const Bytes by_wrapper = measure(wrapper);
  const Bytes by_function = measure(functional);
  const Bytes unwrapped = measure(plain);
  EXPECT_EQ(by_wrapper.after_forward, by_function.after_forward);
  EXPECT_EQ(by_wrapper.peak, by_function.peak);
  // Each checkpoint keeps its input (100 x 64 floats): the model's input
  // (not counted) and the seven layer outputs in between; the last output is
  // held by the measurement, the scalar loss too.
  EXPECT_EQ(by_wrapper.after_forward, 8 * 100 * 64 * 4 + 4);
  EXPECT_GT(unwrapped.after_forward, 2 * by_wrapper.after_forward);
}

TEST(CheckpointWrapper, UsesTheScopesOptionsUnlessGivenItsOwn) {
  sac_test::expect_configured_mechanism();
  auto asked = std::make_shared<int>(0);
  auto counting = sac::CheckpointOptions().policy(counting_policy(asked, false));
  auto x = torch::randn({2, 8}, torch::requires_grad());
  auto scoped = sac::checkpoint_wrapper(Block(8));
  auto own = sac::checkpoint_wrapper(Block(8), sac::CheckpointOptions());
  {
    sac::CheckpointScope scope(counting);
    own->forward(x).sum().backward();
    EXPECT_EQ(*asked, 0);
    scoped->forward(x).sum().backward();
    EXPECT_GT(*asked, 0);
  }
  *asked = 0;
  scoped->forward(x).sum().backward();
  EXPECT_EQ(*asked, 0) << "the scope ended";
}

// A module returning two tensors.
struct SplitImpl : torch::nn::Module {
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& x) { return {x.sin(), x.cos()}; }
};
TORCH_MODULE(Split);

TEST(CheckpointWrapper, ATypeErasedWrapperNamesWhatItCannotWrap) {
  auto x = torch::randn({2, 6}, torch::requires_grad());
  auto wrapped = sac::checkpoint_wrapper(torch::nn::AnyModule(torch::nn::Linear(6, 6)));
  EXPECT_TRUE(torch::equal(wrapped->forward(x), wrapped->module().forward(x)));
  auto split = sac::checkpoint_wrapper(torch::nn::AnyModule(Split()));
  const auto returns = sac_test::error_of([&] { split->forward(x); });
  EXPECT_NE(returns.find("returned a std::tuple<at::Tensor, at::Tensor>"), std::string::npos)
      << returns;
  EXPECT_NE(returns.find("Wrap this module as sac::CheckpointWrapper<"), std::string::npos)
      << returns;
  const auto empty = sac_test::error_of([] { sac::checkpoint_wrapper(torch::nn::AnyModule()); });
  EXPECT_NE(empty.find("got no module to wrap"), std::string::npos) << empty;
}

// ---- sac::apply_activation_checkpointing ----------------------------------------

// Blocks in a Sequential member, in Sequentials inside a ModuleList, and a
// typed member the model calls directly.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    trunk =
        register_module("trunk", torch::nn::Sequential(Block(16), torch::nn::ReLU(), Block(16)));
    stages = register_module("stages", torch::nn::ModuleList());
    for (int i = 0; i < 2; ++i) {
      stages->push_back(torch::nn::Sequential(Block(16), Block(16)));
    }
    head = register_module("head", Block(16));
  }
  at::Tensor forward(const at::Tensor& x) {
    auto h = trunk->forward(x);
    for (const auto& stage : *stages) {
      h = stage->as<torch::nn::Sequential>()->forward(h);
    }
    return head->forward(h);
  }
  torch::nn::Sequential trunk{nullptr};
  torch::nn::ModuleList stages{nullptr};
  Block head{nullptr};
};
TORCH_MODULE(Net);

bool is_block_outside_head(const std::string& name, const torch::nn::Module& module) {
  return dynamic_cast<const BlockImpl*>(&module) != nullptr && name != "head";
}

// The same blocks checkpointed by hand with sac::checkpoint.
at::Tensor by_hand(Net& net, const at::Tensor& x) {
  auto run = [](torch::nn::Sequential& sequential, at::Tensor h) {
    for (auto& entry : *sequential) {
      if (entry.ptr()->as<BlockImpl>() != nullptr) {
        h = sac::checkpoint([&entry](const at::Tensor& in) { return entry.forward(in); }, h);
      } else {
        h = entry.forward(h);
      }
    }
    return h;
  };
  auto h = run(net->trunk, x);
  for (const auto& stage : *net->stages) {
    auto sequential =
        torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(stage));
    h = run(sequential, h);
  }
  return net->head->forward(h);
}

TEST(ApplyActivationCheckpointing, WrapsSequentialEntriesAtAnyDepthAndReallyCheckpoints) {
  sac_test::expect_configured_mechanism();
  CountingAllocator::install();
  torch::manual_seed(0);
  Net net;
  auto x = torch::randn({32, 16}, torch::requires_grad());
  const auto names = net->named_parameters().keys();
  const auto expected =
      sac_test::run_and_grad([&] { return net->forward(x); }, {x}, net->parameters());

  auto kept_after_forward = [&](const std::function<at::Tensor()>& forward) {
    forward().sum().backward();  // warm-up
    const int64_t base = CountingAllocator::live_bytes();
    auto y = forward();
    const int64_t kept = CountingAllocator::live_bytes() - base - y.nbytes();
    y.sum().backward();
    return kept;
  };
  const int64_t plain = kept_after_forward([&] { return net->forward(x); });
  const int64_t hand = kept_after_forward([&] { return by_hand(net, x); });

  EXPECT_EQ(sac::apply_activation_checkpointing(net, is_block_outside_head), 6);
  EXPECT_EQ(net->named_parameters().keys(), names);
  EXPECT_NE(net->trunk->ptr(0)->as<sac::CheckpointWrapperImpl<torch::nn::AnyModule>>(), nullptr);
  EXPECT_NE(net->trunk->ptr(1)->as<torch::nn::ReLUImpl>(), nullptr) << "not chosen, not wrapped";
  const int64_t applied = kept_after_forward([&] { return net->forward(x); });
  EXPECT_EQ(applied, hand);
  EXPECT_LT(applied, plain);
  // The checkpointed blocks keep their inputs (32 x 16 floats; the first
  // one's is x, not counted), the ReLU its output (the same tensor as the
  // next block's input), the head what autograd saves in it: its input, fc's
  // output (32 x 32, for gelu), gelu's output (for out's addmm), out's output
  // (for the product with gain).
  EXPECT_EQ(applied, 6 * 32 * 16 * 4 + (32 * 32 + 32 * 32 + 32 * 16) * 4);
  const auto actual =
      sac_test::run_and_grad([&] { return net->forward(x); }, {x}, net->parameters());
  sac_test::expect_bit_identical(expected, actual);
}

// A user module around a Sequential (Sequentials do not nest directly).
struct StackImpl : torch::nn::Module {
  StackImpl() { layers = register_module("layers", torch::nn::Sequential(Block(8), Block(8))); }
  at::Tensor forward(const at::Tensor& x) { return layers->forward(x); }
  torch::nn::Sequential layers{nullptr};
};
TORCH_MODULE(Stack);

TEST(ApplyActivationCheckpointing, NestedChoicesAndTheScope) {
  sac_test::expect_configured_mechanism();
  torch::manual_seed(0);
  torch::nn::Sequential model(Stack(), Block(8));
  auto x = torch::randn({4, 8}, torch::requires_grad());
  const auto expected =
      sac_test::run_and_grad([&] { return model->forward(x); }, {x}, model->parameters());
  // The stack, the two blocks inside it, the last block.
  const auto names = model->named_parameters().keys();
  EXPECT_EQ(sac::apply_activation_checkpointing(
                model,
                [](const std::string& name, const torch::nn::Module&) {
                  return name == "0" || name == "0.layers.0" || name == "0.layers.1" || name == "1";
                }),
            4);
  EXPECT_EQ(model->named_parameters().keys(), names);
  auto asked = std::make_shared<int>(0);
  sac::CheckpointScope scope(sac::CheckpointOptions().policy(counting_policy(asked, true)));
  const auto actual =
      sac_test::run_and_grad([&] { return model->forward(x); }, {x}, model->parameters());
  sac_test::expect_bit_identical(expected, actual);
  EXPECT_GT(*asked, 0) << "the wrappers use the scope's options";
}

TEST(ApplyActivationCheckpointing, ModulesCalledThroughTheirTypeAreAnErrorAndNothingChanges) {
  Net net;
  const auto names = net->named_parameters().keys();
  const auto message = sac_test::error_of(
      [&] { sac::apply_activation_checkpointing(net, sac::modules_of_type<BlockImpl>()); });
  EXPECT_NE(message.find("\n  `head` ("), std::string::npos) << message;
  EXPECT_NE(message.find("BlockImpl), a child of the root module"), std::string::npos) << message;
  EXPECT_NE(message.find("sac::CheckpointWrapper<"), std::string::npos) << message;
  EXPECT_NE(message.find("Nothing was wrapped"), std::string::npos) << message;
  EXPECT_EQ(net->named_parameters().keys(), names);
  EXPECT_NE(net->trunk->ptr(0)->as<BlockImpl>(), nullptr) << "the trunk's blocks stay unwrapped";

  const auto list_message = sac_test::error_of([&] {
    sac::apply_activation_checkpointing(net, [](const std::string& name, const torch::nn::Module&) {
      return name == "stages.1";
    });
  });
  EXPECT_NE(list_message.find("`stages.1` (torch::nn::SequentialImpl), an entry of the "
                              "torch::nn::ModuleList `stages`"),
            std::string::npos)
      << list_message;
}

}  // namespace nn_test
