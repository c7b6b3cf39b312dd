// What sac's RecordFunction callbacks (the value check's origins, the reads
// of in-place ops under per-op kernels) need to know of the op behind a
// RecordFunction: looked up once per op and process, then by name pointer
// on each thread (an op's name is its schema's, stable while it is
// registered; a pointer whose name changed is looked up again).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>

#include <optional>
#include <string>
#include <vector>

namespace sac::detail {

struct RecordedOp {
  std::string name;
  std::optional<c10::OperatorHandle> handle;  // none: not an op (a user's scope)
  bool view = false;                          // makes no values (a view, set_)
  bool uninitialized = false;                 // returns memory it does not write (aten::empty)
  bool writes_argument = false;               // in-place or out= by its schema
  bool random = false;                        // draws from a generator (detail::is_random)
  // Arguments that hold state the op updates whatever its schema says (a
  // batch norm's running_mean and running_var): values that any run of such
  // an op, in any region or recomputation, may have changed.
  std::vector<size_t> state_arguments;
};

// Interned: never freed, so what keeps one may name it anywhere, later.
const RecordedOp* recorded_op(const at::RecordFunction& fn);

}  // namespace sac::detail
