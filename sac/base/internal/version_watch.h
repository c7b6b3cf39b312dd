// Has a tensor been modified in place since a moment we remember?
//
// Every in-place op bumps its tensor's version counter, which views share.
// Both the cache (are the outputs it keeps still what the op returned?) and
// the checkpoint (are the tensors a recomputation reads still what the
// forward read?) answer the question the same way: remember the counter and
// its value, compare later. A watch keeps only the counter (a few bytes), not
// the tensor or its storage.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include <cstdint>
#include <cstring>

namespace sac::detail {

// The identity of a version counter: equal for tensors that share one
// (a tensor and its views), distinct otherwise, stable while the counter
// lives. Null for tensors without a counter (inference tensors).
// c10::VariableVersion exposes no identity, but is one intrusive pointer.
inline const void* version_counter_identity(const c10::VariableVersion& counter) {
  static_assert(sizeof(c10::VariableVersion) == sizeof(void*),
                "c10::VariableVersion is expected to hold one pointer");
  const void* identity = nullptr;
  std::memcpy(&identity, static_cast<const void*>(&counter), sizeof(identity));
  return identity;
}

class VersionWatch {
 public:
  // Watches `t`'s version counter from its current version on. `t` must be
  // defined; a tensor without a counter gives a watch that never fires.
  explicit VersionWatch(const at::Tensor& t)
      : counter_(t.unsafeGetTensorImpl()->version_counter()),
        version_(counter_.enabled() ? counter_.current_version() : 0) {}

  bool changed() const { return counter_.enabled() && counter_.current_version() != version_; }
  uint32_t version() const { return version_; }
  uint32_t current_version() const { return counter_.enabled() ? counter_.current_version() : 0; }
  const void* identity() const { return version_counter_identity(counter_); }
  // Watches from the counter's current version on.
  void rebase() { version_ = current_version(); }

 private:
  c10::VariableVersion counter_;
  uint32_t version_;
};

}  // namespace sac::detail
