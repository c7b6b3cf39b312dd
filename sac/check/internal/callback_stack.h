// A thread's nested scopes that watch its ops through one RecordFunction
// callback.
//
// A thread-local RecordFunction callback costs every op of the thread while
// it is installed, so it is added when the thread's first scope opens and
// removed when its last closes; scopes nest (a region inside a region), and
// the callback reads the stack of what they watch for.
//
//   std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn);
//   thread_local CallbackStack<Log*> logs(at::RecordFunctionCallback(&on_start));
//   logs.push(&log);  // ... ops ...  logs.pop();
#pragma once

#include <ATen/record_function.h>

#include <utility>
#include <vector>

namespace sac::detail {

template <class Item>
class CallbackStack {
 public:
  explicit CallbackStack(at::RecordFunctionCallback callback) : callback_(std::move(callback)) {}
  CallbackStack(const CallbackStack&) = delete;
  CallbackStack& operator=(const CallbackStack&) = delete;

  // What the open scopes watch for, innermost last.
  const std::vector<Item>& items() const { return items_; }

  void push(Item item) {
    if (items_.empty()) {
      handle_ = at::addThreadLocalCallback(callback_);
    }
    items_.push_back(std::move(item));
  }

  void pop() {
    items_.pop_back();
    if (items_.empty()) {
      at::removeCallback(handle_);
      handle_ = at::INVALID_CALLBACK_HANDLE;
    }
  }

 private:
  at::RecordFunctionCallback callback_;
  std::vector<Item> items_;
  at::CallbackHandle handle_ = at::INVALID_CALLBACK_HANDLE;
};

}  // namespace sac::detail
