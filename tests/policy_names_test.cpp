// Named values: sac::tag and the name policies. Bytes are counted exactly on
// the counting allocator; gradients are compared bit for bit with the
// un-checkpointed run.
#include "support.h"

#include "examples/host_arena.h"

#include <sac/cache/internal/op_cache.h>
#include <sac/nn/checkpoint_wrapper.h>
#include <sac/policy/internal/tag.h>
#include <sac/cache/internal/selective_modes.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace policy_names_test {

using sac_examples::HostArena;
using sac_test::CountingAllocator;
using sac_test::error_of;
using sac_test::expect_bit_identical;
using sac_test::run_and_grad;

constexpr int64_t kFloat = 4;
constexpr int64_t kH1 = 16 * 64 * kFloat;  // in.mm(w1), tagged "h1"
constexpr int64_t kR = 16 * 64 * kFloat;   // its relu, tagged "r"
constexpr int64_t kH2 = 16 * 32 * kFloat;  // r.mm(w2), tagged "h2"

struct Chain {
  Chain() {
    torch::manual_seed(0);
    x = torch::randn({16, 32}, torch::requires_grad());
    w1 = (torch::randn({32, 64}) * 0.2).requires_grad_();
    w2 = (torch::randn({64, 32}) * 0.2).requires_grad_();
  }
  at::Tensor forward(const at::Tensor& in) const {
    const at::Tensor h1 = sac::tag(in.mm(w1), "h1");
    const at::Tensor r = sac::tag(h1.relu(), "r");
    return sac::tag(r.mm(w2), "h2").tanh();
  }
  std::vector<at::Tensor> plain() const {
    return run_and_grad([&] { return forward(x); }, {x}, {w1, w2}, 0);
  }
  at::Tensor x, w1, w2;
};

// Bytes the region keeps on the device after its forward (beyond its
// output), the calls its cache kept, and [output, gradients].
struct Outcome {
  int64_t kept = 0;
  size_t kept_calls = 0;
  std::vector<at::Tensor> grads;
};

Outcome run(const std::function<at::Tensor(const at::Tensor&)>& fn,
            const std::vector<at::Tensor>& wrt, const at::Tensor& x, const sac::Policy& policy,
            std::shared_ptr<sac::CopyTarget> offload_to = nullptr) {
  Outcome out;
  std::shared_ptr<sac::detail::OpCache> cache;
  const auto options = sac::CheckpointOptions().context_fn([&]() -> sac::RegionContexts {
    auto contexts = sac::create_selective_checkpoint_contexts(policy, false, offload_to);
    cache = sac::detail::cache_of(contexts);
    return contexts;
  });
  torch::manual_seed(0);
  const int64_t base = CountingAllocator::live_bytes();
  at::Tensor y = sac::checkpoint(options, fn, x);
  out.kept = CountingAllocator::live_bytes() - base - static_cast<int64_t>(y.nbytes());
  out.kept_calls = cache->kept_calls();
  out.grads = torch::autograd::grad({y.sum()}, wrt);
  out.grads.insert(out.grads.begin(), y.detach());
  return out;
}

Outcome run(const Chain& c, const sac::Policy& policy,
            std::shared_ptr<sac::CopyTarget> offload_to = nullptr) {
  return run([&](const at::Tensor& in) { return c.forward(in); }, {c.x, c.w1, c.w2}, c.x, policy,
             std::move(offload_to));
}

// Collects the warnings issued while it lives.
class Warnings : public c10::WarningHandler {
 public:
  Warnings() : guard_(this) {}
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  // The warnings that contain `text`.
  size_t count(const std::string& text) const {
    size_t n = 0;
    for (const auto& message : messages) {
      n += message.find(text) != std::string::npos ? 1 : 0;
    }
    return n;
  }
  std::vector<std::string> messages;

 private:
  c10::WarningUtils::WarningHandlerGuard guard_;
};

