// sac on several threads at once: regions, modes, hooks and the dispatch
// state are per thread; a region may be backwarded on another thread than the
// one that ran its forward; one policy object may serve regions on several
// threads. Every gradient is bit-identical to the un-checkpointed run.
#include "support.h"

#include <sac/base/internal/stash.h>
#include <sac/dispatch/internal/interceptor.h>
#include <sac/offload/offload.h>

#include <ATen/ThreadLocalState.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace threads_test {

using sac_test::expect_bit_identical;

// One intra-op thread everywhere: the un-checkpointed references (computed on
// the test's main thread) and the runs on worker threads must reduce in the
// same order. Worker threads inherit the setting (ATen initialises each new
// thread from it), and call this again to be sure.
void single_intra_op_thread() { at::set_num_threads(1); }

// What a thread leaves behind when it is done with sac: nothing.
struct ThreadState {
  bool interceptor_active = true;
  bool fallback_key_included = true;
  bool grad_enabled = false;
  static ThreadState now() {
    return {sac::detail::active_interceptor() != nullptr,
            c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::Fake),
            c10::GradMode::is_enabled()};
  }
};

void expect_clean(const ThreadState& state, const std::string& where) {
  EXPECT_FALSE(state.interceptor_active) << where << ": an interceptor is still active";
  EXPECT_FALSE(state.fallback_key_included) << where << ": the Fake key is still included";
  EXPECT_TRUE(state.grad_enabled) << where << ": grad mode left disabled";
}

// A std::barrier for C++17.
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int generation = generation_;
    if (++waiting_ == count_) {
      waiting_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation != generation_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  const int count_;
  int waiting_ = 0;
  int generation_ = 0;
};

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

// Runs `body` on a new thread and joins it; an exception in `body` is handed
// to the caller's thread as a test failure.
void run_on_thread(const std::string& name, const std::function<void()>& body) {
  std::exception_ptr error;
  std::thread thread([&] {
    try {
      single_intra_op_thread();
      body();
    } catch (...) {
      error = std::current_exception();
    }
  });
  thread.join();
  if (error) {
    ADD_FAILURE() << name << " threw: " << message_of(error);
  }
}

// A model with its own weights and the function a region runs.
struct Model {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> initial;  // the weights it was created with

  void reset() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].copy_(initial[i]);
    }
  }
};

Model make_mlp(uint64_t seed) {
  torch::manual_seed(seed);
  sac_test::Mlp mlp(16, 32, 8, /*depth=*/3);
  Model model{mlp.ptr(),
              [m = mlp.ptr()](const at::Tensor& x) { return m->forward(x); },
              mlp->parameters(),
              {}};
  for (const auto& p : model.params) {
    model.initial.push_back(p.detach().clone());
  }
  return model;
}

// No dropout: the default CPU generator is shared by all threads, so random
// ops on several threads at once draw in no fixed order.
Model make_gpt_block(uint64_t seed) {
  torch::manual_seed(seed);
  sac_test::GptBlock block(16, 2, /*dropout=*/0.0);
  Model model{block.ptr(),
              [m = block.ptr()](const at::Tensor& x) { return m->forward(x); },
              block->parameters(),
              {}};
  for (const auto& p : model.params) {
    model.initial.push_back(p.detach().clone());
  }
  return model;
}

at::Tensor input_for(bool gpt, uint64_t seed) {
  torch::manual_seed(seed);
  return gpt ? torch::randn({2, 8, 16}) : torch::randn({6, 16});
}

sac::Policy save_matmuls() {
  return sac::Policy::save_ops(
      {"aten::addmm", "aten::_scaled_dot_product_flash_attention_for_cpu"});
}

// Stateless: saves the matmuls and the activations.
sac::Policy callback_policy() {
  return sac::Policy::from_fn([](const sac::SelectiveCheckpointContext&,
                                 const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue>) {
    const auto& name = op.operator_name().name;
    return name == "aten::addmm" || name == "aten::relu" || name == "aten::gelu";
  });
}

