// One call in the op cache (sac/cache/internal/op_cache.h): its op, which of
// the op's calls it is, what became of it (recomputed, kept, served), and its
// outputs with their structure, each tensor in a slot (sac/cache/internal/slot.h).
//
// Most ops return tensors only, each defined: the slots are then the whole
// structure (plain). Otherwise the entry keeps the outputs with each tensor
// replaced by a placeholder, and hands out the same structure with the slots'
// tensors in place.
//
//   CacheEntry entry(op, /*index=*/0);
//   CacheEntry::Tensors tensors;
//   entry.shape(outputs, tensors);
//   entry.keep(tensors, /*offload_to=*/nullptr, storages);
//   std::vector<c10::IValue> served = entry.outputs(/*consume=*/true);
#pragma once

#include <sac/base/copy_target.h>
#include <sac/base/internal/stash.h>
#include <sac/cache/internal/cached_storages.h>
#include <sac/cache/internal/producers.h>
#include <sac/cache/internal/slot.h>

#include <ATen/core/Generator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sac::detail {

// A random generator together with its state right after a saved random op
// drew from it in forward. Serving the op's outputs restores that state, so
// the random ops recomputed after it draw the same numbers as in forward.
struct GeneratorSnapshot {
  at::Generator live;
  at::Generator state_after;
};

struct CacheEntry {
  CacheEntry(const c10::OperatorHandle& op, size_t index) : op(op), index(index) {}

  // Recompute: the recomputation runs the call (its slots, if any, hold the
  // outputs weakly for a late decision). Kept: the slots hold the outputs.
  // Served: handed out to the recomputation, or dropped unused after it.
  enum class State : uint8_t { Recompute, Kept, Served };

  using Tensors = c10::SmallVector<at::Tensor, 2>;
  // Records the structure of `outputs`, with a slot per defined tensor
  // (holding nothing yet); the defined tensors in order, in `tensors`.
  void shape(c10::ArrayRef<c10::IValue> outputs, Tensors& tensors);
  // Remembers `tensors` (one per slot, as shape gave them) weakly, with
  // their versions now: what a late keep needs.
  void hold_weakly(c10::ArrayRef<at::Tensor> tensors);
  // The tensors the call returned (see hold_weakly), if each is alive and
  // unmodified, through its own counter or an alias `producers` watches;
  // otherwise why not, and `tensors` is incomplete.
  std::optional<std::string> returned(const Producers& producers,
                                      std::vector<at::Tensor>& tensors) const;
  // Holds `tensors` (one per slot), moves those `offload_to` accepts there,
  // and is Kept from now on.
  void keep(c10::ArrayRef<at::Tensor> tensors, std::shared_ptr<CopyTarget> offload_to,
            CachedStorages& storages);

  // The outputs, each slot's tensor in its place (see Slot::tensor).
  std::vector<c10::IValue> outputs(bool consume);
  // The first slot whose tensor was modified since it was held, through its
  // own counter or another on its storage: its index and how; nullopt if none.
  std::optional<std::pair<size_t, std::string>> first_modified(
      const CachedStorages& storages) const;

  // Moves each output held on its device into `stash`.
  void stash(TensorStash& stash, CachedStorages& storages);
  // Starts copying each offloaded output back.
  void start_copy_back();
  bool offloaded() const;

  // Lets go of the outputs and their structure (the state stays).
  void drop(CachedStorages& storages);
  // Forgets the structure of a recompute call, whose slots hold nothing.
  void forget_structure();

  c10::OperatorHandle op;
  size_t index;  // among the op's calls in the forward
  State state = State::Recompute;
  bool plain = true;
  // Unless plain: the outputs, each tensor a placeholder, and per placeholder
  // whether it stands for a defined tensor (then in the next slot).
  c10::SmallVector<c10::IValue, 1> structure;
  c10::SmallVector<bool, 2> defined;
  c10::SmallVector<Slot, 1> slots;
  std::optional<GeneratorSnapshot> generator;
  std::shared_ptr<CopyTarget> target;  // of the offloaded slots
};

}  // namespace sac::detail