class Names : public ::testing::Test {
 protected:
  void SetUp() override {
    sac_test::expect_configured_mechanism();
    CountingAllocator::install();
    at::set_num_threads(1);
  }
};

// ---- sac::tag -----------------------------------------------------------------

// The identity for autograd: the same tensor comes back, with its grad_fn,
// in and out of regions, with and without grad mode.
TEST_F(Names, TagReturnsItsTensorItself) {
  const at::Tensor x = torch::randn({3, 4}, torch::requires_grad());
  const at::Tensor y = x * 2;
  const at::Tensor tagged = sac::tag(y, "y");
  EXPECT_TRUE(tagged.is_same(y));
  EXPECT_EQ(tagged.grad_fn(), y.grad_fn());
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(sac::tag(y, "y").is_same(y));
  }
  {
    c10::InferenceMode inference;
    const at::Tensor z = torch::ones({2});
    EXPECT_TRUE(sac::tag(z, "z").is_same(z));
  }
  const at::Tensor in_region = sac::checkpoint(
      sac::CheckpointOptions().policy(sac::save_only_these_names({"y"})),
      [](const at::Tensor& in) {
        const at::Tensor h = in.sin();
        EXPECT_TRUE(sac::tag(h, "y").is_same(h));
        return h;
      },
      x);
  const auto grads = torch::autograd::grad({in_region.sum()}, {x});
  EXPECT_TRUE(torch::equal(grads[0], x.detach().cos()));
}

TEST_F(Names, TagChecksItsArguments) {
  EXPECT_NE(error_of([] { sac::tag(at::Tensor(), "h"); }).find("undefined tensor"),
            std::string::npos);
  EXPECT_NE(error_of([] { sac::tag(torch::ones({1}), ""); }).find("empty name"), std::string::npos);
}

TEST_F(Names, NamePoliciesCheckTheirLists) {
  EXPECT_NE(error_of([] { sac::save_only_these_names({}); }).find("no names"), std::string::npos);
  EXPECT_NE(error_of([] {
              sac::save_and_offload_only_these_names({"a", "b"}, {"b"});
            }).find("'b' is listed both to save and to offload"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              sac::save_only_these_names({"a", ""});
            }).find("empty name"),
            std::string::npos);
  EXPECT_EQ(sac::save_and_offload_only_these_names({"a"}, {"b", "c"}).describe(),
            "save_and_offload_only_these_names(save=[a], offload=[b, c])");
}

// ---- The name policies ----------------------------------------------------------

// The tagged value's call is kept (its outputs served, not recomputed) and
// nothing else; gradients are those of the plain run.
TEST_F(Names, SaveOnlyTheseNamesKeepsTheCallsThatReturnedTheNamedValues) {
  const Chain c;
  const auto expected = c.plain();
  const Outcome none = run(c, sac::nothing_saveable());
  for (const auto& [names, bytes] : std::vector<std::pair<std::vector<std::string>, int64_t>>{
           {{"h1"}, kH1}, {{"r"}, kR}, {{"h2"}, kH2}, {{"h1", "h2"}, kH1 + kH2}}) {
    SCOPED_TRACE(names[0] + " of " + std::to_string(names.size()));
    const Outcome out = run(c, sac::save_only_these_names(names));
    EXPECT_EQ(out.kept, none.kept + bytes);
    EXPECT_EQ(out.kept_calls, names.size());
    expect_bit_identical(expected, out.grads);
  }
}

// A view or reshape of an output names that output: the whole call is kept.
TEST_F(Names, ATagOnAViewKeepsTheCallWhoseOutputItViews) {
  const Chain c;
  const auto fn = [&](const at::Tensor& in) {
    const at::Tensor h1 = in.mm(c.w1);
    sac::tag(h1.t(), "h1");
    sac::tag(h1.reshape({-1}), "h1");
    return h1.relu().mm(c.w2).tanh();
  };
  const auto expected = run_and_grad([&] { return fn(c.x); }, {c.x}, {c.w1, c.w2}, 0);
  const Outcome none = run(fn, {c.x, c.w1, c.w2}, c.x, sac::nothing_saveable());
  const Outcome out = run(fn, {c.x, c.w1, c.w2}, c.x, sac::save_only_these_names({"h1"}));
  EXPECT_EQ(out.kept, none.kept + kH1);
  EXPECT_EQ(out.kept_calls, 1u);
  expect_bit_identical(expected, out.grads);
}

