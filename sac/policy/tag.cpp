#include <sac/policy/tag.h>
#include <sac/policy/internal/tag.h>

#include <ATen/core/op_registration/op_registration.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

namespace sac {
namespace {

using TagSignature = at::Tensor(const at::Tensor&, c10::string_view);

// Below autograd the tag is the identity: whatever intercepts it there has
// seen it by the time this runs.
at::Tensor tag_value(const at::Tensor& self, c10::string_view) { return self; }

// Autograd sees the identity too, with no node: the tag returns `self`
// itself. It still goes down once, with the autograd keys masked out, so that
// sac's interception (below autograd, on ADInplaceOrView or the fallback
// key) sees the call and its name.
at::Tensor tag_autograd(c10::DispatchKeySet ks, const at::Tensor& self, c10::string_view name) {
  static const auto op = detail::tag_op().typed<TagSignature>();
  op.redispatch(ks & c10::after_autograd_keyset, self, name);
  return self;
}

}  // namespace

TORCH_LIBRARY(sac, m) {
  m.def("tag(Tensor(a) self, str name) -> Tensor(a)");
  m.impl("tag", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(tag_value));
  m.impl("tag", c10::DispatchKey::Autograd, TORCH_FN(tag_autograd));
}

const c10::OperatorHandle& detail::tag_op() {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("sac::tag", "");
  return op;
}

at::Tensor tag(const at::Tensor& t, std::string_view name) {
  TORCH_CHECK(t.defined(), "sac::tag(\"", name,
              "\") got an undefined tensor; "
              "tag the tensor an op returned.");
  TORCH_CHECK(!name.empty(), "sac::tag got an empty name; give the value a name "
                             "that a name policy (sac/policy/names.h) can refer to.");
  static const auto op = detail::tag_op().typed<TagSignature>();
  return op.call(t, c10::string_view(name.data(), name.size()));
}

}  // namespace sac
