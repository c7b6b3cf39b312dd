#include <sac/check/internal/op_origins.h>

#include <sac/base/internal/storage_key.h>
#include <sac/check/internal/callback_stack.h>
#include <sac/dispatch/internal/boxed.h>

#include <ATen/record_function.h>
#include <c10/core/StorageImpl.h>

#include <memory>
#include <string>

namespace sac::detail {

namespace {

std::unique_ptr<at::ObserverContext> on_origin_start(const at::RecordFunction& fn);
void on_origin_end(const at::RecordFunction& fn, at::ObserverContext*);

thread_local CallbackStack<OpOrigins*> tls_origins(at::RecordFunctionCallback(&on_origin_start,
                                                                              &on_origin_end)
                                                       .needsInputs(true)
                                                       .needsOutputs(true)
                                                       .scopes({at::RecordScope::FUNCTION}));

std::unique_ptr<at::ObserverContext> on_origin_start(const at::RecordFunction& fn) {
  const RecordedOp* op = recorded_op(fn);
  const c10::ArrayRef<c10::IValue> inputs(fn.inputs().data(), fn.inputs().size());
  for (OpOrigins* origins : tls_origins.items()) {
    origins->note_running(op, inputs);
  }
  return nullptr;
}

void on_origin_end(const at::RecordFunction& fn, at::ObserverContext*) {
  const RecordedOp* op = recorded_op(fn);
  for (OpOrigins* origins : tls_origins.items()) {
    origins->note_outputs(op, fn.outputs());
  }
}

}  // namespace

void OpOrigins::note_running(const RecordedOp* op, c10::ArrayRef<c10::IValue> inputs) {
  Running running{op, {}};
  for (const size_t i : op->state_arguments) {
    if (i < inputs.size() && inputs[i].isTensor()) {
      running.state.push_back(storage_key(inputs[i].toTensor()));
    }
  }
  running_.push_back(std::move(running));
}

void OpOrigins::note_outputs(const RecordedOp* op, c10::ArrayRef<c10::IValue> outputs) {
  const size_t depth = running_.size();
  if (!running_.empty()) {
    running_.pop_back();
  }
  const size_t call = calls_[op]++;
  // Small: an op's outputs, a handful of storages.
  c10::SmallVector<const c10::StorageImpl*, 4> written;
  if (!op->view) {  // a view's storage keeps the origin it had (none: a view of an outside tensor)
    for (const c10::IValue& output : outputs) {
      detail::for_each_tensor(output, [&](const at::Tensor& t) {
        if (const c10::StorageImpl* storage = storage_key(t)) {
          by_storage_[storage] = {op, call};
          if (op->random) {
            drawn_by_storage_[storage] = {op, call};
          }
          written.push_back(storage);
        }
      });
    }
  }
  // What this op saved of its own outputs, it made (in place too).
  while (!pending_.empty() && pending_.back().depth >= depth) {
    const Pending pending = pending_.back();
    pending_.pop_back();
    if (std::find(written.begin(), written.end(), pending.storage) != written.end()) {
      saved_[pending.index].made = SavedOrigin::CallId{op, call};
    }
  }
}

void OpOrigins::note_saved(const at::Tensor& saved) {
  SavedOrigin origin;
  const c10::StorageImpl* storage = storage_key(saved);
  const auto it = by_storage_.find(storage);
  if (it != by_storage_.end()) {
    origin.made = it->second;
  }
  if (const auto drawn = drawn_by_storage_.find(storage); drawn != drawn_by_storage_.end()) {
    origin.drawn = drawn->second;
  }
  if (!running_.empty()) {
    const Running& running = running_.back();
    origin.saver = running.op;
    origin.state = storage != nullptr && std::find(running.state.begin(), running.state.end(),
                                                   storage) != running.state.end();
    if (storage != nullptr) {
      pending_.push_back({saved_.size(), running_.size(), storage});
    }
  }
  saved_.push_back(origin);
}

std::string SavedOrigin::describe() const {
  const std::string saved_by =
      saver == nullptr ? std::string() : ", saved for backward by " + saver->name;
  if (!made.has_value()) {
    return "not made in the region (an input, a parameter, a buffer, a constant or host "
           "memory)" +
           saved_by;
  }
  const std::string call = " (its call " + std::to_string(made->index) + " in the region)";
  if (made->op->uninitialized) {
    return "host data: made by " + made->op->name + call +
           ", then filled through its data pointer, as torch::tensor(...) fills it" + saved_by;
  }
  // A random op's draws differ in a recomputation that does not restore
  // the generators (preserve_rng_state off), in place too (dropout's mask:
  // empty_like, then bernoulli_, then div_).
  const bool made_by_random = drawn.has_value() && drawn->op == made->op;
  const std::string maker = (made_by_random ? "the random op " : "") + made->op->name + call;
  const std::string drawn_by = drawn.has_value() && !made_by_random
                                   ? ", its values drawn by the random op " + drawn->op->name +
                                         " (its call " + std::to_string(drawn->index) +
                                         " in the region)"
                                   : "";
  if (made->op == saver) {
    return "made and saved for backward by " + maker + drawn_by;
  }
  return "made by " + maker + drawn_by + saved_by;
}

OriginScope::OriginScope(OpOrigins& origins) { tls_origins.push(&origins); }

OriginScope::~OriginScope() { tls_origins.pop(); }

}  // namespace sac::detail