// Registers the kernels (per-op mechanism) a policy needs, on this thread.
void prepare(const sac::Policy& policy) { sac::create_selective_checkpoint_contexts(policy); }

enum class Kind { SaveOps, Callback, Full, None };

const char* name_of(Kind kind) {
  switch (kind) {
    case Kind::SaveOps: return "save_ops";
    case Kind::Callback: return "callback";
    case Kind::Full: return "full recompute";
    case Kind::None: return "no checkpoint";
  }
  return "?";
}

// One SGD step: forward (checkpointed unless `kind` is None), backward of
// sum(y^2) with autograd::grad, in-place update. Returns the gradients.
std::vector<at::Tensor> sgd_step(Model& model, const at::Tensor& x, Kind kind,
                                 const sac::Policy& save_ops, const sac::Policy& callback) {
  at::Tensor y;
  switch (kind) {
    case Kind::SaveOps:
      y = sac::checkpoint(sac::CheckpointOptions().policy(save_ops), model.forward, x);
      break;
    case Kind::Callback:
      y = sac::checkpoint(sac::CheckpointOptions().policy(callback), model.forward, x);
      break;
    case Kind::Full: y = sac::checkpoint(model.forward, x); break;
    case Kind::None: y = model.forward(x); break;
  }
  auto grads = torch::autograd::grad({y.pow(2).sum()}, model.params);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < grads.size(); ++i) {
    model.params[i].sub_(grads[i] * 0.01);
  }
  return grads;
}

class Threads : public ::testing::Test {
 protected:
  void SetUp() override {
    sac_test::expect_configured_mechanism();
    single_intra_op_thread();
  }
};

// 1. Four threads train their own model (two MLPs, two GPT blocks) at once,
// each step under another kind of checkpoint. Every gradient of every step
// is bit-identical to the same training done sequentially without
// checkpointing.
TEST_F(Threads, ConcurrentTrainingMatchesSequentialReference) {
  constexpr int kThreads = 4, kSteps = 6;
  const auto save_ops = save_matmuls();
  const auto callback = callback_policy();
  prepare(save_ops);
  prepare(callback);

  std::vector<Model> models;
  std::vector<std::vector<at::Tensor>> inputs(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    const bool gpt = t % 2 == 1;
    models.push_back(gpt ? make_gpt_block(100 + t) : make_mlp(100 + t));
    for (int s = 0; s < kSteps; ++s) {
      inputs[t].push_back(input_for(gpt, 1000 * t + s));
    }
  }
  // The reference: each model trained sequentially, here, without sac.
  std::vector<std::vector<std::vector<at::Tensor>>> expected(kThreads);
  std::vector<std::vector<at::Tensor>> expected_weights(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    for (int s = 0; s < kSteps; ++s) {
      expected[t].push_back(sgd_step(models[t], inputs[t][s], Kind::None, save_ops, callback));
    }
    for (const auto& p : models[t].params) {
      expected_weights[t].push_back(p.detach().clone());
    }
    models[t].reset();
  }

  const Kind kinds[] = {Kind::SaveOps, Kind::Callback, Kind::Full};
  std::vector<std::vector<std::vector<at::Tensor>>> actual(kThreads);
  std::vector<std::exception_ptr> errors(kThreads);
  std::vector<ThreadState> after(kThreads);
  Barrier start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        single_intra_op_thread();
        start.arrive_and_wait();
        for (int s = 0; s < kSteps; ++s) {
          actual[t].push_back(
              sgd_step(models[t], inputs[t][s], kinds[(t + s) % 3], save_ops, callback));
        }
      } catch (...) {
        errors[t] = std::current_exception();
      }
      after[t] = ThreadState::now();
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  for (int t = 0; t < kThreads; ++t) {
    SCOPED_TRACE("thread " + std::to_string(t));
    ASSERT_FALSE(errors[t]) << message_of(errors[t]);
    expect_clean(after[t], "worker thread");
    ASSERT_EQ(actual[t].size(), static_cast<size_t>(kSteps));
    for (int s = 0; s < kSteps; ++s) {
      SCOPED_TRACE(std::string("step ") + std::to_string(s) + " (" + name_of(kinds[(t + s) % 3]) +
                   ")");
      expect_bit_identical(expected[t][s], actual[t][s]);
    }
    SCOPED_TRACE("trained weights");
    std::vector<at::Tensor> weights;
    for (const auto& p : models[t].params) {
      weights.push_back(p.detach());
    }
    expect_bit_identical(expected_weights[t], weights);
  }
  expect_clean(ThreadState::now(), "main thread");
}

