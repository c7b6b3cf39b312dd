#include <sac/cache/internal/selective_modes.h>

#include <sac/base/internal/early_stop.h>
#include <sac/base/internal/generators.h>
#include <sac/base/internal/region_events.h>

#include <sac/base/internal/stash.h>
#include <sac/dispatch/internal/boxed.h>
#include <sac/policy/internal/op_traits.h>
#include <sac/policy/internal/answers.h>
#include <sac/policy/internal/tag.h>
#include <sac/dispatch/internal/registry.h>

#include <ATen/Context.h>
#include <torch/csrc/autograd/graph_task.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <mutex>
#include <unordered_set>

namespace sac::detail {
namespace {

// A random op's explicit Generator argument, if it has one.
std::optional<at::Generator> explicit_generator(c10::ArrayRef<c10::IValue> args) {
  for (const auto& arg : args) {
    if (arg.isGenerator()) {
      return arg.toGenerator();
    }
  }
  return std::nullopt;
}

// The generator a random op drew from (`generator` if explicit, else the
// default generator of its first tensor output's device) and its state now.
std::optional<GeneratorSnapshot> snapshot_after(std::optional<at::Generator> generator,
                                                c10::ArrayRef<c10::IValue> outputs) {
  if (!generator.has_value()) {
    for (const auto& output : outputs) {
      if (output.isTensor() && output.toTensor().defined()) {
        generator = at::globalContext().defaultGenerator(output.toTensor().device());
        break;
      }
    }
  }
  if (!generator.has_value()) {
    return std::nullopt;
  }
  return GeneratorSnapshot{*generator, locked_clone(*generator)};
}

// Warns with `message` the first time this process meets `key`: a region's
// forward runs every training step, and so would its warnings.
void warn_once(const std::string& key, const std::string& message) {
  static std::mutex mutex;
  static std::unordered_set<std::string> warned;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!warned.insert(key).second) {
      return;
    }
  }
  TORCH_WARN(message);
}

// A functional collective returns at once, and its work writes the outputs
// in place when it completes: a later version than the one the cache would
// note, which the cache would take for a modification (and recompute the
// call). So a kept collective is waited for before its outputs are cached:
// the cache holds the completed values, at the version they keep. Only kept
// collectives lose their overlap with the forward's compute, and the
// region's own wait_tensor then finds nothing in flight.
void wait_for_collective(c10::ArrayRef<c10::IValue> outputs) {
  static const c10::OperatorHandle wait_tensor =
      c10::Dispatcher::singleton().findSchemaOrThrow("_c10d_functional::wait_tensor", "");
  for (const auto& output : outputs) {
    for_each_tensor(output, [](const at::Tensor& t) {
      torch::jit::Stack stack{t};
      wait_tensor.callBoxed(&stack);
    });
  }
}

void restore(GeneratorSnapshot snapshot) {
  locked_set_state(snapshot.live, snapshot.state_after.get_state());
}

}  // namespace

// ---- SelectiveMode ----------------------------------------------------------

void SelectiveMode::enter() {
  if (entries_.empty()) {
    on_outermost_enter();
  }
  entries_.push_back(push_interceptor(this));
}

void SelectiveMode::exit() {
  TORCH_INTERNAL_ASSERT(!entries_.empty(), "sac: a mode exited more often than entered");
  pop_interceptor(entries_.back());
  entries_.pop_back();
  if (entries_.empty()) {
    on_outermost_exit();
  }
}

SelectiveMode::OpFacts SelectiveMode::learn(const c10::OperatorHandle& op) {
  const OpFacts facts{policy_.decides_about(op), issues_collective(op), communicates(op),
                      is_tag(op), is_random(op)};
  facts_[op_key(op)] = facts;
  return facts;
}

// ---- CachingMode ------------------------------------------------------------

CachingMode::CachingMode(Policy policy, std::shared_ptr<OpCache> cache,
                         std::shared_ptr<CopyTarget> offload_to,
                         std::shared_ptr<RegionStatistics> statistics)
    : SelectiveMode(std::move(policy), std::move(cache), std::move(statistics)),
      offload_to_(std::move(offload_to)) {}

