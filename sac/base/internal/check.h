// The check that raises sac::CheckpointError, for errors of recomputation.
#pragma once

#include <sac/base/error.h>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

// TORCH_CHECK that throws sac::CheckpointError.
#define SAC_CHECKPOINT_CHECK(cond, ...)                                    \
  if (C10_UNLIKELY_OR_CONST(!(cond))) {                                    \
    throw ::sac::CheckpointError(                                          \
        {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},             \
        ::c10::str(__VA_ARGS__));                                          \
  }
