#include <sac/record/internal/replay.h>

#include <sac/base/internal/check.h>
#include <sac/base/internal/generators.h>
#include <sac/dispatch/internal/boxed.h>
#include <sac/dispatch/internal/interceptor.h>
#include <sac/policy/internal/op_traits.h>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/Exception.h>

namespace sac::detail {
namespace {

constexpr size_t kNever = static_cast<size_t>(-1);

// Calls `f(value)` for each value instruction `instruction` reads.
template <class F>
void for_each_read(const Recording& recording, const Instruction& instruction, F&& f) {
  switch (instruction.kind) {
    case Instruction::Kind::Call: {
      const Call& call = recording.calls[instruction.index];
      if (!call.replayed) {
        return;
      }
      for (const Argument& argument : call.arguments) {
        for (const auto& value : argument.tensors) {
          if (value.has_value()) {
            f(*value);
          }
        }
      }
      return;
    }
    case Instruction::Kind::Alias: f(recording.aliases[instruction.index].base); return;
    case Instruction::Kind::Fill: f(recording.fills[instruction.index].value); return;
    case Instruction::Kind::Mark: f(static_cast<ValueId>(instruction.index)); return;
    case Instruction::Kind::Outside: return;
  }
}

// For each instruction of the first `end`, the values to drop once it ran: those
// it read last, and those it made that nothing reads.
class Lifetimes {
 public:
  Lifetimes(const Recording& recording, size_t end) : first_(end + 1, 0) {
    std::vector<size_t> last(recording.values, kNever);
    for (size_t i = 0; i < end; ++i) {
      for_each_read(recording, recording.instructions[i], [&](ValueId v) { last[v] = i; });
    }
    // A value nothing reads dies where it is made. Values are numbered in
    // the order they are made, so walking the instructions finds each maker.
    for (size_t i = 0; i < end; ++i) {
      for_each_made(recording, recording.instructions[i], [&](ValueId v) {
        if (last[v] == kNever) {
          last[v] = i;
        }
      });
    }
    for (ValueId v = 0; v < last.size(); ++v) {
      if (last[v] != kNever) {
        ++first_[last[v] + 1];
      }
    }
    for (size_t i = 1; i <= end; ++i) {
      first_[i] += first_[i - 1];
    }
    dying_.resize(first_[end]);
    std::vector<size_t> next(first_.begin(), first_.end() - 1);
    for (ValueId v = 0; v < last.size(); ++v) {
      if (last[v] != kNever) {
        dying_[next[last[v]]++] = v;
      }
    }
  }

  c10::ArrayRef<ValueId> after(size_t instruction) const {
    return c10::ArrayRef<ValueId>(dying_).slice(first_[instruction],
                                                first_[instruction + 1] - first_[instruction]);
  }

  template <class F>
  static void for_each_made(const Recording& recording, const Instruction& instruction, F&& f) {
    switch (instruction.kind) {
      case Instruction::Kind::Call: {
        const Call& call = recording.calls[instruction.index];
        for (uint32_t k = 0; k < call.outputs; ++k) {
          f(call.first_output + k);
        }
        return;
      }
      case Instruction::Kind::Outside: f(recording.outside[instruction.index].value); return;
      case Instruction::Kind::Alias: f(recording.aliases[instruction.index].value); return;
      case Instruction::Kind::Fill:
      case Instruction::Kind::Mark: return;
    }
  }

 private:
  std::vector<size_t> first_;  // per instruction: start of its slice of dying_
  std::vector<ValueId> dying_;
};

class Replay {
 public:
  Replay(const Recording& recording, std::vector<at::Tensor> outside, const MarkSink& on_mark)
      : recording_(recording),
        outside_(std::move(outside)),
        on_mark_(on_mark),
        values_(recording.values),
        copies_(recording.snapshots.size()) {}

  void run(size_t* agreements) {
    const size_t end = recording_.instructions.size();
    const Lifetimes lifetimes(recording_, end);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    const size_t agreed = recording_.communication.empty() ? 0 : recording_.communication.agree();
    if (agreements != nullptr) {
      *agreements = agreed;
    }
    for (size_t i = 0; i < end; ++i) {
      run_instruction(recording_.instructions[i]);
      for (const ValueId v : lifetimes.after(i)) {
        values_[v].reset();
      }
    }
  }

