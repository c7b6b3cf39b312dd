// A named scope in the PyTorch profiler (as torch.profiler.record_function
// makes), for scopes whose start and end are not one C++ block: a
// checkpointed forward begins in one function and ends in another.
#pragma once

#include <ATen/record_function.h>

namespace sac::detail {

class ProfilerScope {
 public:
  // `name` must outlive the scope (a literal).
  explicit ProfilerScope(const char* name) : record_(at::RecordScope::USER_SCOPE) {
    if (record_.isActive()) {
      record_.before(name);
    }
  }
  ProfilerScope(const ProfilerScope&) = delete;
  ProfilerScope& operator=(const ProfilerScope&) = delete;

 private:
  at::RecordFunction record_;
};

}  // namespace sac::detail