// 2. A region's forward on thread A, its backward on thread B. Gradients are
// bit-identical; neither thread keeps any sac state, and thread A then runs
// plain autograd as before.
TEST_F(Threads, BackwardOnAnotherThreadThanTheForward) {
  struct Case {
    std::string name;
    std::optional<sac::Policy> policy;
    bool gpt;
  };
  const std::vector<Case> cases{
      {"full recompute, MLP", std::nullopt, false},
      {"save_ops, MLP", save_matmuls(), false},
      {"callback, MLP", callback_policy(), false},
      {"full recompute, GPT block with dropout", std::nullopt, true},
      {"save_ops, GPT block with dropout", save_matmuls(), true},
      {"callback, GPT block with dropout", callback_policy(), true},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    // Dropout on: only one thread draws random numbers at a time here, and
    // the recomputation on thread B must draw the forward's numbers.
    torch::manual_seed(7);
    Model model;
    if (c.gpt) {
      sac_test::GptBlock block(16, 2, /*dropout=*/0.2);
      model = {block.ptr(),
               [m = block.ptr()](const at::Tensor& x) { return m->forward(x); },
               block->parameters(),
               {}};
    } else {
      model = make_mlp(7);
    }
    const at::Tensor x =
        (c.gpt ? torch::randn({2, 8, 16}) : torch::randn({6, 16})).requires_grad_(true);
    std::vector<at::Tensor> wrt{x};
    wrt.insert(wrt.end(), model.params.begin(), model.params.end());
    const auto expected =
        sac_test::run_and_grad([&] { return model.forward(x); }, {x}, model.params, 11);

    std::promise<at::Tensor> forward_done;
    std::promise<void> backward_done;
    auto backward_done_future = backward_done.get_future();
    std::vector<at::Tensor> plain_on_a;
    ThreadState a_after_forward, a_at_end, b_at_end;
    std::exception_ptr a_error;
    std::thread a([&] {
      try {
        single_intra_op_thread();
        sac::CheckpointOptions options;
        if (c.policy) {
          options.policy(*c.policy);
        }
        torch::manual_seed(11);
        at::Tensor y = sac::checkpoint(options, model.forward, x);
        a_after_forward = ThreadState::now();
        forward_done.set_value(y);
        y.reset();
        backward_done_future.wait();
        a_at_end = ThreadState::now();
        plain_on_a =
            sac_test::run_and_grad([&] { return model.forward(x); }, {x}, model.params, 11);
      } catch (...) {
        a_error = std::current_exception();
        try {
          forward_done.set_exception(std::current_exception());
        } catch (const std::future_error&) {
        }
      }
    });
    std::vector<at::Tensor> actual;
    auto y_future = forward_done.get_future();
    try {
      at::Tensor y = y_future.get();
      run_on_thread("thread B", [&] {
        auto grads = torch::autograd::grad({y.sum()}, wrt);
        actual = {y.detach()};
        actual.insert(actual.end(), grads.begin(), grads.end());
        b_at_end = ThreadState::now();
      });
    } catch (...) {
    }
    backward_done.set_value();
    a.join();
    ASSERT_FALSE(a_error) << "thread A threw: " << message_of(a_error);
    expect_clean(a_after_forward, "thread A after the forward");
    expect_clean(a_at_end, "thread A after the backward on B");
    expect_clean(b_at_end, "thread B after the backward");
    expect_bit_identical(expected, actual);
    expect_bit_identical(expected, plain_on_a);
  }
  expect_clean(ThreadState::now(), "main thread");
}

