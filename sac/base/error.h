// The error checkpointing raises when a checkpointed region cannot be
// recomputed faithfully.
#pragma once

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

namespace sac {

// Derived from c10::Error, so `catch (const c10::Error&)` sees it too.
class CheckpointError : public c10::Error {
 public:
  using c10::Error::Error;
};

}  // namespace sac

// TORCH_CHECK that throws sac::CheckpointError.
#define SAC_CHECKPOINT_CHECK(cond, ...)                                    \
  if (C10_UNLIKELY_OR_CONST(!(cond))) {                                    \
    throw ::sac::CheckpointError(                                          \
        {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},             \
        ::c10::str(__VA_ARGS__));                                          \
  }