 private:
  void run_instruction(const Instruction& instruction) {
    switch (instruction.kind) {
      case Instruction::Kind::Call: run_call(recording_.calls[instruction.index]); return;
      case Instruction::Kind::Outside: load_outside(instruction.index); return;
      case Instruction::Kind::Fill: {
        const Fill& fill = recording_.fills[instruction.index];
        detail::IsolationGuard unseen;
        bytes_of(value(fill.value).storage()).copy_(recording_.snapshots[fill.snapshot]);
        return;
      }
      case Instruction::Kind::Alias: {
        const Alias& alias = recording_.aliases[instruction.index];
        detail::IsolationGuard unseen;
        values_[alias.value] =
            value(alias.base).as_strided(alias.sizes, alias.strides, alias.storage_offset);
        return;
      }
      case Instruction::Kind::Mark: on_mark_(mark_++, value(instruction.index)); return;
    }
  }

  void run_call(const Call& call) {
    if (!call.replayed) {
      return;
    }
    stack_.clear();
    for (const Argument& argument : call.arguments) {
      stack_.push_back(argument_value(argument));
    }
    detail::call_op(call.op, call.below, call.intercepted, &stack_);
    if (detail::communicates(call.op)) {
      wait_for_work(stack_);
    }
    ValueId next = call.first_output;
    const ValueId end = call.first_output + call.outputs;
    for (const auto& output : stack_) {
      detail::for_each_tensor(output, [&](const at::Tensor& t) {
        SAC_CHECKPOINT_CHECK(next < end, "sac::CheckpointRegion: replaying ",
                             call.op.operator_name(), " returned more tensors (",
                             next - call.first_output + 1, "+) than in the forward (", call.outputs,
                             ").");
        values_[next++] = t;
      });
    }
    SAC_CHECKPOINT_CHECK(next == end, "sac::CheckpointRegion: replaying ", call.op.operator_name(),
                         " returned ", next - call.first_output, " tensors, ", call.outputs,
                         " in the forward.");
    stack_.clear();
  }

  c10::IValue argument_value(const Argument& argument) {
    switch (argument.kind) {
      case Argument::Kind::Constant: return argument.constant;
      case Argument::Kind::Tensor: return value(*argument.tensors[0]);
      case Argument::Kind::List: {
        c10::List<c10::IValue> list = argument.constant.toList().copy();
        for (size_t i = 0; i < argument.tensors.size(); ++i) {
          if (argument.tensors[i].has_value()) {
            list.set(i, value(*argument.tensors[i]));
          }
        }
        return c10::IValue(std::move(list));
      }
      case Argument::Kind::Generator: {
        // Draws from a copy of the forward's state: the live generator and
        // the recorded state stay as they are.
        return c10::IValue(detail::locked_clone(argument.constant.toGenerator()));
      }
    }
    TORCH_INTERNAL_ASSERT(false);
  }

  void load_outside(size_t index) {
    const Outside& outside = recording_.outside[index];
    if (outside.fresh) {
      detail::IsolationGuard unseen;
      values_[outside.value] = at::empty_strided(outside.sizes, outside.strides, outside.options);
      return;
    }
    if (!outside.snapshot.has_value()) {
      values_[outside.value] = std::move(outside_[index]);
      TORCH_INTERNAL_ASSERT(values_[outside.value].defined(),
                            "sac: an outside tensor of a recording was not given to replay");
      return;
    }
    detail::IsolationGuard unseen;
    at::Tensor& copy = copies_[*outside.snapshot];
    if (!copy.defined()) {
      copy = recording_.snapshots[*outside.snapshot].clone();
    }
    values_[outside.value] =
        at::empty({0}, outside.options)
            .set_(copy.storage(), outside.storage_offset, outside.sizes, outside.strides);
  }

  const at::Tensor& value(ValueId v) const {
    TORCH_INTERNAL_ASSERT(values_[v].defined(), "sac: replay reads value ", v,
                          " after its last use");
    return values_[v];
  }

  const Recording& recording_;
  std::vector<at::Tensor> outside_;
  const MarkSink& on_mark_;
  std::vector<at::Tensor> values_;
  std::vector<at::Tensor> copies_;  // per snapshot: this replay's copy
  torch::jit::Stack stack_;
  size_t mark_ = 0;
};

}  // namespace

void replay(const Recording& recording, std::vector<at::Tensor> outside, const MarkSink& on_mark,
            size_t* agreements) {
  Replay(recording, std::move(outside), on_mark).run(agreements);
}

}  // namespace sac::detail