// 3. Two regions' forwards on two threads while a third thread backwards
// through a third region, round after round. All three bit-identical to
// their references; no thread keeps sac state.
TEST_F(Threads, ForwardsAndABackwardOfThreeRegionsAtOnce) {
  constexpr int kRounds = 8;
  const auto save_ops = save_matmuls();
  const auto callback = callback_policy();
  prepare(save_ops);
  prepare(callback);
  Model m1 = make_mlp(31), m2 = make_gpt_block(32), m3 = make_mlp(33);
  std::vector<at::Tensor> x1, x2, x3;
  for (int r = 0; r < kRounds; ++r) {
    x1.push_back(input_for(false, 310 + r).requires_grad_(true));
    x2.push_back(input_for(true, 320 + r).requires_grad_(true));
    x3.push_back(input_for(false, 330 + r).requires_grad_(true));
  }
  auto reference = [](Model& m, const at::Tensor& x) {
    return sac_test::run_and_grad([&] { return m.forward(x); }, {x}, m.params);
  };
  // Region 3's forwards run here, before the threads start (alternating a
  // selective policy and full recomputation); thread 3 backwards them.
  std::vector<at::Tensor> y3;
  for (int r = 0; r < kRounds; ++r) {
    y3.push_back(r % 2 == 0
                     ? sac::checkpoint(sac::CheckpointOptions().policy(save_ops), m3.forward, x3[r])
                     : sac::checkpoint(m3.forward, x3[r]));
  }

  Barrier round(3);
  std::vector<at::Tensor> y1(kRounds), y2(kRounds);
  std::vector<std::vector<at::Tensor>> grads3(kRounds);
  std::exception_ptr errors[3];
  ThreadState after[3];
  auto worker = [&](int index, const std::function<void(int)>& body) {
    return std::thread([&, index, body] {
      single_intra_op_thread();
      for (int r = 0; r < kRounds; ++r) {
        round.arrive_and_wait();
        if (errors[index]) {
          continue;  // keep arriving at the barrier
        }
        try {
          body(r);
        } catch (...) {
          errors[index] = std::current_exception();
        }
      }
      after[index] = ThreadState::now();
    });
  };
  std::vector<std::thread> threads;
  threads.push_back(worker(0, [&](int r) {
    y1[r] = sac::checkpoint(sac::CheckpointOptions().policy(save_ops), m1.forward, x1[r]);
  }));
  threads.push_back(worker(1, [&](int r) {
    y2[r] = sac::checkpoint(sac::CheckpointOptions().policy(callback), m2.forward, x2[r]);
  }));
  threads.push_back(worker(2, [&](int r) {
    std::vector<at::Tensor> wrt{x3[r]};
    wrt.insert(wrt.end(), m3.params.begin(), m3.params.end());
    auto grads = torch::autograd::grad({y3[r].sum()}, wrt);
    grads3[r] = {y3[r].detach()};
    grads3[r].insert(grads3[r].end(), grads.begin(), grads.end());
    y3[r].reset();
  }));
  for (auto& thread : threads) {
    thread.join();
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_FALSE(errors[i]) << "thread " << i + 1 << " threw: " << message_of(errors[i]);
    expect_clean(after[i], "thread " + std::to_string(i + 1));
  }
  for (int r = 0; r < kRounds; ++r) {
    SCOPED_TRACE("round " + std::to_string(r));
    // Regions 1 and 2 are backwarded here, on the main thread.
    std::vector<at::Tensor> wrt1{x1[r]}, wrt2{x2[r]};
    wrt1.insert(wrt1.end(), m1.params.begin(), m1.params.end());
    wrt2.insert(wrt2.end(), m2.params.begin(), m2.params.end());
    auto g1 = torch::autograd::grad({y1[r].sum()}, wrt1);
    auto g2 = torch::autograd::grad({y2[r].sum()}, wrt2);
    g1.insert(g1.begin(), y1[r].detach());
    g2.insert(g2.begin(), y2[r].detach());
    {
      SCOPED_TRACE("region 1 (forward on thread 1)");
      expect_bit_identical(reference(m1, x1[r]), g1);
    }
    {
      SCOPED_TRACE("region 2 (forward on thread 2)");
      expect_bit_identical(reference(m2, x2[r]), g2);
    }
    {
      SCOPED_TRACE("region 3 (backward on thread 3)");
      expect_bit_identical(reference(m3, x3[r]), grads3[r]);
    }
  }
  expect_clean(ThreadState::now(), "main thread");
}

