#include <sac/dispatch/internal/op_facts.h>

#include <sac/dispatch/internal/boxed.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/enum_tag.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

namespace sac::detail {
namespace {

// Ops whose arguments 3 and 4 (running_mean, running_var) are written when
// argument 5 (training) is true, though their schema does not say so.
const std::vector<c10::OperatorHandle>& legacy_batch_norms() {
  static const std::vector<c10::OperatorHandle> ops = registered_ops({
      {"aten::native_batch_norm", ""},
      {"aten::native_batch_norm", "out"},
      {"aten::cudnn_batch_norm", ""},
      {"aten::cudnn_batch_norm", "out"},
      {"aten::miopen_batch_norm", ""},
      {"aten::miopen_batch_norm", "out"},
  });
  return ops;
}

// How ops whose schemas do not declare what they write write their
// arguments: c10d's ops on a ProcessGroup (c10d::_allgather_base_ takes a
// plain `Tensor output_tensor`) write their output arguments whole and
// `tensors` in place (allreduce_, broadcast_; send only reads it); FSDP2's
// fsdp::all_gather_copy_in copies this rank's shard into its
// all_gather_output, whose other bytes only the all-gather that follows
// writes: whole, as far as any reader can tell.
enum class UndeclaredWrite { None, Whole, InPlace, NotThisOp };

UndeclaredWrite undeclared_write(const c10::OperatorHandle& op, size_t index) {
  const std::string& name = op.operator_name().name;
  const std::string& argument = op.schema().arguments()[index].name();
  if (name.rfind("c10d::", 0) == 0) {
    if (argument.rfind("output", 0) == 0) {
      return UndeclaredWrite::Whole;
    }
    return argument == "tensors" && name != "c10d::send" ? UndeclaredWrite::InPlace
                                                         : UndeclaredWrite::None;
  }
  if (name == "fsdp::all_gather_copy_in") {
    return argument == "all_gather_output" ? UndeclaredWrite::Whole : UndeclaredWrite::None;
  }
  return UndeclaredWrite::NotThisOp;
}

// One argument of a collective as collective_signature writes it: nothing in
// it may differ between the ranks of a group that issue the same call (no
// addresses, no tensor data).
void describe_argument(std::ostringstream& out, const c10::IValue& arg) {
  if (arg.isTensor()) {
    const at::Tensor& t = arg.toTensor();
    out << (t.defined() ? c10::str(t.scalar_type(), t.sizes()) : std::string("undefined"));
  } else if (arg.isList()) {
    out << "[";
    for (const c10::IValue& element : arg.toListRef()) {
      describe_argument(out, element);
      out << " ";
    }
    out << "]";
  } else if (arg.isString()) {
    out << arg.toStringRef();
  } else if (arg.isObject()) {  // a ProcessGroup, a ReduceOp: its class
    out << arg.type()->str();
  } else {
    out << arg;
  }
}

}  // namespace

// ---- Writes and reads -------------------------------------------------------

bool writes_argument(const c10::OperatorHandle& op, size_t index, c10::ArrayRef<c10::IValue> args) {
  const auto* alias = op.schema().arguments()[index].alias_info();
  if (alias != nullptr) {
    return alias->isWrite();
  }
  if (index != 3 && index != 4) {
    return false;
  }
  const auto& legacy = legacy_batch_norms();
  return std::find(legacy.begin(), legacy.end(), op) != legacy.end() && args.size() > 5 &&
         args[5].isBool() && args[5].toBool();
}

bool overwrites_argument(const c10::OperatorHandle& op, size_t index) {
  const c10::Argument& argument = op.schema().arguments()[index];
  if (argument.is_out()) {
    return true;
  }
  static const std::unordered_set<std::string> names{
      "aten::copy_",      "aten::fill_",   "aten::zero_",      "aten::normal_",
      "aten::uniform_",   "aten::random_", "aten::bernoulli_", "aten::exponential_",
      "aten::geometric_", "aten::cauchy_", "aten::log_normal_"};
  return index == 0 && argument.alias_info() != nullptr && argument.alias_info()->isWrite() &&
         names.count(op.operator_name().name) != 0;
}

bool writes_argument_declared_or_not(const c10::OperatorHandle& op, size_t index,
                                     c10::ArrayRef<c10::IValue> args) {
  const UndeclaredWrite undeclared = undeclared_write(op, index);
  return undeclared == UndeclaredWrite::NotThisOp ? writes_argument(op, index, args)
                                                  : undeclared != UndeclaredWrite::None;
}

bool reads_argument(const c10::OperatorHandle& op, size_t index) {
  const UndeclaredWrite undeclared = undeclared_write(op, index);
  if (undeclared != UndeclaredWrite::NotThisOp) {
    return undeclared != UndeclaredWrite::Whole;
  }
  const c10::Argument& argument = op.schema().arguments()[index];
  const auto* alias = argument.alias_info();
  if (alias == nullptr) {
    return true;
  }
  return alias->isWrite() && !overwrites_argument(op, index);
}

bool declares_a_write(const c10::OperatorHandle& op) {
  for (const c10::Argument& argument : op.schema().arguments()) {
    if (argument.alias_info() != nullptr && argument.alias_info()->isWrite()) {
      return true;
    }
  }
  return false;
}

// ---- Aliases, memory, draws and communication -------------------------------

bool is_view(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  if (schema.is_mutable()) {
    return false;
  }
  for (const auto& ret : schema.returns()) {
    if (ret.alias_info() != nullptr) {
      return true;
    }
  }
  return false;
}

bool makes_uninitialized_memory(const c10::OperatorHandle& op) {
  const std::string& name = op.operator_name().name;
  return name == "aten::empty" || name == "aten::empty_like" || name == "aten::empty_strided" ||
         name == "aten::new_empty" || name == "aten::new_empty_strided" ||
         name == "aten::empty_permuted";
}

bool is_random(const c10::OperatorHandle& op) {
  return op.hasTag(at::Tag::nondeterministic_seeded);
}

bool is_collective(const c10::OperatorHandle& op) {
  const std::string& name = op.operator_name().name;
  return name.rfind("c10d::", 0) == 0 || name.rfind("_c10d_functional::", 0) == 0 ||
         name.rfind("_c10d_functional_autograd::", 0) == 0;
}

bool issues_collective(const c10::OperatorHandle& op) {
  const std::string& name = op.operator_name().name;
  // Every aten op fails the first compare.
  return !name.empty() && name.front() == '_' &&
         (name.rfind("_c10d_functional::", 0) == 0 ||
          name.rfind("_c10d_functional_autograd::", 0) == 0) &&
         name != "_c10d_functional::wait_tensor";
}

bool communicates(const c10::OperatorHandle& op) {
  return issues_collective(op) || op.operator_name().name.rfind("c10d::", 0) == 0;
}

std::string collective_signature(c10::ArrayRef<c10::IValue> args) {
  std::ostringstream out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (i > 0) {
      out << ", ";
    }
    describe_argument(out, args[i]);
  }
  return out.str();
}

}  // namespace sac::detail
