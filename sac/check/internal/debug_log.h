// The op logs of checkpoint's debug option.
//
// With debug on, a checkpoint logs the ops its forward runs and the ops each
// recomputation runs, and prints both when the recomputation turns out to
// differ from the forward. Logging uses thread-local RecordFunction callbacks:
// it sees every op called through the dispatcher, whatever dispatch
// mechanism sac's modes use. A log belongs to one checkpoint frame and dies
// with it, so debug logging neither leaks nor slows down over iterations.
#pragma once

#include <atomic>
#include <string>
#include <vector>

namespace sac::detail {

class OpLog {
 public:
  struct Entry {
    std::string op;
    std::string backtrace;  // empty unless backtraces were asked for
  };

  OpLog() = default;
  ~OpLog() { clear(); }
  OpLog(const OpLog&) = delete;
  OpLog& operator=(const OpLog&) = delete;

  void append(std::string op, std::string backtrace);
  void clear();
  const std::vector<Entry>& entries() const { return entries_; }

  // One op name per line.
  std::string ops() const;
  // Each op with its backtrace, numbered "(i of n in `label`)".
  std::string backtraces(const std::string& label) const;

  // Entries held by all logs in the process (for tests of leaks).
  static size_t live_entries() { return live_entries_.load(); }

 private:
  std::vector<Entry> entries_;
  static std::atomic<size_t> live_entries_;
};

// While alive, ops called on this thread are appended to `log` (the
// innermost scope's log only).
class OpLogScope {
 public:
  OpLogScope(OpLog& log, bool backtraces);
  ~OpLogScope();
  OpLogScope(const OpLogScope&) = delete;
  OpLogScope& operator=(const OpLogScope&) = delete;
};

}  // namespace sac::detail
