#include <sac/lab/internal/flops.h>

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace sac::detail {
namespace {

using Shape = c10::IntArrayRef;
using Formula = std::function<int64_t(c10::ArrayRef<c10::IValue>, c10::ArrayRef<c10::IValue>)>;

Shape shape(const c10::IValue& value) { return value.toTensor().sizes(); }

int64_t product(Shape sizes, size_t from = 0) {
  int64_t p = 1;
  for (size_t i = from; i < sizes.size(); ++i) {
    p *= sizes[i];
  }
  return p;
}

// (m, k) @ (k, n).
int64_t mm(Shape a, Shape b) { return 2 * a[0] * a[1] * b[1]; }

// (b, m, k) @ (b, k, n).
int64_t bmm(Shape a, Shape b) { return 2 * a[0] * a[1] * a[2] * b[2]; }

// flop_counter's conv_flop_count: each point of the output (of the input
// when transposed) meets the whole filter, for every batch item.
int64_t convolution(Shape x, Shape w, Shape out, bool transposed) {
  const Shape spatial = transposed ? x : out;
  return 2 * product(spatial, 2) * product(w) * x[0];
}

// Two batched products: the query against the keys, the scores against the
// values; grouped-query heads broadcast to the query's.
int64_t attention(Shape q, Shape k, Shape v) {
  const int64_t batch = q[0] * q[1];
  return 2 * batch * q[2] * q[3] * k[2] + 2 * batch * q[2] * k[2] * v[3];
}

const std::unordered_map<std::string_view, Formula>& formulas() {
  static const auto* table = [] {
    auto* t = new std::unordered_map<std::string_view, Formula>();
    (*t)["aten::mm"] = [](auto args, auto) { return mm(shape(args[0]), shape(args[1])); };
    (*t)["aten::addmm"] = [](auto args, auto) { return mm(shape(args[1]), shape(args[2])); };
    (*t)["aten::_scaled_mm"] = (*t)["aten::mm"];
    (*t)["aten::bmm"] = [](auto args, auto) { return bmm(shape(args[0]), shape(args[1])); };
    (*t)["aten::baddbmm"] = [](auto args, auto) { return bmm(shape(args[1]), shape(args[2])); };
    // (input, weight, bias, stride, padding, dilation, transposed, ...)
    const Formula conv = [](auto args, auto outputs) {
      return convolution(shape(args[0]), shape(args[1]), shape(outputs[0]), args[6].toBool());
    };
    for (const char* name :
         {"aten::convolution", "aten::_convolution", "aten::convolution_overrideable"}) {
      (*t)[name] = conv;
    }
    // (self, weight, padding, stride, dilation, groups, benchmark, ...): never
    // transposed (flop_counter reads its `benchmark` flag as `transposed`).
    (*t)["aten::cudnn_convolution"] = [](auto args, auto outputs) {
      return convolution(shape(args[0]), shape(args[1]), shape(outputs[0]), false);
    };
    const Formula sdpa = [](auto args, auto) {
      return attention(shape(args[0]), shape(args[1]), shape(args[2]));
    };
    for (const char* name : {"aten::_scaled_dot_product_flash_attention",
                             "aten::_scaled_dot_product_efficient_attention",
                             "aten::_scaled_dot_product_cudnn_attention",
                             "aten::_scaled_dot_product_flash_attention_for_cpu"}) {
      (*t)[name] = sdpa;
    }
    return t;
  }();
  return *table;
}

const Formula* formula_of(const c10::OperatorHandle& op) {
  const auto& table = formulas();
  auto found = table.find(op.operator_name().name);
  return found == table.end() ? nullptr : &found->second;
}

}  // namespace

bool counts_flops(const c10::OperatorHandle& op) { return formula_of(op) != nullptr; }

int64_t flops_of(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                 c10::ArrayRef<c10::IValue> outputs) {
  const Formula* formula = formula_of(op);
  return formula == nullptr ? 0 : (*formula)(args, outputs);
}

}  // namespace sac::detail
