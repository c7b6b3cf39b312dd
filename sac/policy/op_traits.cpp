#include <sac/policy/internal/op_traits.h>

#include <sac/dispatch/internal/boxed.h>

#include <ATen/core/enum_tag.h>

#include <array>
#include <sstream>
#include <string>
#include <unordered_map>

namespace sac::detail {
namespace {

// torch.utils.checkpoint.SAC_IGNORED_OPS in PyTorch 2.13.
constexpr std::array<std::pair<const char*, const char*>, 15> kIgnoredOpNames{{
    {"aten::detach", ""},
    {"prim::device", ""},
    {"aten::dim", ""},
    {"aten::is_contiguous", ""},
    {"aten::is_contiguous", "memory_format"},
    {"aten::is_non_overlapping_and_dense", ""},
    {"aten::is_strides_like_format", ""},
    {"aten::numel", ""},
    {"aten::size", ""},
    {"aten::storage_offset", ""},
    {"aten::stride", ""},
    {"aten::sym_numel", ""},
    {"aten::sym_size", ""},
    {"aten::sym_storage_offset", ""},
    {"aten::sym_stride", ""},
}};

const std::vector<c10::OperatorHandle>& ignored_ops() {
  static const std::vector<c10::OperatorHandle> ops = detail::registered_ops(kIgnoredOpNames);
  return ops;
}

// True if `op` decomposes above autograd for dense tensors. The dispatcher
// prefers a CompositeImplicitAutograd kernel to an `Autograd` alias kernel
// whenever the op has no backend kernel (aten::linear has an Autograd kernel,
// for nested tensors, and still decomposes on dense ones).
bool decomposes_above_autograd(const c10::OperatorHandle& op) {
  using c10::DispatchKey;
  if (!op.hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd)) {
    return false;
  }
  for (const auto key :
       {DispatchKey::CPU, DispatchKey::CUDA, DispatchKey::CompositeExplicitAutograd,
        DispatchKey::CompositeExplicitAutogradNonFunctional, DispatchKey::AutogradCPU,
        DispatchKey::AutogradCUDA}) {
    if (op.hasKernelForDispatchKey(key)) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool is_ignored(const c10::OperatorHandle& op) {
  for (const auto& ignored : ignored_ops()) {
    if (ignored == op) {
      return true;
    }
  }
  return false;
}

const std::vector<c10::OperatorHandle>& hidden_alias_ops() {
  static const std::vector<c10::OperatorHandle> ops{
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::_unsafe_view", "")};
  return ops;
}

std::optional<std::string> why_never_cached(const c10::OperatorHandle& op) {
  if (is_ignored(op)) {
    return "PyTorch's selective checkpointing ignores it (detach, prim::device "
           "and the tensor metadata ops run a different number of times in "
           "forward and recomputation)";
  }
  if (!op.hasSchema()) {
    return "it has no schema registered yet";
  }
  const auto& schema = op.schema();
  if (schema.is_mutable()) {
    return "it mutates an input (an in-place or out= op); such ops are always "
           "recomputed";
  }
  if (is_view(op)) {
    return "it is a view (its output aliases an input); views are always "
           "recomputed";
  }
  if (decomposes_above_autograd(op)) {
    return "it is CompositeImplicitAutograd: it decomposes into other ops above "
           "autograd and never reaches selective checkpointing. Name the ops it "
           "decomposes into instead (for example aten::linear runs aten::addmm "
           "or aten::mm, aten::scaled_dot_product_attention runs "
           "aten::_scaled_dot_product_flash_attention_for_cpu on CPU)";
  }
  return std::nullopt;
}

bool is_cacheable(const c10::OperatorHandle& op) {
  thread_local std::unordered_map<c10::OperatorHandle, bool> memo;
  auto it = memo.find(op);
  if (it == memo.end()) {
    it = memo.emplace(op, !why_never_cached(op).has_value()).first;
  }
  return it->second;
}

}  // namespace sac::detail
