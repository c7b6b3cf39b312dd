// The outputs a selective-checkpointing forward keeps for its recomputation.
//
// Mirrors the storage of PyTorch's SAC: for each op, its calls in forward
// order, each either *saved* (its outputs, kept as detached aliases) or marked
// *recompute*. The recomputation addresses a call by (op, call index), so the
// forward's decisions replay exactly. The cache knows nothing of checkpoint
// frames or policies; it holds values and checks that they are still the
// values that were stored.
#pragma once

#include <sac/region/stash.h>
#include <sac/region/version_watch.h>

#include <ATen/core/Generator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace sac {

// A random generator together with its state right after a saved random op
// drew from it in forward. Serving the op's outputs restores that state, so
// the random ops recomputed after it draw the same numbers as in forward.
struct GeneratorSnapshot {
  at::Generator live;
  at::Generator state_after;
};

class OpCache {
 public:
  OpCache() = default;
  OpCache(const OpCache&) = delete;
  OpCache& operator=(const OpCache&) = delete;

  // ---- Forward ------------------------------------------------------------

  // The forward records from begin_recording() to end_recording(). A
  // recomputation may run in between: a backward inside the checkpointed
  // function recomputes the region so far. It replays the record so far as
  // a prefix: calls past its end run, saved outputs are handed out but kept
  // for the backward after the forward, and outputs already modified run
  // again (end_recording will demote them).
  void begin_recording();
  // Ends the forward: demotes saved calls whose outputs were modified in
  // place since they were stored to recompute calls (dropping the outputs):
  // their cached value is no longer what the op returned, but the
  // recomputation will redo both the op and the modification. Warns (once
  // per process) when it demotes anything: the policy then saves less than
  // it says.
  void end_recording();

  // Moves the outputs of every saved call into `stash` (after
  // end_recording): the cache keeps the stash's hooks instead, and take()
  // gets the outputs back from them. The cache holds no storage any more
  // (bytes() is 0); in-place changes to the stored tensors are still caught.
  void stash(TensorStash& stash);

  // Records that the next call of `op` will be recomputed.
  void append_recompute(const c10::OperatorHandle& op);

  // Records the next call of `op` as saved: keeps a detached alias of each
  // tensor in `outputs` (same storage and version counter, no autograd
  // history) with its version now; other values are kept as they are.
  void append_saved(const c10::OperatorHandle& op,
                    c10::ArrayRef<c10::IValue> outputs,
                    std::optional<GeneratorSnapshot> generator);

  // Watches the tensors among `values` that share storage with a cached
  // tensor: an op such as aten::_unsafe_view returns a tensor on its input's
  // storage with a version counter of its own, so an in-place op on one
  // (LibTorch's C++ linear adds its bias that way) modifies the other without
  // changing its version. The caching mode passes the outputs of every op the
  // forward runs, and the inputs of every op it saves.
  void watch_aliases(c10::ArrayRef<c10::IValue> values);

  // ---- Recomputation ------------------------------------------------------

  // What the forward did with one call.
  struct Record {
    // The policy's answer in forward was save. Still true for a call whose
    // outputs were demoted (see end_recording): the policy is not to blame.
    bool policy_saved = false;
    // Its outputs are (or were, until taken) in the cache; otherwise the
    // recomputation runs the op.
    bool cached = false;
    // False for a call past the end of a forward still recording.
    bool recorded = true;
  };

  // The record of call `call` of `op`. Throws if the forward made no such
  // call (and is not recording any more).
  Record record(const c10::OperatorHandle& op, size_t call) const;

  struct Served {
    std::vector<c10::IValue> outputs;
    std::optional<GeneratorSnapshot> generator;
  };

  // Hands out the outputs of saved call `call` of `op`, once (any number of
  // times while recording). Throws if they were already handed out (a second
  // backward through the region), or if a tensor among them was modified in
  // place since it was stored and `allow_mutation` is false.
  Served take(const c10::OperatorHandle& op, size_t call, bool allow_mutation);

  // Drops every call and the outputs it kept.
  void clear();
  // No call recorded (or all cleared).
  bool empty() const { return calls_.empty(); }

  // ---- Accounting ---------------------------------------------------------

  // Bytes of tensor storage the cache keeps alive (each storage counted
  // once, however many cached tensors share it).
  size_t bytes() const { return bytes_; }
  // Saved calls whose outputs have not been handed out yet.
  size_t saved_calls() const { return saved_calls_; }
  // Saved calls turned into recompute calls by end_recording.
  size_t demoted_calls() const { return demoted_calls_; }

 private:
  struct Call {
    enum class State : uint8_t { Recompute, Saved, Served };
    State state = State::Recompute;
    bool policy_saved = false;
    std::vector<c10::IValue> outputs;
    std::vector<VersionWatch> versions;  // one per tensor in outputs, in order
    std::optional<GeneratorSnapshot> generator;
    // After stash(): the tensors of `outputs` are placeholders; these hooks,
    // one per tensor slot (null for an undefined tensor), hold them, and
    // these watches are those of the storages they were on.
    std::vector<std::unique_ptr<torch::autograd::SavedVariableHooks>> stashed;
    std::vector<VersionWatch> storage_watches;
    bool is_stashed = false;
  };

  // The call, or null for one past the end of a forward still recording.
  const Call* find(const c10::OperatorHandle& op, size_t call) const;
  void demote_modified();
  void hold(const std::vector<c10::IValue>& outputs);
  void release(const std::vector<c10::IValue>& outputs);
  void drop(Call& call);

  std::unordered_map<c10::OperatorHandle, std::vector<Call>> calls_;
  // Per storage held by the cache.
  struct StorageInfo {
    size_t refs = 0;    // cached tensors using it
    size_t nbytes = 0;  // its size when first held
    // Every version counter known on it, one watch each: the cached tensors'
    // own and their aliases' (see watch_aliases). A change through any of
    // them changes the memory every cached tensor on it reads.
    std::vector<VersionWatch> watches;
  };
  void watch(StorageInfo& info, const at::Tensor& t);

  // The first tensor of `call` modified since it was stored: its index and
  // how, or nullopt.
  std::optional<std::pair<size_t, std::string>> first_modified(const Call& call) const;
  std::optional<std::pair<size_t, std::string>> first_modified_stashed(const Call& call) const;
  // The outputs of a stashed call, back from its hooks.
  std::vector<c10::IValue> unstash(Call& call);

  std::unordered_map<const c10::StorageImpl*, StorageInfo> storages_;
  bool recording_ = false;
  size_t bytes_ = 0;
  size_t saved_calls_ = 0;
  size_t demoted_calls_ = 0;
};

}  // namespace sac