// 4. One policy object (a stateless callback) serves regions on four threads
// at once, sharing one model. Each thread's callback sees exactly the op
// calls of its own regions, in the order a single-threaded run sees them,
// and every gradient is bit-identical. Each callback call also checks that
// ctx.op_output is what the op returned, and the call's index.
TEST_F(Threads, OnePolicyObjectSharedByFourThreads) {
  constexpr int kThreads = 4, kIterations = 5;
  // The calls the callback saw on the calling thread: (call index, op).
  // Each thread points this at a log it owns (a thread_local container
  // would be freed only by TLS destructors, which LeakSanitizer reports).
  using CallLog = std::vector<std::pair<size_t, std::string>>;
  static thread_local CallLog* seen = nullptr;
  std::atomic<int64_t> total_calls{0};
  const auto policy = sac::Policy::from_fn(
      [&total_calls](const sac::SelectiveCheckpointContext& ctx, const c10::OperatorHandle& op,
                     c10::ArrayRef<c10::IValue>) {
        ++total_calls;
        seen->emplace_back(ctx.call, op.operator_name().name);
        EXPECT_EQ(ctx.op_output.size(), op.schema().returns().size());
        const auto& name = op.operator_name().name;
        return name == "aten::addmm" || name == "aten::gelu"
                   ? sac::CheckpointPolicy::MustSave
                   : sac::CheckpointPolicy::PreferRecompute;
      });
  prepare(policy);
  Model model = make_gpt_block(44);
  std::vector<at::Tensor> inputs;
  for (int t = 0; t < kThreads; ++t) {
    inputs.push_back(input_for(true, 440 + t).requires_grad_(true));
  }
  std::vector<at::Tensor> wrt_params = model.params;

  {
    const auto options = sac::CheckpointOptions().policy(policy);
    auto run = [&](const at::Tensor& x) {
      return sac_test::run_and_grad([&] { return sac::checkpoint(options, model.forward, x); }, {x},
                                    wrt_params);
    };
    // What one region's forward and backward show the callback, alone.
    CallLog main_log;
    seen = &main_log;
    total_calls = 0;
    std::vector<std::vector<at::Tensor>> expected;
    for (int t = 0; t < kThreads; ++t) {
      expected.push_back(sac_test::run_and_grad([&] { return model.forward(inputs[t]); },
                                                {inputs[t]}, wrt_params));
    }
    EXPECT_EQ(total_calls.load(), 0) << "the policy is not asked outside regions";
    run(inputs[0]);
    const auto calls_per_region = main_log;
    ASSERT_FALSE(calls_per_region.empty());
    total_calls = 0;

    std::vector<std::vector<std::vector<at::Tensor>>> actual(kThreads);
    std::vector<CallLog> seen_by(kThreads);
    std::vector<std::exception_ptr> errors(kThreads);
    std::vector<ThreadState> after(kThreads);
    Barrier start(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        try {
          single_intra_op_thread();
          seen = &seen_by[t];
          start.arrive_and_wait();
          for (int i = 0; i < kIterations; ++i) {
            // Not run_and_grad: it seeds the generator that all threads share.
            const at::Tensor& x = inputs[t];
            at::Tensor y = sac::checkpoint(options, model.forward, x);
            std::vector<at::Tensor> wrt{x};
            wrt.insert(wrt.end(), wrt_params.begin(), wrt_params.end());
            auto grads = torch::autograd::grad({y.sum()}, wrt);
            grads.insert(grads.begin(), y.detach());
            actual[t].push_back(std::move(grads));
          }
        } catch (...) {
          errors[t] = std::current_exception();
        }
        after[t] = ThreadState::now();
      });
    }
    for (auto& thread : threads) {
      thread.join();
    }
    EXPECT_EQ(total_calls.load(),
              static_cast<int64_t>(kThreads * kIterations * calls_per_region.size()));
    for (int t = 0; t < kThreads; ++t) {
      SCOPED_TRACE("thread " + std::to_string(t));
      ASSERT_FALSE(errors[t]) << message_of(errors[t]);
      expect_clean(after[t], "worker thread");
      ASSERT_EQ(seen_by[t].size(), kIterations * calls_per_region.size());
      for (int i = 0; i < kIterations; ++i) {
        for (size_t j = 0; j < calls_per_region.size(); ++j) {
          const auto& call = seen_by[t][i * calls_per_region.size() + j];
          ASSERT_EQ(call, calls_per_region[j]) << "iteration " << i << ", call " << j;
        }
        expect_bit_identical(expected[t], actual[t][i]);
      }
    }
  }
  expect_clean(ThreadState::now(), "main thread");
}

