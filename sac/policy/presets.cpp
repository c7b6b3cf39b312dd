#include <sac/policy/presets.h>

#include <sac/dispatch/internal/boxed.h>
#include <sac/policy/combinators.h>
#include <sac/policy/internal/op_traits.h>
#include <sac/policy/internal/answers.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace sac {
namespace {

// The registered, cacheable operators among `names` ("ns::op" for the
// default overload, "ns::op.overload" otherwise).
std::vector<c10::OperatorHandle> registered(const std::vector<std::string>& names) {
  std::vector<c10::OperatorHandle> ops;
  for (const auto& name : names) {
    const auto dot = name.find('.');
    const std::string base = name.substr(0, dot);
    const std::string overload = dot == std::string::npos ? "" : name.substr(dot + 1);
    auto op = c10::Dispatcher::singleton().findOp({base, overload});
    if (op.has_value() && detail::is_cacheable(*op)) {
      ops.push_back(*op);
    }
  }
  return ops;
}

// The same answer for every cacheable op.
class EveryOpRule final : public Policy::Rule {
 public:
  EveryOpRule(std::string name, CheckpointPolicy answer)
      : name_(std::move(name)), answer_(answer) {}
  CheckpointPolicy decide(const SelectiveCheckpointContext&, const c10::OperatorHandle&,
                          c10::ArrayRef<c10::IValue>) const override {
    return answer_;
  }
  Policy::Domain domain() const override {
    // Recomputing everything needs to see nothing.
    return detail::is_kept(answer_) ? Policy::Domain::every_cacheable() : Policy::Domain();
  }
  std::string describe() const override { return name_; }

 private:
  std::string name_;
  CheckpointPolicy answer_;
};

class LargerThanRule final : public Policy::Rule {
 public:
  explicit LargerThanRule(int64_t bytes) : bytes_(bytes) {}
  CheckpointPolicy decide(const SelectiveCheckpointContext& ctx, const c10::OperatorHandle&,
                          c10::ArrayRef<c10::IValue>) const override {
    int64_t total = 0;
    for (const auto& output : ctx.op_output) {
      detail::for_each_tensor(output, [&](const at::Tensor& t) {
        total += static_cast<int64_t>(t.nbytes());
      });
    }
    return total > bytes_ ? CheckpointPolicy::PreferSave : CheckpointPolicy::PreferRecompute;
  }
  Policy::Domain domain() const override { return Policy::Domain::every_cacheable(); }
  std::string describe() const override {
    return "outputs_larger_than(" + std::to_string(bytes_) + ")";
  }

 private:
  int64_t bytes_;
};

Policy preset(std::string name, const std::vector<std::string>& ops, CheckpointPolicy answer) {
  return Policy::answer_ops(registered(ops), answer, std::move(name));
}

const std::vector<std::string>& compute_intensive_names() {
  static const std::vector<std::string> names = {
      "aten::mm",
      "aten::bmm",
      "aten::addmm",
      "aten::baddbmm",
      "aten::_scaled_mm",
      "aten::convolution",
      "aten::_convolution",
      "aten::_scaled_dot_product_flash_attention",
      "aten::_scaled_dot_product_efficient_attention",
      "aten::_scaled_dot_product_cudnn_attention",
      "aten::_scaled_dot_product_flash_attention_for_cpu",
      "aten::_scaled_dot_product_fused_attention_overrideable",
      "aten::_flash_attention_forward",
      "aten::_efficient_attention_forward",
  };
  return names;
}

const std::vector<std::string>& no_batch_dot_names() {
  static const std::vector<std::string> names = {
      "aten::mm", "aten::addmm", "aten::mv", "aten::addmv", "aten::dot", "aten::vdot",
  };
  return names;
}

}  // namespace

Policy nothing_saveable() {
  return Policy(
      std::make_shared<EveryOpRule>("nothing_saveable", CheckpointPolicy::PreferRecompute));
}

Policy everything_saveable() {
  return Policy(std::make_shared<EveryOpRule>("everything_saveable", CheckpointPolicy::PreferSave));
}

Policy compute_intensive_ops() {
  return preset("compute_intensive_ops", compute_intensive_names(), CheckpointPolicy::MustSave);
}

Policy torchtitan_default() {
  std::vector<std::string> names = compute_intensive_names();
  names.insert(names.end(), {"aten::max", "aten::topk", "_c10d_functional::reduce_scatter_tensor",
                             "_c10d_functional::all_to_all_single"});
  return except(preset("torchtitan_save_list", names, CheckpointPolicy::MustSave),
                every_nth("aten::mm", 2));
}