// Keeping a call keeps all of its outputs: native_layer_norm's mean and
// rstd with the output that was tagged.
TEST_F(Names, ATagKeepsEveryOutputOfItsCall) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({16, 32}, torch::requires_grad());
  const at::Tensor w = torch::randn({32}, torch::requires_grad());
  const auto fn = [&](const at::Tensor& in) {
    return sac::tag(torch::layer_norm(in, {32}, w), "ln").sin();
  };
  const auto expected = run_and_grad([&] { return fn(x); }, {x}, {w}, 0);
  const Outcome none = run(fn, {x, w}, x, sac::nothing_saveable());
  const Outcome out = run(fn, {x, w}, x, sac::save_only_these_names({"ln"}));
  EXPECT_EQ(out.kept, none.kept + (16 * 32 + 16 + 16) * kFloat);
  EXPECT_EQ(out.kept_calls, 1u);
  expect_bit_identical(expected, out.grads);
}

TEST_F(Names, SaveAndOffloadOnlyTheseNamesSavesSomeAndOffloadsOthers) {
  const Chain c;
  const auto expected = c.plain();
  const Outcome none = run(c, sac::nothing_saveable());
  auto arena = std::make_shared<HostArena>();
  const Outcome out = run(c, sac::save_and_offload_only_these_names({"h2"}, {"h1", "r"}), arena);
  EXPECT_EQ(out.kept, none.kept + kH2);
  EXPECT_EQ(out.kept_calls, 3u);
  EXPECT_EQ(arena->copies(), 2);
  EXPECT_EQ(arena->returns(), 2);
  EXPECT_EQ(arena->held(), 0) << "the backward freed the copies";
  expect_bit_identical(expected, out.grads);
}

TEST_F(Names, SaveAnyNamesButTheseSavesTheOtherNamedValues) {
  const Chain c;
  const auto expected = c.plain();
  const Outcome none = run(c, sac::nothing_saveable());
  const Outcome out = run(c, sac::save_any_names_but_these({"r"}));
  EXPECT_EQ(out.kept, none.kept + kH1 + kH2);
  EXPECT_EQ(out.kept_calls, 2u);
  expect_bit_identical(expected, out.grads);
}

// ---- Names with op-level policies -------------------------------------------------

// any_of adds the named values to what the op-level policy keeps.
TEST_F(Names, AnyOfAddsNamedValuesToAnOpLevelPolicy) {
  const Chain c;
  const auto expected = c.plain();
  const Outcome none = run(c, sac::nothing_saveable());
  const Outcome out =
      run(c, sac::any_of({sac::Policy::save_ops({"aten::mm"}), sac::save_only_these_names({"r"})}));
  EXPECT_EQ(out.kept, none.kept + kH1 + kR + kH2);
  EXPECT_EQ(out.kept_calls, 3u);
  expect_bit_identical(expected, out.grads);
  // A name the op-level policy keeps already changes nothing.
  const Outcome same = run(
      c, sac::any_of({sac::Policy::save_ops({"aten::mm"}), sac::save_only_these_names({"h1"})}));
  EXPECT_EQ(same.kept, none.kept + kH1 + kH2);
  expect_bit_identical(expected, same.grads);
}

