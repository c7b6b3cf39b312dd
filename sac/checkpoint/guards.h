// Thread-local overrides of two checkpoint options, as PyTorch's
// `set_checkpoint_early_stop` and `set_checkpoint_debug_enabled`.
#pragma once

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

namespace detail {
// The innermost guard's setting on this thread, if any.
std::optional<bool> early_stop_override();
std::optional<bool> debug_override();
}  // namespace detail

}  // namespace sac
