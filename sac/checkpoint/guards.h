// Thread-local overrides of checkpoint options, as PyTorch's
// `set_checkpoint_early_stop` and `set_checkpoint_debug_enabled`.
#pragma once

#include <sac/checkpoint/options.h>

#include <optional>

namespace sac {

// While alive, checkpoints started on this thread use `enabled` as their
// early-stop setting, whatever their options say. Early stop ends a
// recomputation as soon as every tensor the backward needs is recomputed.
class EarlyStopGuard {
 public:
  explicit EarlyStopGuard(bool enabled);
  ~EarlyStopGuard();
  EarlyStopGuard(const EarlyStopGuard&) = delete;
  EarlyStopGuard& operator=(const EarlyStopGuard&) = delete;

 private:
  std::optional<bool> previous_;
};

// While alive, checkpoints started on this thread use `enabled` as their
// debug setting, whatever their options say.
class DebugGuard {
 public:
  explicit DebugGuard(bool enabled);
  ~DebugGuard();
  DebugGuard(const DebugGuard&) = delete;
  DebugGuard& operator=(const DebugGuard&) = delete;

 private:
  std::optional<bool> previous_;
};

// While alive, checkpoints started on this thread check their
// recomputation with `check`, whatever their options say: a debugging run
// under DeterminismCheck::Values, the code unchanged.
class DeterminismCheckGuard {
 public:
  explicit DeterminismCheckGuard(DeterminismCheck check);
  ~DeterminismCheckGuard();
  DeterminismCheckGuard(const DeterminismCheckGuard&) = delete;
  DeterminismCheckGuard& operator=(const DeterminismCheckGuard&) = delete;

 private:
  std::optional<DeterminismCheck> previous_;
};

namespace detail {
// The innermost guard's setting on this thread, if any.
std::optional<bool> early_stop_override();
std::optional<bool> debug_override();
std::optional<DeterminismCheck> determinism_check_override();
}  // namespace detail

}  // namespace sac