// except() with a name policy: a MustRecompute answer for a tag recomputes
// the call that the op-level answer kept (JAX's
// save_anything_except_these_names).
TEST_F(Names, ExceptANameRecomputesWhatTheOpLevelPolicyKept) {
  const Chain c;
  const auto expected = c.plain();
  const Outcome all = run(c, sac::everything_saveable());
  const Outcome out =
      run(c, sac::except(sac::everything_saveable(), sac::save_only_these_names({"h1"})));
  EXPECT_EQ(out.kept, all.kept - kH1);
  EXPECT_EQ(out.kept_calls, all.kept_calls - 1);
  expect_bit_identical(expected, out.grads);
  const Outcome mm =
      run(c, sac::except(sac::Policy::save_ops({"aten::mm"}), sac::save_only_these_names({"h2"})));
  const Outcome none = run(c, sac::nothing_saveable());
  EXPECT_EQ(mm.kept, none.kept + kH1);
  expect_bit_identical(expected, mm.grads);
}

// offload_if and for_shapes act on a tag's answer as on an op's.
TEST_F(Names, CombinatorsApplyToTagAnswers) {
  const Chain c;
  const auto expected = c.plain();
  const Outcome none = run(c, sac::nothing_saveable());
  auto arena = std::make_shared<HostArena>();
  const Outcome offloaded =
      run(c, sac::offload_if(sac::save_only_these_names({"h1", "h2"}), kH1), arena);
  EXPECT_EQ(offloaded.kept, none.kept + kH2) << "h1 is offloaded, h2 too small";
  EXPECT_EQ(arena->copies(), 1);
  expect_bit_identical(expected, offloaded.grads);
  const Outcome wide =
      run(c, sac::for_shapes(sac::save_only_these_names({"h1", "h2"}),
                             [](c10::IntArrayRef sizes) { return sizes[1] == 64; }));
  EXPECT_EQ(wide.kept, none.kept + kH1);
  expect_bit_identical(expected, wide.grads);
}

// A callback written for aten ops never meets sac::tag, even combined with a
// name policy: its catch-all answer must not recompute a named value.
TEST_F(Names, CallbacksAreNotAskedAboutTags) {
  const Chain c;
  const auto expected = c.plain();
  const Outcome none = run(c, sac::nothing_saveable());
  bool saw_tag = false;
  const auto callback =
      sac::Policy::from_fn([&](const sac::SelectiveCheckpointContext&,
                               const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue>) {
        saw_tag = saw_tag || sac::detail::is_tag(op);
        return op.schema().name() == "aten::mm" ? sac::CheckpointPolicy::MustSave
                                                : sac::CheckpointPolicy::MustRecompute;
      });
  const Outcome out = run(c, sac::any_of({callback, sac::save_only_these_names({"r"})}));
  EXPECT_FALSE(saw_tag);
  EXPECT_EQ(out.kept, none.kept + kH1 + kR + kH2);
  expect_bit_identical(expected, out.grads);
}

// ---- What a tag cannot keep ----------------------------------------------------

// An output modified in place after its op returned cannot be served as the
// op returned it: the tag warns and the call is recomputed.
TEST_F(Names, AValueModifiedInPlaceAfterItsOpIsRecomputedWithAWarning) {
  const Chain c;
  const auto fn = [&](const at::Tensor& in) {
    at::Tensor h = in.mm(c.w1);
    h.add_(1);
    return sac::tag(h, "bumped").relu().mm(c.w2);
  };
  const auto expected = run_and_grad([&] { return fn(c.x); }, {c.x}, {c.w1, c.w2}, 0);
  const Outcome none = run(fn, {c.x, c.w1, c.w2}, c.x, sac::nothing_saveable());
  Warnings warnings;
  const Outcome out = run(fn, {c.x, c.w1, c.w2}, c.x, sac::save_only_these_names({"bumped"}));
  EXPECT_EQ(out.kept, none.kept);
  EXPECT_EQ(out.kept_calls, 0u);
  EXPECT_EQ(warnings.count("value tagged 'bumped'"), 1u);
  EXPECT_EQ(warnings.count("modified in place"), 1u);
  expect_bit_identical(expected, out.grads);
}