// The autograd engine's thread for an accelerator, as the engine runs it:
// one thread per device, which runs the device's nodes of every backward
// under the state (at::ThreadLocalState) of the thread that called backward,
// and runs a backward called on it inline. On a CPU-only machine the engine
// has none, so a test node sends its work here.
class FakeDeviceThread {
 public:
  FakeDeviceThread() : thread_([this] { loop(); }) {}
  ~FakeDeviceThread() {
    post(nullptr);
    thread_.join();
  }

  // Runs `work` on the device thread (inline if this is it) under `state`.
  void run(const at::ThreadLocalState& state, const std::function<void()>& work) {
    run([&] {
      at::ThreadLocalStateGuard guard(state);
      work();
    });
  }
  void run(const std::function<void()>& work) {
    if (std::this_thread::get_id() == thread_.get_id()) {
      work();
      return;
    }
    std::packaged_task<void()> task(work);
    auto done = task.get_future();
    post([&task] { task(); });
    done.get();
  }

 private:
  void post(std::function<void()> work) {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(work));
    ready_.notify_one();
  }
  void loop() {
    single_intra_op_thread();
    for (;;) {
      std::function<void()> work;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return !queue_.empty(); });
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      if (!work) return;
      work();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> queue_;
  std::thread thread_;
};

// What the device thread saw while it ran a node inside a checkpointed
// forward.
struct SeenOnDevice {
  bool interceptor = false;
  bool stash = false;
};

// y = h * h * w, whose backward runs on the fake device thread, as a CUDA
// node's would.
struct OnDevice : torch::autograd::Function<OnDevice> {
  static FakeDeviceThread* device;
  static SeenOnDevice* seen;

  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h,
                            const at::Tensor& w) {
    ctx->save_for_backward({h, w});
    return h * h * w;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    torch::autograd::variable_list out(2);
    device->run(at::ThreadLocalState(), [&] {
      if (seen != nullptr) {
        seen->interceptor |= sac::detail::active_interceptor() != nullptr;
        seen->stash |= sac::detail::current_stash() != nullptr;
      }
      out[0] = grads[0] * saved[0] * saved[1] * 2;
      out[1] = grads[0] * saved[0] * saved[0];
    });
    return out;
  }
};
FakeDeviceThread* OnDevice::device = nullptr;
SeenOnDevice* OnDevice::seen = nullptr;

// A gradient taken inside the forward (create_graph), whose backward runs a
// node on the device thread: the ops and saves there belong to the region.
at::Tensor grad_inside(const at::Tensor& x, const at::Tensor& w) {
  const auto h = x.sin();
  const auto y = OnDevice::apply(h, w);
  const auto g = torch::autograd::grad({y.sum()}, {h}, {}, /*retain_graph=*/true,
                                       /*create_graph=*/true)[0];
  return (g * h.cos()).sum();
}

