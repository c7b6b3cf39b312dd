// Note [The op cache]
//
// The outputs a selective-checkpointing forward keeps for its recomputation.
//
// Mirrors the storage of PyTorch's SAC: for each op, its calls in forward
// order, each either *kept* (its outputs, as detached aliases) or marked
// *recompute*. The recomputation addresses a call by (op, call index), so the
// forward's decisions are followed exactly. The cache knows nothing of checkpoint
// frames or policies; it holds values and checks that they are still the
// values that were stored. It orders the work of its parts: which entry is
// which call (CallTable), each call's outputs and what became of them
// (CacheEntry), where each kept tensor is (Slot, which also moves it to a
// copy target or a stash and back), the storages under them
// (CachedStorages: bytes and version counters), and, for late decisions,
// which call returned each storage (Producers).
#pragma once

#include <sac/base/copy_target.h>
#include <sac/base/internal/stable_vector.h>
#include <sac/base/internal/stash.h>
#include <sac/cache/internal/cache_entry.h>
#include <sac/cache/internal/call_table.h>
#include <sac/cache/internal/cached_storages.h>
#include <sac/cache/internal/collective_ledger.h>
#include <sac/cache/internal/producers.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sac::detail {

class OpCache {
 public:
  OpCache() = default;
  OpCache(const OpCache&) = delete;
  OpCache& operator=(const OpCache&) = delete;

  // ---- Forward ------------------------------------------------------------

  // The forward fills the cache from begin_forward() to end_forward(). A
  // recomputation may run in between: a backward inside the checkpointed
  // function recomputes the region so far. It follows the entries so far as
  // a prefix: calls past its end run, kept outputs are handed out but stay
  // for the backward after the forward, and outputs already modified run
  // again (end_forward will demote them).
  //
  // With `track_producers`, the cache also remembers which call returned
  // each tensor it enters, recompute calls included (their outputs held
  // weakly), so that a later decision can change a call's answer until the
  // forward ends: see producer_of.
  void begin_forward(bool track_producers = false);
  // Ends the forward: demotes kept calls whose outputs were modified in
  // place since they were stored to recompute calls (dropping the outputs):
  // their cached value is no longer what the op returned, but the
  // recomputation will redo both the op and the modification. demotions()
  // lists them: the policy then saves less than it says.
  void end_forward();

  // Notes the ops that write their outputs in place (returns the schema
  // marks as written, such as add_'s self) on a kept output's storage: the
  // first of them is what a demotion reports as the modification.
  void note_writes(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> outputs) {
    if (!storages_.empty()) {  // inline: most ops of most regions stop here
      note_writes_on_kept(op, outputs);
    }
  }

  // A kept call that end_forward demoted: its op, which call of it in the
  // forward, and the op that first wrote its output in place, if one was
  // seen (per-op kernels see only the ops they intercept).
  struct Demotion {
    c10::OperatorName op;
    size_t call_index = 0;
    std::optional<c10::OperatorName> writer;
  };
  const std::vector<Demotion>& demotions() const { return demotions_; }

  // Moves the outputs of every kept call into `stash` (after
  // end_forward): the cache keeps the stash's hooks instead, and take()
  // gets the outputs back from them. The cache holds no storage any more
  // (bytes() is 0); in-place changes to the stored tensors are still caught.
  void stash(TensorStash& stash);

  // Enters the next call of `op` as recomputed. While tracking
  // producers, `outputs` (held weakly) and `generator` are what keep_late
  // needs to keep the call after all; otherwise they are not kept.
  void append_recompute(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> outputs = {},
                        std::optional<GeneratorSnapshot> generator = std::nullopt);

  // Enters the next call of `op` as kept: keeps a detached alias of each
  // tensor in `outputs` (same storage and version counter, no autograd
  // history) with its version now; other values are kept as they are. With
  // `offload_to`, each tensor it accepts is copied there now and its alias
  // dropped, so the device memory goes as soon as the forward is done with
  // it; a tensor it does not accept is saved instead.
  void append_kept(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> outputs,
                   std::optional<GeneratorSnapshot> generator,
                   std::shared_ptr<CopyTarget> offload_to = nullptr);

  // The number of calls of `op` entered so far: the index of the next one.
  size_t calls_so_far(const c10::OperatorHandle& op) const;

  // Watches the tensors among `values` that share storage with a cached
  // tensor: an op such as aten::_unsafe_view returns a tensor on its input's
  // storage with a version counter of its own, so an in-place op on one
  // (LibTorch's C++ linear adds its bias that way) modifies the other without
  // changing its version. The caching mode passes the outputs of every op the
  // forward runs, and the inputs of every op it saves.
  void watch_aliases(c10::ArrayRef<c10::IValue> values) {
    if (!storages_.empty() || !producers_.empty()) {  // as note_writes
      watch_aliases_of_known(values);
    }
  }

  // ---- Late decisions (while filling, tracking producers) ----------------