// The same through an alias with a counter of its own (aten::_unsafe_view):
// matmul on 3-D input, then a bias added in place.
TEST_F(Names, AValueModifiedThroughAnAliasIsRecomputedWithAWarning) {
  const Chain c;
  const at::Tensor x3 = torch::randn({2, 8, 32}, torch::requires_grad());
  const auto fn = [&](const at::Tensor& in) {
    at::Tensor h = in.matmul(c.w1);  // mm on a 2-D view, then _unsafe_view
    h.add_(0.5);
    return sac::tag(h, "through_alias").relu().sum(-1);
  };
  const auto expected = run_and_grad([&] { return fn(x3); }, {x3}, {c.w1}, 0);
  Warnings warnings;
  const Outcome out = run(fn, {x3, c.w1}, x3, sac::save_only_these_names({"through_alias"}));
  EXPECT_EQ(out.kept_calls, 0u);
  EXPECT_EQ(warnings.count("value tagged 'through_alias'"), 1u);
  expect_bit_identical(expected, out.grads);
}

// A region input has no call in the region to keep: its tag changes nothing
// (the checkpoint keeps inputs anyway).
TEST_F(Names, ATagOnARegionInputChangesNothing) {
  const Chain c;
  const auto fn = [&](const at::Tensor& in) {
    sac::tag(in, "input");
    sac::tag(c.w1, "weight");
    return in.mm(c.w1).relu().mm(c.w2);
  };
  const auto expected = run_and_grad([&] { return fn(c.x); }, {c.x}, {c.w1, c.w2}, 0);
  const Outcome none = run(fn, {c.x, c.w1, c.w2}, c.x, sac::nothing_saveable());
  Warnings warnings;
  const Outcome out =
      run(fn, {c.x, c.w1, c.w2}, c.x, sac::save_only_these_names({"input", "weight"}));
  EXPECT_EQ(out.kept, none.kept);
  EXPECT_EQ(out.kept_calls, 0u);
  EXPECT_TRUE(warnings.messages.empty());
  expect_bit_identical(expected, out.grads);
}

// A name the policy asks for that the forward never tags is reported, once.
TEST_F(Names, ANameNeverTaggedIsReportedOnce) {
  const Chain c;
  Warnings warnings;
  const auto policy = sac::save_only_these_names({"h1", "misspelled_h2"});
  run(c, policy);
  run(c, policy);
  EXPECT_EQ(warnings.count("asks for the name 'misspelled_h2'"), 1u);
  EXPECT_EQ(warnings.count("'h1'"), 0u);
}

// A backward inside the region recomputes the region so far while the
// forward still records: a call a tag kept is served to it and still kept
// for the backward after the forward.
TEST_F(Names, AGradInsideTheRegionUsesAndKeepsATaggedValue) {
  const Chain c;
  const auto fn = [&](const at::Tensor& in) {
    const at::Tensor h1 = sac::tag(in.mm(c.w1), "h1");
    const at::Tensor inner =
        torch::autograd::grad({h1.relu().sum()}, {c.w1}, {}, /*retain_graph=*/true)[0];
    return h1.relu().mm(c.w2).tanh() * inner.sum();
  };
  const auto expected = run_and_grad([&] { return fn(c.x); }, {c.x}, {c.w1, c.w2}, 0);
  const Outcome none = run(fn, {c.x, c.w1, c.w2}, c.x, sac::nothing_saveable());
  const Outcome out = run(fn, {c.x, c.w1, c.w2}, c.x, sac::save_only_these_names({"h1"}));
  EXPECT_EQ(out.kept, none.kept + kH1);
  EXPECT_EQ(out.kept_calls, 1u);
  expect_bit_identical(expected, out.grads);
}

