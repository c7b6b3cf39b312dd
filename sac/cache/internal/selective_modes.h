// Note [The selective modes]
//
// The caching mode (forward) and the cached mode (recomputation) of selective
// activation checkpointing: how they work. Users make them with
// create_selective_checkpoint_contexts (sac/cache/selective_modes.h).
//
// Both are `RegionContext`s that, while entered, intercept the ops of their
// thread below autograd (sac/dispatch/internal/interceptor.h). For each cacheable op
// call (sac/policy/internal/op_traits.h):
//   * the caching mode runs the op, asks the policy (with the op's outputs,
//     as PyTorch 2.13 does), and enters the call in the shared `OpCache`:
//     its outputs if the policy said save, a copy of them in the offload
//     target if it said offload, else a recompute entry;
//   * the cached mode follows the forward's entry of the same call (same
//     op, same call index): it serves kept outputs from the cache without
//     running the op, and runs the op otherwise. Autograd above both modes
//     runs as usual, so the tensors it saves during recomputation match the
//     forward's in number and order.
// Ops the policy does not decide about (see Policy::decides_about: views,
// in-place ops, the ops PyTorch ignores, and for an op list every op not on
// it) always run and are never entered. That domain is the policy's alone,
// not the dispatch floor's: under per-op kernels, another policy may make sac
// intercept more ops after this region's forward ran, and the recomputation
// must still run the same calls again.
//
// Tags (sac/policy/tag.h): under a policy that asks about them, the caching
// mode applies a tag's answer to the entered call that returned the tagged
// tensor (sac/policy/names.h says how), and reports the names the policy
// mentions that the forward never tagged. Both modes treat tag calls as
// recomputed: a tag is the identity.
//
// Collectives (sac/cache/internal/collective_ledger.h): both modes see every
// functional collective, decided about or not. The caching mode notes each
// one the forward issues; the cached mode checks each one the recomputation
// reaches against the forward's, before it is issued or served. A collective
// the policy keeps is waited for before its outputs are cached (its work
// writes them in place when it completes), is served in recomputation and
// never communicates again; one it recomputes (or does not decide about) is
// issued again, in the forward's order.
//
// Random ops: a saved random op draws nothing when it is served, so its
// generator is set to the state it had right after the op in forward;
// everything recomputed after it draws the forward's numbers.
//
// Statistics (sac/cache/statistics.h): given a RegionStatistics, the caching
// mode adds its forward's counts when the forward ends, and the cached mode
// each recomputation's when it ends.
#pragma once

#include <sac/base/context.h>
#include <sac/base/internal/pointer_map.h>
#include <sac/cache/internal/new_storages.h>
#include <sac/cache/internal/op_cache.h>
#include <sac/cache/selective_modes.h>
#include <sac/cache/statistics.h>
#include <sac/dispatch/internal/boxed.h>
#include <sac/dispatch/internal/interceptor.h>
#include <sac/policy/policy.h>

#include <chrono>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

namespace sac::detail {

// What both modes share: a policy, a cache, and interception of the thread's
// ops while entered. Entries nest; the outermost entry and exit are where a
// mode starts and finishes its pass.
class SelectiveMode : public RegionContext, protected detail::OpInterceptor {
 public:
  void enter() override;
  void exit() override;
  // Empties the (shared) cache: the region's graph is gone.
  void release() override { cache_->clear(); }
  const OpCache& cache() const { return *cache_; }
  const std::shared_ptr<OpCache>& shared_cache() const { return cache_; }

 protected:
  SelectiveMode(Policy policy, std::shared_ptr<OpCache> cache,
                std::shared_ptr<RegionStatistics> statistics)
      : policy_(std::move(policy)), cache_(std::move(cache)), statistics_(std::move(statistics)) {}
  virtual void on_outermost_enter() {}
  virtual void on_outermost_exit() {}

