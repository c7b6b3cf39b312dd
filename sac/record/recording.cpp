#include <sac/record/internal/recording.h>

#include <ATen/ops/empty.h>
#include <ATen/record_function.h>

#include <sstream>

namespace sac::record {

at::Tensor bytes_of(const c10::Storage& storage) {
  // sac's own view: no profiler or RecordFunction callback (the value
  // check's origins) is to see it, as if the storage were made here.
  at::DisableRecordFunctionGuard unrecorded;
  return at::empty({0}, at::TensorOptions().dtype(at::kByte).device(storage.device()))
      .set_(storage, 0, {static_cast<int64_t>(storage.nbytes())}, {1});
}

std::string Recording::str() const {
  std::ostringstream out;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& step = steps[i];
    out << i << ": ";
    switch (step.kind) {
      case Step::Kind::Call: {
        const Call& call = calls[step.index];
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
      case Step::Kind::Outside: {
        const Outside& o = outside[step.index];
        out << "%" << o.value << " = outside" << (o.snapshot ? " (copy)" : "")
            << (o.fresh ? " (fresh)" : "");
        break;
      }
      case Step::Kind::Fill: {
        const Fill& f = fills[step.index];
        out << "fill %" << f.value << " from copy " << f.snapshot;
        break;
      }
      case Step::Kind::Alias: {
        const Alias& a = aliases[step.index];
        out << "%" << a.value << " = alias of %" << a.base;
        break;
      }
      case Step::Kind::Mark: out << "mark %" << step.index; break;
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace sac::record
