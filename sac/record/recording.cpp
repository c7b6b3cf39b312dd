#include <sac/record/internal/recording.h>

#include <ATen/ops/empty.h>
#include <ATen/record_function.h>

#include <sstream>

namespace sac::detail {

at::Tensor bytes_of(const c10::Storage& storage) {
  // sac's own view: no profiler or RecordFunction callback (the value
  // check's origins) is to see it, as if the storage were made here.
  at::DisableRecordFunctionGuard unrecorded;
  return at::empty({0}, at::TensorOptions().dtype(at::kByte).device(storage.device()))
      .set_(storage, 0, {static_cast<int64_t>(storage.nbytes())}, {1});
}

std::string Recording::str() const {
  std::ostringstream out;
  for (size_t i = 0; i < instructions.size(); ++i) {
    const Instruction& instruction = instructions[i];
    out << i << ": ";
    switch (instruction.kind) {
      case Instruction::Kind::Call: {
        const Call& call = calls[instruction.index];
        out << "%" << call.first_output << ".." << call.first_output + call.outputs << " = "
            << call.op.operator_name() << "(";
        for (const Argument& argument : call.arguments) {
          if (argument.kind == Argument::Kind::Constant) {
            out << argument.constant.tagKind() << ", ";
            continue;
          }
          for (const auto& value : argument.tensors) {
            out << (value.has_value() ? "%" + std::to_string(*value) : std::string("_")) << " ";
          }
          out << ", ";
        }
        out << ")" << (call.intercepted ? "" : " [not intercepted]")
            << (call.replayed ? "" : " [not replayed]");
        break;
      }
      case Instruction::Kind::Outside: {
        const Outside& o = outside[instruction.index];
        out << "%" << o.value << " = outside" << (o.snapshot ? " (copy)" : "")
            << (o.fresh ? " (fresh)" : "");
        break;
      }
      case Instruction::Kind::Fill: {
        const Fill& f = fills[instruction.index];
        out << "fill %" << f.value << " from copy " << f.snapshot;
        break;
      }
      case Instruction::Kind::Alias: {
        const Alias& a = aliases[instruction.index];
        out << "%" << a.value << " = alias of %" << a.base;
        break;
      }
      case Instruction::Kind::Mark: out << "mark %" << instruction.index; break;
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace sac::detail
