#include <sac/policy/presets.h>

#include <sac/dispatch/internal/boxed.h>
#include <sac/policy/combinators.h>
#include <sac/policy/internal/op_traits.h>

#include <ATen/core/dispatch/Dispatcher.h>

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
    if (op.has_value() && policy::is_cacheable(*op)) {
      ops.push_back(*op);
    }
  }
  return ops;
}

// The same answer for every cacheable op.
class EveryOpRule final : public Policy::Rule {
 public:
  EveryOpRule(std::string name, CheckpointPolicy answer) : name_(std::move(name)), answer_(answer) {}
  CheckpointPolicy decide(const SelectiveCheckpointContext&, const c10::OperatorHandle&,
                          c10::ArrayRef<c10::IValue>) const override {
    return answer_;
  }
  OpDomain domain() const override {
    // Recomputing everything needs to see nothing.
    return is_kept(answer_) ? OpDomain::every_cacheable() : OpDomain();
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
      dispatch::for_each_tensor(output, [&](const at::Tensor& t) {
        total += static_cast<int64_t>(t.nbytes());
      });
    }
    return total > bytes_ ? CheckpointPolicy::PreferSave : CheckpointPolicy::PreferRecompute;
  }
  OpDomain domain() const override { return OpDomain::every_cacheable(); }
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
  return Policy(std::make_shared<EveryOpRule>("nothing_saveable", CheckpointPolicy::PreferRecompute));
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

}  // namespace sac