// In a nested selective region, the inner region's policy decides its ops
// and its tags: an outer name policy does not see them, and says so.
TEST_F(Names, TagsInANestedRegionBelongToTheInnerPolicy) {
  const Chain c;
  const auto fn = [&](const at::Tensor& in) {
    const at::Tensor h = sac::checkpoint(
        sac::CheckpointOptions().policy(sac::save_only_these_names({"inner_r"})),
        [&](const at::Tensor& x) { return sac::tag(x.mm(c.w1).relu(), "inner_r"); }, in);
    return sac::tag(h.mm(c.w2), "outer_h2").tanh();
  };
  const auto expected = run_and_grad([&] { return fn(c.x); }, {c.x}, {c.w1, c.w2}, 0);
  Warnings warnings;
  const Outcome out =
      run(fn, {c.x, c.w1, c.w2}, c.x, sac::save_only_these_names({"outer_h2", "inner_only_r"}));
  EXPECT_EQ(out.kept_calls, 1u) << "outer_h2";
  EXPECT_EQ(warnings.count("asks for the name 'inner_only_r'"), 1u);
  EXPECT_EQ(warnings.count("'inner_r'"), 0u) << "the inner region tagged it";
  expect_bit_identical(expected, out.grads);
}

// ---- Random producers, models, many steps ----------------------------------------

// A kept random op restores its generator when served: the random ops
// recomputed after it draw what they drew in the forward.
TEST_F(Names, AKeptRandomCallRestoresItsGenerator) {
  const Chain c;
  const auto fn = [&](const at::Tensor& in) {
    const at::Tensor h = in.mm(c.w1);
    const at::Tensor dropped = sac::tag(std::get<0>(at::native_dropout(h, 0.5, true)), "drop");
    return (dropped * torch::rand_like(dropped)).mm(c.w2);
  };
  const auto expected = run_and_grad([&] { return fn(c.x); }, {c.x}, {c.w1, c.w2}, 0);
  const Outcome out = run(fn, {c.x, c.w1, c.w2}, c.x, sac::save_only_these_names({"drop"}));
  EXPECT_EQ(out.kept_calls, 1u);
  expect_bit_identical(expected, out.grads);
}

struct TaggedMlp : torch::nn::Module {
  TaggedMlp() {
    up = register_module("up", torch::nn::Linear(32, 64));
    down = register_module("down", torch::nn::Linear(64, 32));
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = sac::tag(up(x), "up");
    return x + down(sac::tag(torch::gelu(h), "act"));
  }
  torch::nn::Linear up{nullptr}, down{nullptr};
};

// Name policies through the scope guard and the module wrapper, over many
// training steps: parameters stay bit-identical to plain training.
TEST_F(Names, NamePoliciesTrainLikePlainAutogradThroughScopesAndWrappers) {
  using Forward = std::function<at::Tensor(const at::Tensor&)>;
  const auto policy = sac::save_only_these_names({"up", "act"});
  auto train = [&](const std::function<Forward(std::shared_ptr<TaggedMlp>)>& make_forward) {
    torch::manual_seed(0);
    auto model = std::make_shared<TaggedMlp>();
    const Forward forward = make_forward(model);
    torch::optim::SGD sgd(model->parameters(), 0.1);
    for (int i = 0; i < 6; ++i) {
      const at::Tensor x = torch::randn({8, 32});
      sgd.zero_grad();
      forward(x).pow(2).mean().backward();
      sgd.step();
    }
    return model->parameters();
  };
  const auto plain = train([](std::shared_ptr<TaggedMlp> m) -> Forward {
    return [m](const at::Tensor& x) { return m->forward(x); };
  });
  const auto scoped = train([&](std::shared_ptr<TaggedMlp> m) -> Forward {
    return [m, &policy](const at::Tensor& x) {
      sac::CheckpointScope scope(sac::CheckpointOptions().policy(policy));
      return sac::checkpoint([&](const at::Tensor& in) { return m->forward(in); }, x);
    };
  });
  expect_bit_identical(plain, scoped);
  const auto wrapped = train([&](std::shared_ptr<TaggedMlp> m) -> Forward {
    auto wrapper = sac::checkpoint_wrapper(m, sac::CheckpointOptions().policy(policy));
    return [wrapper](const at::Tensor& x) mutable { return wrapper->forward(x); };
  });
  expect_bit_identical(plain, wrapped);
}

}  // namespace policy_names_test
