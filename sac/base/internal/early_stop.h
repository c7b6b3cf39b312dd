// Note [Early stop cannot be swallowed]
//
// A recomputation ends early, once every tensor its region saved is
// recomputed, by throwing StopRecomputation out of the hook that saved the
// last one; the recomputation's frame catches it. It must be a
// std::exception: when the region runs a backward of its own
// (torch::autograd::grad inside it), the hook throws from inside that nested
// backward, and the autograd engine cleans up (and hands the exception to
// its caller) only for a std::exception. So code in the region that catches
// std::exception (or everything) catches it too, and so sac's errors of
// recomputation (CheckpointError), which must reach the user. The end of a
// pass is therefore sticky: once a pass stops or fails, every op sac
// intercepts in it and every tensor autograd saves in it throws the same
// again, until the pass unwinds to its frame. A catch block that swallows it
// stops at its next op instead of running on into ops the forward never ran
// (and the user sees sac's first error, not the one that follows from it).
#pragma once

#include <sac/base/error.h>

#include <exception>
#include <optional>

namespace sac::detail {

struct StopRecomputation final : std::exception {
  const char* what() const noexcept override {
    return "sac: recomputation stopped early (every saved tensor is recomputed); this "
           "exception is internal to sac's checkpoints: a catch block in a checkpointed region "
           "must rethrow it";
  }
};

// Stops the innermost recomputation on this thread: marks it, and throws.
[[noreturn]] void stop_recomputation();

// Marks the innermost recomputation on this thread, if any, as failed with
// `error` (throw_checkpoint_error calls it; the first error is kept).
void note_recomputation_error(const CheckpointError& error);

// Throws again what ended the innermost recomputation on this thread, if it
// stopped or failed (and something caught that).
void throw_if_recomputation_stopped();

// One recomputation pass on this thread, innermost first.
class RecomputationScope {
 public:
  RecomputationScope();
  ~RecomputationScope();
  RecomputationScope(const RecomputationScope&) = delete;
  RecomputationScope& operator=(const RecomputationScope&) = delete;

 private:
  friend void stop_recomputation();
  friend void note_recomputation_error(const CheckpointError& error);
  friend void throw_if_recomputation_stopped();
  RecomputationScope* outer_;
  bool stopped_ = false;
  std::optional<CheckpointError> failed_;
};

}  // namespace sac::detail
