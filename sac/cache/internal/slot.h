// One tensor among the outputs of a call an OpCache holds an entry for, and where it
// is now: not kept (a recompute call's output, held weakly while a late
// decision may still keep it), kept on its device (a detached alias),
// stashed (sac/base/internal/stash.h), or offloaded (the copy in the call's
// target, and its copy back once started). Placement is the slot's job; the
// storages' accounting is CachedStorages'.
#pragma once

#include <sac/base/copy_target.h>
#include <sac/base/internal/stash.h>
#include <sac/base/internal/version_watch.h>
#include <sac/cache/internal/cached_storages.h>

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <memory>
#include <optional>

namespace sac::detail {

struct Slot {
  explicit Slot(const at::Tensor& t) : version(t) {}

  // Holds `t` on its device.
  void hold(const at::Tensor& t, CachedStorages& storages);
  // Moves the held tensor into `target`, whose copy the slot keeps.
  void offload(CopyTarget& target, CachedStorages& storages);
  // Moves the held tensor into `stash`, whose hooks the slot keeps.
  void stash(TensorStash& stash, CachedStorages& storages);
  // Starts copying an offloaded tensor back (once): see CopyTarget.
  void start_copy_back(CopyTarget& target);
  // The slot's tensor on its device: the held one (moved out if `consume`,
  // else a new alias), the stash's, the copy back started, or one copied
  // back from `target` now.
  at::Tensor tensor(bool consume, CopyTarget* target);
  // Lets go of the tensor, wherever it is.
  void release(CachedStorages& storages);

  bool offloaded() const { return copy.defined(); }

  VersionWatch version;                       // the output's own counter, since the op returned
  const c10::StorageImpl* storage = nullptr;  // its key in the storages, if any
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> returned;
  at::Tensor held;
  std::unique_ptr<torch::autograd::SavedVariableHooks> stashed;
  at::Tensor copy;
  CopyTarget::Origin from;
  std::unique_ptr<CopyTarget::Incoming> incoming;

 private:
  void unhold(CachedStorages& storages);
};

}  // namespace sac::detail
