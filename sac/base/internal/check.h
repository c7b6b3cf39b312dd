// The check that raises sac::CheckpointError, for errors of recomputation,
// and the one place every CheckpointError is thrown from.
#pragma once

#include <sac/base/error.h>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

// TORCH_CHECK that throws sac::CheckpointError.
#define SAC_CHECKPOINT_CHECK(cond, ...)                                                   \
  if (C10_UNLIKELY_OR_CONST(!(cond))) {                                                   \
    ::sac::detail::throw_checkpoint_error(::sac::CheckpointError(                         \
        {__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, ::c10::str(__VA_ARGS__))); \
  }

namespace sac::detail {

// Note [CheckpointError in Python]
// PyTorch raises errors of recomputation as
// torch.utils.checkpoint.CheckpointError. sac's come out of torch's C++
// (the autograd engine, the dispatcher) into Python, where torch turns every
// c10::Error it does not know into RuntimeError. So the Python module installs
// a translator: given the error, it throws torch's python_error holding
// torch_sac.CheckpointError (a subclass of PyTorch's), which torch's Python
// stack frames carry unchanged. Without a translator (C++ programs), the error
// itself is thrown.

// Throws `error`, or what the translator makes of it. The translator must throw.
[[noreturn]] void throw_checkpoint_error(CheckpointError error);
using CheckpointErrorTranslator = void (*)(const CheckpointError& error);
void set_checkpoint_error_translator(CheckpointErrorTranslator translator);

// While one lives on this thread, throw_checkpoint_error throws the C++
// error untranslated: for code that catches a CheckpointError to add to it
// and throws again.
class UntranslatedCheckpointErrors {
 public:
  UntranslatedCheckpointErrors();
  ~UntranslatedCheckpointErrors();
  UntranslatedCheckpointErrors(const UntranslatedCheckpointErrors&) = delete;
  UntranslatedCheckpointErrors& operator=(const UntranslatedCheckpointErrors&) = delete;

 private:
  bool previous_;
};

}  // namespace sac::detail
