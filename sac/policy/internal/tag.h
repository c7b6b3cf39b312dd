// Note [The tag operator]
//
// The operator behind sac::tag, as the floors that ask about names see it.
#pragma once

#include <sac/policy/tag.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <string>

namespace sac::detail {

// The operator sac::tag calls.
const c10::OperatorHandle& tag_op();

inline bool is_tag(const c10::OperatorHandle& op) { return op == tag_op(); }

// The name a sac::tag call was given, from its boxed arguments.
inline const std::string& tag_name(c10::ArrayRef<c10::IValue> args) {
  return args[1].toStringRef();
}

}  // namespace sac::detail