// issue 22, item 3: sac's thread-locals reach the engine's device threads.
// Before, the forward's device-thread ops and saves went unseen while the
// recomputation, which runs on that thread, saw them: the saves did not line
// up with the holders.
TEST(EngineThreads, ABackwardInsideTheForwardCarriesTheRegionToTheDeviceThread) {
  single_intra_op_thread();
  FakeDeviceThread device;
  OnDevice::device = &device;
  const auto save_muls = sac::Policy::save_ops({"aten::mul.Tensor"});
  const auto callback = sac::Policy::from_fn(
      [](const sac::SelectiveCheckpointContext&, const c10::OperatorHandle& op,
         c10::ArrayRef<c10::IValue>) { return op.operator_name().name == "aten::cos"; });
  prepare(save_muls);
  prepare(callback);
  const auto x = torch::randn({5}, torch::requires_grad());
  const auto w = torch::randn({5}, torch::requires_grad());
  std::vector<at::Tensor> expected;
  const auto plain = grad_inside(x, w);
  device.run([&] { expected = torch::autograd::grad({plain}, {x, w}); });

  struct Case {
    std::string name;
    std::optional<sac::Policy> policy;
    bool offload;
  };
  for (const auto& c : std::vector<Case>{{"full recomputation", std::nullopt, false},
                                         {"save_ops", save_muls, false},
                                         {"callback", callback, false},
                                         {"save_ops under an OffloadGuard", save_muls, true}}) {
    SCOPED_TRACE(c.name);
    SeenOnDevice seen;
    OnDevice::seen = &seen;
    at::Tensor loss;
    {
      std::optional<sac::OffloadGuard> offload;
      if (c.offload) offload.emplace();
      sac::CheckpointOptions options;
      if (c.policy) options.policy(*c.policy);
      loss = sac::checkpoint(options, grad_inside, x, w);
    }
    OnDevice::seen = nullptr;
    EXPECT_EQ(seen.interceptor, c.policy.has_value());
    EXPECT_EQ(seen.stash, c.offload);
    std::vector<at::Tensor> actual;
    // The recomputation runs where the backward unpacks: on the device thread.
    device.run([&] { actual = torch::autograd::grad({loss}, {x, w}); });
    expect_bit_identical(expected, actual);
  }
  OnDevice::device = nullptr;
  expect_clean(ThreadState::now(), "main thread");
}

// What a thread carries is what it sees: its interceptor, or nothing where
// interception is isolated (a recomputation), even with a carried one below.
TEST(EngineThreads, AThreadCarriesWhatItSees) {
  struct Passing final : sac::detail::OpInterceptor {
    void intercept(const c10::OperatorHandle& op, c10::DispatchKeySet below,
                   torch::jit::Stack* stack) override {
      sac::detail::run_op(op, below, stack);
    }
  } interceptor;
  std::optional<at::ThreadLocalState> outer, isolated;
  {
    sac::detail::InterceptorGuard active(&interceptor);
    sac::detail::CarryToEngineThreads carry;
    EXPECT_EQ(sac::detail::active_interceptor(), &interceptor);
    outer.emplace();
    sac::detail::IsolationGuard isolate;
    EXPECT_EQ(sac::detail::active_interceptor(), nullptr);
    sac::detail::CarryToEngineThreads carry_inside;
    isolated.emplace();
  }
  expect_clean(ThreadState::now(), "main thread");
  std::thread([&] {
    {
      at::ThreadLocalStateGuard state(*outer);
      EXPECT_EQ(sac::detail::active_interceptor(), &interceptor);
    }
    {
      at::ThreadLocalStateGuard state(*isolated);
      EXPECT_EQ(sac::detail::active_interceptor(), nullptr);
    }
    expect_clean(ThreadState::now(), "other thread");
  }).join();
}

}  // namespace threads_test