void CachingMode::on_outermost_enter() {
  TORCH_CHECK(cache_->empty(),
              "sac: this pair of selective checkpointing modes already filled "
              "its cache with the forward of a checkpointed region, whose recomputation still "
              "needs it. Create a new pair for each region: a context_fn should "
              "call create_selective_checkpoint_contexts each time it is called "
              "(or use CheckpointOptions::policy, which does).");
  cache_->begin_forward(/*track_producers=*/policy_.domain().tags);
  tagged_names_.clear();
  counts_ = RegionStatistics::Counts();
  storages_.clear();
  output_bytes_ = 0;
}

void CachingMode::on_outermost_exit() {
  report_untagged_names();
  cache_->end_forward();
  report_demotions();
  if (RegionEvents* events = region_events()) {
    events->outputs_kept(cache_->kept_calls() + cache_->demoted_calls());
  }
  if (statistics_ != nullptr) {
    add_statistics();
  }
  // Kept until backward: where the thread keeps such tensors (host memory,
  // under sac::OffloadGuard).
  if (TensorStash* stash = current_stash()) {
    cache_->stash(*stash);
  }
}

void CachingMode::intercept(const c10::OperatorHandle& op, c10::DispatchKeySet below,
                            torch::jit::Stack* stack) {
  const OpFacts facts = this->facts(op);
  if (facts.collective) {
    cache_->collectives().note(op, arguments_on(op, *stack));
  }
  counts_.collectives_issued += facts.communicates;
  if (!facts.decided) {
    run_op(op, below, stack);
    const auto outputs = outputs_on(op, *stack);
    cache_->watch_aliases(outputs);
    cache_->note_writes(op, outputs);
    return;
  }
  // The policy reads the arguments after the op ran, and an input may share
  // a saved output's storage (aten::_unsafe_view), to be watched: they
  // outlive the call.
  const auto args = arguments_on(op, *stack);
  const c10::SmallVector<c10::IValue, 4> inputs(args.begin(), args.end());
  std::optional<at::Generator> generator = facts.random ? explicit_generator(inputs) : std::nullopt;
  run_op(op, below, stack);
  const auto outputs = outputs_on(op, *stack);
  std::optional<GeneratorSnapshot> after =
      facts.random ? snapshot_after(std::move(generator), outputs) : std::nullopt;
  const SelectiveCheckpointContext ctx{/*is_recompute=*/false, outputs, cache_->calls_so_far(op)};
  const CheckpointPolicy answer = policy_.decide(ctx, op, inputs);
  if (facts.tag) {
    ++counts_.tags;
    apply_tag(inputs, answer);
    cache_->append_recompute(op);
    return;
  }
  ++counts_.calls_seen;
  if (statistics_ != nullptr) {
    count_bytes(outputs);
  }
  if (is_recompute(answer)) {
    cache_->watch_aliases(outputs);
    cache_->append_recompute(op, outputs, std::move(after));
    return;
  }
  if (facts.collective) {
    wait_for_collective(outputs);
  }
  if (policy_.domain().every_cacheable_op && mechanism_misses(op)) {
    warn_once("unseen " + c10::toString(op.operator_name()),
              c10::str("sac: the policy ", policy_.describe(), " answers ", to_string(answer),
                       " for ", op.operator_name(),
                       ", whose calls through the factory "
                       "functions (torch::zeros in C++, torch.zeros in Python, arange, "
                       "randn_like, ...) sac's per-op kernels never see: only its other "
                       "calls reach the policy. Use the fallback-key mechanism "
                       "(SAC_DISPATCH=fallback) to see every call. Reported once per op."));
  }
  cache_->append_kept(op, outputs, std::move(after), is_offload(answer) ? offload_to_ : nullptr);
  cache_->watch_aliases(inputs);
}

