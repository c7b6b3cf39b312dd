// Selective activation checkpointing's two contexts: PyTorch's
// create_selective_checkpoint_contexts.
//
// The caching mode runs around the forward: for each op call the policy
// decides about, it asks the policy and keeps the call's outputs (save), a
// copy of them in the offload target (offload), or nothing (recompute). The
// cached mode runs around the recomputation: it serves the kept outputs
// without running their ops and runs the others, so autograd above it saves
// the same tensors as in the forward. Both intercept the thread's ops below
// autograd; Note [The selective modes] says how.
#pragma once

#include <sac/base/context.h>
#include <sac/base/copy_target.h>
#include <sac/cache/statistics.h>
#include <sac/policy/policy.h>

#include <memory>

namespace sac {

// The two modes, sharing one cache (Note [The op cache]). Converts to the `RegionContexts` that a
// `ContextFn` returns; each mode can also be entered on its own with a
// `RegionContext::Scope`. One pair serves one checkpointed region: a context_fn
// should create a new pair per region, as PyTorch's does.
struct SelectiveCheckpointContexts {
  std::shared_ptr<RegionContext> caching;  // around the forward
  std::shared_ptr<RegionContext> cached;   // around the recomputation

  operator RegionContexts() const { return {caching, cached}; }
};

// PyTorch's create_selective_checkpoint_contexts. Also makes sure the ops the
// policy is asked about are intercepted (per-op kernels are registered now).
// Offload answers go to `offload_to` (default: host_memory()). Both modes
// count into `statistics` if it is not null.
SelectiveCheckpointContexts create_selective_checkpoint_contexts(
    const Policy& policy, bool allow_cache_entry_mutation = false,
    std::shared_ptr<CopyTarget> offload_to = nullptr,
    std::shared_ptr<RegionStatistics> statistics = nullptr);

}  // namespace sac
