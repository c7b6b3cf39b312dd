// Runs a recording (recording.h) again, below autograd.
#pragma once

#include <sac/record/internal/recording.h>

#include <functional>
#include <vector>

namespace sac::detail {

// Receives the value of each Mark instruction, in order: `mark` counts them from 0.
// It may throw to end the replay (an early stop).
using MarkSink = std::function<void(size_t mark, const at::Tensor& value)>;

// Replays the instructions `recording` has when it is called (a region still
// recording replays what it recorded so far), with autograd and
// ADInplaceOrView excluded: no graph is built, no version counter moves.
//
// `outside` holds the tensors of the Outside instructions kept as SavedVariables,
// by index, unpacked by the caller (undefined for those with a copy).
// Calls recorded as intercepted reach the interceptor active on the thread
// (sac/dispatch/internal/interceptor.h: call_op), as in the forward they reached the
// region's; other calls and the instructions' own work are seen by nothing.
//
// A value is kept from the instruction that makes it to the last instruction that reads
// it, so the replay holds no more than the forward held of the same values.
// Throws a c10::Error if a replayed op returns other tensors than it did.
//
// A recording that communicates agrees with the other ranks first
// (Communication::agree); `agreements`, if given, is set to how many exchanges
// that made before any instruction runs, so an early stop keeps the count.
void replay(const Recording& recording, std::vector<at::Tensor> outside, const MarkSink& on_mark,
            size_t* agreements = nullptr);

}  // namespace sac::detail