  // What both modes ask about an op on each of its calls, asked once per op
  // and mode: a policy and an op's traits never change.
  struct OpFacts {
    bool decided;       // the policy decides about it (Policy::decides_about)
    bool collective;    // it issues a functional collective (detail::issues_collective)
    bool communicates;  // any collective, c10d's own included (detail::communicates)
    bool tag;           // sac::tag
    bool random;        // it draws from a generator (detail::is_random)
  };
  OpFacts facts(const c10::OperatorHandle& op) {
    if (const OpFacts* known = facts_.find(detail::op_key(op))) {
      return *known;
    }
    return learn(op);
  }
  OpFacts learn(const c10::OperatorHandle& op);

  Policy policy_;
  std::shared_ptr<OpCache> cache_;
  std::shared_ptr<RegionStatistics> statistics_;  // null: not counting

 private:
  std::vector<detail::InterceptorToken> entries_;
  PointerMap<OpFacts> facts_;  // by detail::op_key
};

class CachingMode final : public SelectiveMode {
 public:
  // Offload answers copy outputs to `offload_to`. Counts into `statistics`
  // if not null.
  CachingMode(Policy policy, std::shared_ptr<OpCache> cache, std::shared_ptr<CopyTarget> offload_to,
              std::shared_ptr<RegionStatistics> statistics = nullptr);

 private:
  // Refuses to fill a cache that holds a forward already; starts filling
  // it.
  void on_outermost_enter() override;
  // Ends filling (see OpCache::end_forward), counts it, and moves the
  // outputs kept into the thread's stash if it has one (sac/base/internal/stash.h).
  void on_outermost_exit() override;
  void intercept(const c10::OperatorHandle& op, c10::DispatchKeySet below,
                 torch::jit::Stack* stack) override;
  // Applies the policy's `answer` for a tag call with `args` to the call
  // that returned the tagged tensor.
  void apply_tag(c10::ArrayRef<c10::IValue> args, CheckpointPolicy answer);
  // Warns about the names the policy mentions that this forward never
  // tagged (once per name and process).
  void report_untagged_names() const;
  // Warns about the kept calls the cache demoted because their outputs
  // were modified in place (once per pair of ops and process): which op's
  // output, changed by which op.
  void report_demotions() const;
  // With statistics: adds the bytes of the storages among a decided call's
  // `outputs` that no earlier decided call returned.
  void count_bytes(c10::ArrayRef<c10::IValue> outputs);
  // Adds this forward's counts to the statistics.
  void add_statistics();

  std::shared_ptr<CopyTarget> offload_to_;
  std::unordered_set<std::string> tagged_names_;
  RegionStatistics::Counts counts_;  // this forward's, so far
  NewStorages storages_;             // with statistics: returned by decided calls
  int64_t output_bytes_ = 0;
};

class CachedMode final : public SelectiveMode {
 public:
  CachedMode(Policy policy, std::shared_ptr<OpCache> cache, bool allow_cache_entry_mutation,
             std::shared_ptr<RegionStatistics> statistics = nullptr);

 private:
  // Each pass runs again from the first call, and starts bringing offloaded
  // outputs back at once.
  void on_outermost_enter() override;
  // Adds the pass's counts to the statistics.
  void on_outermost_exit() override;
  void intercept(const c10::OperatorHandle& op, c10::DispatchKeySet below,
                 torch::jit::Stack* stack) override;

  bool allow_cache_entry_mutation_;
  PointerMap<size_t> next_call_;        // by detail::op_key
  PointerMap<size_t> next_collective_;  // by detail::op_key
  RegionStatistics::Counts pass_;       // this pass's, so far
  std::chrono::steady_clock::time_point pass_started_;
  // The backward pass this recomputation runs in, and what it served to a
  // backward inside it, held until it ends (Note [Served inside a backward]).
  int64_t pass_graph_task_ = -1;
  std::vector<c10::IValue> served_to_inner_backward_;
};

// The cache a pair of modes shares: what the lab and the tests read.
std::shared_ptr<OpCache> cache_of(const SelectiveCheckpointContexts& modes);

}  // namespace sac::detail
