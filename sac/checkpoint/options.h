// Options of sac::checkpoint.
#pragma once

#include <sac/base/context.h>
#include <sac/base/copy_target.h>
#include <sac/cache/statistics.h>
#include <sac/policy/policy.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace sac {

// How a recomputation is checked against the forward.
enum class DeterminismCheck {
  // Each recomputed tensor that autograd saves must have the shape, dtype and
  // device it had in forward.
  Default,
  // No check.
  None,
  // Default, and each recomputed tensor that autograd saves must have the
  // values it had in forward, bit for bit: a checksum of each, taken on its
  // device as the forward saves it and compared as the recomputation saves
  // it again. The first that differs is an error naming the op that made it,
  // the op that saved it, and the region (name()): a write through
  // data_ptr() behind autograd's back, an op that draws from its own state,
  // a nondeterministic kernel, a router's top-k flipped by an ulp. Costs a
  // pass over each saved tensor in forward and in recomputation (and, on an
  // accelerator, one synchronization per device as the recomputation ends):
  // on in tests, and for a debugging run.
  Values,
};

// Setters return *this, so options read as one expression:
//   sac::CheckpointOptions().policy(p).debug(true)
class CheckpointOptions {
 public:
  // Selective checkpointing with `policy`: short for a context_fn that
  // returns create_selective_checkpoint_contexts(policy, ...) with the
  // options below. Without a policy (and without a context_fn) everything in
  // the region is recomputed.
  CheckpointOptions& policy(Policy policy) {
    policy_ = std::move(policy);
    return *this;
  }
  // Contexts to run the forward and the recomputation under (PyTorch's
  // context_fn). Exclusive with policy().
  CheckpointOptions& context_fn(ContextFn fn) {
    context_fn_ = std::move(fn);
    return *this;
  }
  // Restore the forward's RNG state (CPU and the inputs' accelerators) for the
  // recomputation. Default true.
  CheckpointOptions& preserve_rng_state(bool preserve) {
    preserve_rng_state_ = preserve;
    return *this;
  }
  CheckpointOptions& determinism_check(DeterminismCheck check) {
    determinism_check_ = check;
    return *this;
  }
  // The region's name in sac's errors ("blocks.3"); apply_activation_checkpointing
  // names each region it makes by its module's qualified name.
  CheckpointOptions& name(std::string name) {
    name_ = std::move(name);
    return *this;
  }
  // Log the ops of the forward and of each recomputation, and print both logs
  // when a recomputation fails its checks. Default false.
  CheckpointOptions& debug(bool debug) {
    debug_ = debug;
    return *this;
  }
  // With debug: capture a C++ backtrace for each logged op (slow).
  CheckpointOptions& debug_backtraces(bool backtraces) {
    debug_backtraces_ = backtraces;
    return *this;
  }
  // Check that the tensors the region reads but did not make (captured
  // buffers, parameters, globals) still hold, when the recomputation reads
  // them, the version the forward read: a modified one would silently change
  // the gradients (see Note [Watching tensors made outside]). Default true.
  // It observes every op of the region's forward and recomputation; turn it
  // off only for regions that never modify such tensors.
  CheckpointOptions& outside_tensor_check(bool check) {
    outside_tensor_check_ = check;
    return *this;
  }
  // Stop recomputing once every needed tensor is recomputed. Default true;
  // sac::EarlyStopGuard overrides it.
  CheckpointOptions& early_stop(bool early_stop) {
    early_stop_ = early_stop;
    return *this;
  }
  // With policy(): allow cached outputs to be modified in place after the
  // forward (no error; the modified values are used). Default false.
  CheckpointOptions& allow_cache_entry_mutation(bool allow) {
    allow_cache_entry_mutation_ = allow;
    return *this;
  }
  // With policy(): where the outputs the policy answers offload for go.
  // Default host_memory() (sac/base/copy_target.h).
  CheckpointOptions& offload_to(std::shared_ptr<CopyTarget> target) {
    offload_to_ = std::move(target);
    return *this;
  }
  // With policy(): count what the region does with its ops into
  // `statistics`, after its forward and after each recomputation
  // (sac/cache/statistics.h). Share one object among regions for their sum.
  CheckpointOptions& statistics(std::shared_ptr<RegionStatistics> statistics) {
    statistics_ = std::move(statistics);
    return *this;
  }

  const std::optional<Policy>& policy() const { return policy_; }
  const ContextFn& context_fn() const { return context_fn_; }
  bool preserve_rng_state() const { return preserve_rng_state_; }
  DeterminismCheck determinism_check() const { return determinism_check_; }
  const std::string& name() const { return name_; }
  bool debug() const { return debug_; }
  bool debug_backtraces() const { return debug_backtraces_; }
  bool outside_tensor_check() const { return outside_tensor_check_; }
  bool early_stop() const { return early_stop_; }
  const std::optional<bool>& allow_cache_entry_mutation() const {
    return allow_cache_entry_mutation_;
  }
  const std::shared_ptr<CopyTarget>& offload_to() const { return offload_to_; }
  const std::shared_ptr<RegionStatistics>& statistics() const { return statistics_; }

 private:
  std::optional<Policy> policy_;
  ContextFn context_fn_;
  bool preserve_rng_state_ = true;
  DeterminismCheck determinism_check_ = DeterminismCheck::Default;
  std::string name_;
  bool debug_ = false;
  bool debug_backtraces_ = false;
  bool outside_tensor_check_ = true;
  bool early_stop_ = true;
  std::optional<bool> allow_cache_entry_mutation_;
  std::shared_ptr<CopyTarget> offload_to_;
  std::shared_ptr<RegionStatistics> statistics_;
};

}  // namespace sac