void CachingMode::apply_tag(c10::ArrayRef<c10::IValue> args, CheckpointPolicy answer) {
  const std::string& name = tag_name(args);
  tagged_names_.insert(name);
  const auto producer = cache_->producer_of(args[0].toTensor());
  if (!producer.has_value()) {
    return;  // not returned by an op of this region: nothing to keep
  }
  if (is_kept(answer) && !producer->kept) {
    const auto why_not = cache_->keep_late(*producer, is_offload(answer) ? offload_to_ : nullptr);
    if (why_not.has_value()) {
      warn_once("keep " + name, c10::str("sac: the policy ", policy_.describe(), " answers ",
                                         to_string(answer), " for the value tagged '", name,
                                         "', but the call of ", producer->op.operator_name(),
                                         " that returned it cannot be kept: ", *why_not,
                                         ". It is recomputed. Tag a value that is not modified in "
                                         "place after its op returned. Reported once per name."));
    }
  } else if (answer == CheckpointPolicy::MustRecompute && producer->kept) {
    cache_->recompute_late(*producer);
  }
}

void CachingMode::report_demotions() const {
  for (const OpCache::Demotion& demotion : cache_->demotions()) {
    const std::string writer =
        demotion.writer.has_value() ? c10::str("by ", *demotion.writer)
        : dispatch::mechanism() == dispatch::Mechanism::PerOpKernels
            ? std::string("by an op that sac's per-op kernels do not intercept "
                          "(SAC_DISPATCH=fallback names it)")
            : std::string("through an op whose schema does not declare the write");
    warn_once(c10::str("demoted ", demotion.op, " ", writer),
              c10::str("sac: the policy ", policy_.describe(), " kept the output of ", demotion.op,
                       " (call ", demotion.call_index,
                       " in the forward), which was then "
                       "modified in place ",
                       writer,
                       " before the checkpointed forward "
                       "ended; that call is recomputed instead, since serving the kept "
                       "value would give wrong gradients. Reported once per pair of ops."));
  }
}

void CachingMode::count_bytes(c10::ArrayRef<c10::IValue> outputs) {
  for (const auto& output : outputs) {
    for_each_tensor(output, [&](const at::Tensor& t) { output_bytes_ += storages_.meet(t); });
  }
}

void CachingMode::add_statistics() {
  const OpCache::Summary summary = cache_->summary();
  counts_.forwards = 1;
  counts_.calls_saved = summary.saved_calls;
  counts_.calls_offloaded = summary.offloaded_calls;
  // The cache enters each tag as a recompute call.
  counts_.calls_recomputed = summary.recompute_calls - counts_.tags;
  counts_.calls_demoted = cache_->demoted_calls();
  counts_.bytes_saved = static_cast<int64_t>(cache_->bytes());
  counts_.bytes_offloaded = summary.offloaded_bytes;
  counts_.bytes_dropped = output_bytes_ - counts_.bytes_saved - counts_.bytes_offloaded;
  statistics_->add(counts_);
  storages_.clear();
}

void CachingMode::report_untagged_names() const {
  for (const auto& name : policy_.domain().names) {
    if (tagged_names_.count(name) == 0) {
      warn_once("untagged " + name,
                c10::str("sac: the policy ", policy_.describe(), " asks for the name '", name,
                         "', but no sac::tag(..., \"", name,
                         "\") ran in the "
                         "forward of the checkpointed region it governs, so nothing is "
                         "kept by that name. Check the spelling, and that the tag runs "
                         "inside the region (in a nested selective region, the inner "
                         "region's policy decides). Reported once per name."));
    }
  }
}

// ---- CachedMode -------------------------------------------------------------

CachedMode::CachedMode(Policy policy, std::shared_ptr<OpCache> cache,
                       bool allow_cache_entry_mutation,
                       std::shared_ptr<RegionStatistics> statistics)
    : SelectiveMode(std::move(policy), std::move(cache), std::move(statistics)),
      allow_cache_entry_mutation_(allow_cache_entry_mutation) {}

void CachedMode::on_outermost_enter() {
  next_call_.clear();
  next_collective_.clear();
  pass_ = RegionStatistics::Counts();
  if (statistics_ != nullptr) {
    pass_started_ = std::chrono::steady_clock::now();
  }
  pass_graph_task_ = torch::autograd::get_current_graph_task_id();
  cache_->prefetch();
}

void CachedMode::on_outermost_exit() {
  // The pass is over: what it did not take, no later pass may (a region
  // with a policy is backwarded once), so it is freed now rather than with
  // the region.
  cache_->release_untaken();
  served_to_inner_backward_.clear();
  if (statistics_ == nullptr) {
    return;
  }
  pass_.recomputations = 1;
  pass_.recompute_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - pass_started_).count();
  statistics_->add(pass_);
}