  // A call in the cache that returned a tensor, and whether it is kept now.
  struct Producer {
    c10::OperatorHandle op;
    size_t call_index;
    bool kept;
  };

  // The call whose outputs `t` is on (the same storage: an output, or a view
  // or reshape of one), if this forward entered it; nullopt for tensors
  // made before it or by ops it did not enter.
  std::optional<Producer> producer_of(const at::Tensor& t) const;

  // Keeps recompute call `producer` after all, as append_kept would have
  // (offloading what `offload_to` accepts). It cannot when one of its
  // outputs was modified in place since the op returned, or was freed (the
  // cache holds the outputs of the latest call entered until the next one
  // is entered, and only weak references to older ones): then the call
  // stays recomputed and the reason is returned.
  std::optional<std::string> keep_late(const Producer& producer,
                                       std::shared_ptr<CopyTarget> offload_to);

  // Recomputes kept call `producer` after all, dropping its outputs.
  void recompute_late(const Producer& producer);

  // ---- Recomputation ------------------------------------------------------

  // Whether the outputs of call `call_index` of `op` are (or were, until taken) in
  // the cache; otherwise the recomputation runs the op. False for a call past
  // the end of a forward still filling. Throws if the forward made no such
  // call (and is not filling any more).
  bool cached(const c10::OperatorHandle& op, size_t call_index) const;

  // Starts copying every offloaded output back to its device, so that the
  // copies overlap with the work queued before the recomputation reaches
  // them. take() waits for them.
  void prefetch();

  struct Served {
    std::vector<c10::IValue> outputs;
    std::optional<GeneratorSnapshot> generator;
  };

  // Hands out the outputs of kept call `call_index` of `op`, once (any number of
  // times while filling). Throws if they were already handed out (a second
  // backward through the region), or if a tensor among them was modified in
  // place since it was stored and `allow_mutation` is false.
  Served take(const c10::OperatorHandle& op, size_t call_index, bool allow_mutation);

  // Drops the outputs of the kept calls not handed out, after a
  // recomputation that stopped early (sac/checkpoint: once every tensor
  // autograd saved is made again): no later pass may take them, since a
  // region with a policy is backwarded once. Does nothing while filling.
  void release_untaken();

  // Drops every call and the outputs it kept, the collectives noted and the
  // demotions: empty, as new.
  void clear();
  // No call entered (or all cleared).
  bool empty() const { return calls_.empty(); }

  // The collectives the forward issued (sac/cache/internal/collective_ledger.h),
  // whether or not the policy decides about them. Emptied by
  // begin_forward() and clear().
  CollectiveLedger& collectives() { return collectives_; }

  // ---- Accounting ---------------------------------------------------------

  // Bytes of tensor storage the cache keeps alive on the outputs' devices
  // (each storage counted once, however many cached tensors share it).
  // Offloaded and stashed outputs are not counted: the target and the
  // stash hold those.
  size_t bytes() const { return storages_.bytes(); }
  // Kept calls whose outputs have not been handed out yet.
  size_t kept_calls() const { return kept_calls_; }
  // Kept calls turned into recompute calls by end_forward.
  size_t demoted_calls() const { return demotions_.size(); }

  // The calls entered by what became of them, after end_forward and
  // before stash() (sac/cache/statistics.h counts with it).
  struct Summary {
    size_t saved_calls = 0;      // every output still on its device
    size_t offloaded_calls = 0;  // kept, an output offloaded
    size_t recompute_calls = 0;
    // Device bytes of the offloaded outputs' storages that no output saved
    // on its device holds (each counted once).
    int64_t offloaded_bytes = 0;
  };
  Summary summary() const;

 private:
  using Entry = CacheEntry;
  // The entry of call `call_index` of `op`, or null for a recompute call without
  // one. Sets `known` to false (and returns null) for one past the end of
  // a forward still filling; throws past the end of a finished forward.
  const Entry* find(const c10::OperatorHandle& op, size_t call_index, bool& known) const;
  Entry* find(const c10::OperatorHandle& op, size_t call_index, bool& known) {
    return const_cast<Entry*>(std::as_const(*this).find(op, call_index, known));
  }
  // A new entry for the next call of `op`.
  Entry& add(const c10::OperatorHandle& op);
  void note_writes_on_kept(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> outputs);
  void watch_aliases_of_known(c10::ArrayRef<c10::IValue> values);
  // Forgets what only late decisions needed.
  void stop_tracking();
  void demote_modified();
  // Drops kept `call`'s outputs; it is `now` from then on.
  void drop(Entry& call, Entry::State now);

  CallTable calls_;
  StableVector<Entry> entries_;  // the entries, in the order entered
  CachedStorages storages_;
  Producers producers_;  // while tracking producers
  bool track_producers_ = false;
  bool filling_ = false;
  size_t kept_calls_ = 0;
  std::vector<Demotion> demotions_;
  CollectiveLedger collectives_;
};

}  // namespace sac::detail
