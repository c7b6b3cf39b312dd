// What a checkpointed region's frame is made of, from its options: shared by
// sac::checkpoint and sac::CheckpointRegion.
#pragma once

#include <sac/checkpoint/internal/frame.h>
#include <sac/checkpoint/options.h>

namespace sac::detail {

// The frame's settings: the options, with the thread's EarlyStopGuard and
// DebugGuard applied.
FrameConfig frame_config(const CheckpointOptions& options);

// The forward and recompute contexts: the selective modes of the policy, or
// what the context_fn returns, or none. Throws on options that contradict
// each other.
RegionContexts contexts_for(const CheckpointOptions& options);

}  // namespace sac::detail
