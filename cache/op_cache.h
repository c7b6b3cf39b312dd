// The outputs a selective-checkpointing forward keeps for its recomputation.
//
// Mirrors the storage of PyTorch's SAC: for each op, its calls in forward
// order, each either *saved* (its outputs, kept as detached aliases) or marked
// *recompute*. The recomputation addresses a call by (op, call index), so the
// forward's decisions replay exactly. The cache knows nothing of checkpoint
// frames or policies; it holds values and checks that they are still the
// values that were stored.
#pragma once

#include <sac/region/version_watch.h>

#include <ATen/core/Generator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
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

  // Turns saved calls whose outputs were modified in place since they were
  // stored into recompute calls (dropping the outputs): their cached value is
  // no longer what the op returned, but the recomputation will redo both the
  // op and the modification. Called when the forward ends. Warns (once per
  // process) when it demotes anything: the policy then saves less than it
  // says.
  void demote_modified();

  // ---- Recomputation ------------------------------------------------------

  // What the forward did with one call.
  struct Record {
    // The policy's answer in forward was save. Still true for a call whose
    // outputs were demoted (see demote_modified): the policy is not to blame.
    bool policy_saved = false;
    // Its outputs are (or were, until taken) in the cache; otherwise the
    // recomputation runs the op.
    bool cached = false;
  };

  // The record of call `call` of `op`. Throws if the forward made no such
  // call.
  Record record(const c10::OperatorHandle& op, size_t call) const;

  struct Served {
    std::vector<c10::IValue> outputs;
    std::optional<GeneratorSnapshot> generator;
  };

  // Hands out the outputs of saved call `call` of `op`, once. Throws if they
  // were already handed out (a second backward through the region), or if a
  // tensor among them was modified in place since it was stored and
  // `allow_mutation` is false.
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
  // Saved calls turned into recompute calls by demote_modified.
  size_t demoted_calls() const { return demoted_calls_; }

 private:
  struct Call {
    enum class State : uint8_t { Recompute, Saved, Served };
    State state = State::Recompute;
    bool policy_saved = false;
    std::vector<c10::IValue> outputs;
    std::vector<VersionWatch> versions;  // one per tensor in outputs, in order
    std::optional<GeneratorSnapshot> generator;
  };

  const Call& find(const c10::OperatorHandle& op, size_t call) const;
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

  std::unordered_map<const c10::StorageImpl*, StorageInfo> storages_;
  size_t bytes_ = 0;
  size_t saved_calls_ = 0;
  size_t demoted_calls_ = 0;
};

}  // namespace sac