void CachedMode::intercept(const c10::OperatorHandle& op, c10::DispatchKeySet below,
                           torch::jit::Stack* stack) {
  // A stopped recomputation whose stop a catch block swallowed runs no
  // further op (Note [Early stop cannot be swallowed]).
  throw_if_recomputation_stopped();
  // Checked whether served or run: a served call is the forward's call of
  // the same index, so a mismatch means the region took another path.
  const OpFacts facts = this->facts(op);
  if (facts.collective) {
    cache_->collectives().check(op, next_collective_[op_key(op)]++, arguments_on(op, *stack));
  }
  if (!facts.decided) {
    pass_.collectives_reissued += facts.communicates;
    run_op(op, below, stack);
    return;
  }
  const size_t call_index = next_call_[op_key(op)]++;
  if (!cache_->cached(op, call_index)) {
    pass_.collectives_reissued += facts.communicates;
    if (statistics_ != nullptr && !facts.tag) {
      ++pass_.calls_rerun;
    }
    run_op(op, below, stack);
    return;
  }
  ++pass_.calls_served;
  OpCache::Served served = cache_->take(op, call_index, allow_cache_entry_mutation_);
  torch::jit::drop(*stack, op.schema().arguments().size());
  // Note [Served inside a backward]: a backward inside the region (an inner
  // torch::autograd::grad, a custom Function's backward calling one) sums
  // gradients in place when nothing else holds them, and out of place when
  // something does: in the forward the cache held this output, so the
  // engine ran aten::add, and it must run aten::add again here, or the
  // region's later calls of add are served the wrong outputs. So the pass
  // holds what it serves to a backward inside it until it ends.
  const bool inner_backward = torch::autograd::get_current_graph_task_id() != pass_graph_task_;
  for (auto& output : served.outputs) {
    if (inner_backward) {
      served_to_inner_backward_.push_back(output);
    }
    stack->push_back(std::move(output));
  }
  if (served.generator.has_value()) {
    restore(std::move(*served.generator));
  }
}

}  // namespace sac::detail

namespace sac {

// ---- Factory ----------------------------------------------------------------

SelectiveCheckpointContexts create_selective_checkpoint_contexts(
    const Policy& policy, bool allow_cache_entry_mutation, std::shared_ptr<CopyTarget> offload_to,
    std::shared_ptr<RegionStatistics> statistics) {
  TORCH_CHECK(policy.checkpoints(), "sac: the policy ", policy.describe(),
              " leaves its region unchecked (a budgeted plan found that not checkpointing "
              "the region keeps fewer bytes than any checkpoint that recomputes less), so "
              "it has no selective checkpointing contexts. Run that region without "
              "checkpointing (BudgetedPlan::checkpointed says which; sac::checkpoint, "
              "sac::CheckpointRegion and Python's sac.context_fn do so themselves under "
              "this policy), or plan with every region checkpointed (unchecked_regions off).");
  policy.prepare_interception();
  // The caching mode watches these for in-place changes to cached values.
  detail::intercept_ops(detail::hidden_alias_ops());
  // Both modes track the collectives, whatever the policy decides about.
  detail::intercept_ops_matching(&detail::issues_collective);
  auto cache = std::make_shared<detail::OpCache>();
  if (offload_to == nullptr) {
    offload_to = host_memory();
  }
  return {std::make_shared<detail::CachingMode>(policy, cache, std::move(offload_to), statistics),
          std::make_shared<detail::CachedMode>(policy, cache, allow_cache_entry_mutation,
                                               std::move(statistics))};
}

}  // namespace sac

namespace sac::detail {

std::shared_ptr<OpCache> cache_of(const SelectiveCheckpointContexts& modes) {
  const auto* mode = dynamic_cast<const SelectiveMode*>(modes.caching.get());
  TORCH_INTERNAL_ASSERT(mode != nullptr,
                        "sac: cache_of() takes the modes of create_selective_checkpoint_contexts");
  return mode->shared_cache();
}

}  // namespace sac::detail
