// The error checkpointing raises when a checkpointed region cannot be
// recomputed faithfully.
#pragma once

#include <c10/util/Exception.h>

namespace sac {

// Derived from c10::Error, so `catch (const c10::Error&)` sees it too.
class CheckpointError : public c10::Error {
 public:
  using c10::Error::Error;
};

}  // namespace sac
