// The contexts a checkpointed region runs under: the contract of `context_fn`.
//
// This folder (sac/base/) holds what both sides of that contract stand on:
// the checkpoint (sac/checkpoint/) enters contexts without knowing what they
// do, and the selective modes (sac/cache/) are contexts without knowing what
// a checkpoint frame is.
//
// A checkpoint runs its function once under a *forward* context and, during
// backward, again under a *recompute* context (PyTorch's `context_fn` returns
// the same pair of context managers). sac's selective-checkpointing modes are
// one such pair; the checkpoint itself knows only this interface.
#pragma once

#include <functional>
#include <memory>

namespace sac {

// Something that is active on the current thread between `enter()` and
// `exit()`. Entries and exits on one thread nest (last in, first out); a
// context may be entered again after it was exited.
class RegionContext {
 public:
  virtual ~RegionContext() = default;
  virtual void enter() = 0;
  virtual void exit() = 0;
  // The checkpointed region's graph was freed (after backward, or dropped
  // without one): nothing will be recomputed any more, so whatever the
  // context keeps for the recomputation can go.
  virtual void release() {}

  // Enters a context (if not null) for the lifetime of the scope.
  class Scope {
   public:
    explicit Scope(RegionContext* context) : context_(context) {
      if (context_ != nullptr) {
        context_->enter();
      }
    }
    ~Scope() {
      if (context_ != nullptr) {
        context_->exit();
      }
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    RegionContext* context_;
  };
};

// The pair a `ContextFn` returns. Either may be null (no context).
struct RegionContexts {
  std::shared_ptr<RegionContext> forward;
  std::shared_ptr<RegionContext> recompute;
};

// Called once per region, before its forward.
using ContextFn = std::function<RegionContexts()>;

}  // namespace sac
