// Note [Resolving op names]
//
// Turning op names written by people into operators, strictly.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <string_view>
#include <vector>

namespace sac::detail {

// Resolves one op name to the operators it denotes. Accepted forms:
//   "aten::mm"            the default overload (same as "aten::mm.default");
//                         a name whose only overload is not the default one
//                         denotes that overload;
//   "aten::add.Tensor"    one overload;
//   "aten::add.*"         every overload (explicit, never implied).
// Custom namespaces work the same ("myops::fused.default").
// Throws a c10::Error that says what to write instead when the name is
// malformed, unknown (with the closest registered names) or, without an
// overload, ambiguous (with the list of overloads).
std::vector<c10::OperatorHandle> resolve_op_name(std::string_view name);

// The registered op names closest to `name` (edit distance), best first.
std::vector<std::string> closest_op_names(std::string_view name, size_t count);

}  // namespace sac::detail
