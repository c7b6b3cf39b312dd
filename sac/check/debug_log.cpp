#include <sac/check/internal/debug_log.h>

#include <sac/check/internal/callback_stack.h>

#include <ATen/record_function.h>
#include <c10/util/Backtrace.h>

namespace sac::detail {
namespace {

struct ActiveLog {
  OpLog* log;
  bool backtraces;
};

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn);

thread_local CallbackStack<ActiveLog> tls_logs(
    at::RecordFunctionCallback(&on_op_start).scopes({at::RecordScope::FUNCTION}));

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  if (tls_logs.items().empty()) {
    return nullptr;
  }
  const ActiveLog& active = tls_logs.items().back();
  active.log->append(fn.name(),
                     active.backtraces ? c10::get_backtrace(/*frames_to_skip=*/2) : std::string());
  return nullptr;
}

}  // namespace

std::atomic<size_t> OpLog::live_entries_{0};

void OpLog::append(std::string op, std::string backtrace) {
  entries_.push_back({std::move(op), std::move(backtrace)});
  live_entries_.fetch_add(1);
}

void OpLog::clear() {
  live_entries_.fetch_sub(entries_.size());
  entries_.clear();
}

std::string OpLog::ops() const {
  std::string out;
  for (const auto& entry : entries_) {
    out += entry.op + "\n";
  }
  return out;
}

std::string OpLog::backtraces(const std::string& label) const {
  std::string out;
  for (size_t i = 0; i < entries_.size(); ++i) {
    out += entries_[i].op + "   (" + std::to_string(i + 1) + " of " +
           std::to_string(entries_.size()) + " in " + label + ")\n" + entries_[i].backtrace + "\n";
  }
  return out;
}

OpLogScope::OpLogScope(OpLog& log, bool backtraces) { tls_logs.push({&log, backtraces}); }

OpLogScope::~OpLogScope() { tls_logs.pop(); }

}  // namespace sac::detail