Policy dots_saveable() {
  return preset("dots_saveable",
                {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm",
                 "aten::mv", "aten::addmv", "aten::dot", "aten::vdot", "aten::_scaled_mm"},
                CheckpointPolicy::PreferSave);
}

Policy dots_with_no_batch_dims_saveable() {
  return preset("dots_with_no_batch_dims_saveable", no_batch_dot_names(),
                CheckpointPolicy::PreferSave);
}

Policy offload_dot_with_no_batch_dims() {
  return preset("offload_dot_with_no_batch_dims", no_batch_dot_names(),
                CheckpointPolicy::PreferCpuOffload);
}

Policy outputs_larger_than(int64_t bytes) {
  return Policy(std::make_shared<LargerThanRule>(bytes));
}

Policy never_recompute_collectives() {
  return preset("never_recompute_collectives",
                {"_c10d_functional::all_reduce", "_c10d_functional::all_reduce_coalesced",
                 "_c10d_functional::all_gather_into_tensor",
                 "_c10d_functional::all_gather_into_tensor_coalesced",
                 "_c10d_functional::reduce_scatter_tensor",
                 "_c10d_functional::reduce_scatter_tensor_coalesced",
                 "_c10d_functional::all_to_all_single", "_c10d_functional::broadcast"},
                CheckpointPolicy::MustSave);
}

namespace {

// MustSave for the listed ops, and for copies from an accelerator to the host
// (aten::_to_copy whose input is on a device and whose output is on the CPU).
class ShapeDecidingRule final : public Policy::Rule {
 public:
  ShapeDecidingRule()
      : ops_(registered(shape_deciding_op_names())),
        to_copy_(c10::Dispatcher::singleton().findSchemaOrThrow("aten::_to_copy", "")) {}
  CheckpointPolicy decide(const SelectiveCheckpointContext& ctx, const c10::OperatorHandle& op,
                          c10::ArrayRef<c10::IValue> args) const override {
    if (op == to_copy_) {
      return copies_to_host(ctx, args) ? CheckpointPolicy::MustSave
                                       : CheckpointPolicy::PreferRecompute;
    }
    return std::find(ops_.begin(), ops_.end(), op) != ops_.end()
               ? CheckpointPolicy::MustSave
               : CheckpointPolicy::PreferRecompute;
  }
  Policy::Domain domain() const override {
    std::vector<c10::OperatorHandle> ops = ops_;
    ops.push_back(to_copy_);
    return Policy::Domain::listed(std::move(ops));
  }
  std::string describe() const override { return "shape_deciding_ops"; }

 private:
  static bool copies_to_host(const SelectiveCheckpointContext& ctx,
                             c10::ArrayRef<c10::IValue> args) {
    if (args.empty() || !args[0].isTensor() || args[0].toTensor().device().is_cpu()) {
      return false;
    }
    bool to_host = false;
    for (const auto& output : ctx.op_output) {
      detail::for_each_tensor(output, [&](const at::Tensor& t) {
        to_host = to_host || t.device().is_cpu();
      });
    }
    return to_host;
  }
  std::vector<c10::OperatorHandle> ops_;
  c10::OperatorHandle to_copy_;
};

}  // namespace

const std::vector<std::string>& shape_deciding_op_names() {
  static const std::vector<std::string> names = {
      // Which elements: indices and orders.
      "aten::topk", "aten::sort", "aten::sort.stable", "aten::argmax", "aten::argmin",
      "aten::max.dim", "aten::min.dim", "aten::kthvalue", "aten::mode", "aten::median.dim",
      "aten::nanmedian.dim", "aten::searchsorted.Tensor", "aten::bucketize.Tensor",
      "aten::multinomial",
      // How many: output sizes read from values.
      "aten::nonzero", "aten::masked_select", "aten::_unique", "aten::_unique2", "aten::unique_dim",
      "aten::unique_consecutive", "aten::unique_dim_consecutive", "aten::repeat_interleave.Tensor",
      "aten::bincount",
      // Which branch: values read on the host.
      "aten::_local_scalar_dense", "aten::equal", "aten::any", "aten::all"};
  return names;
}

Policy shape_deciding_ops() { return Policy(std::make_shared<ShapeDecidingRule>()); }

}  // namespace sac
