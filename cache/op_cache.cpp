#include <sac/cache/op_cache.h>

#include <sac/dispatch/boxed.h>
#include <sac/region/detached_alias.h>

#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

namespace sac {
namespace {

// Where the forward's and the recomputation's op sequences part ways, this is
// the usual cause.
constexpr const char* kMismatchHint =
    "The recomputation must run the same ops as the forward: this happens when "
    "the checkpointed function depends on state that changed between forward "
    "and backward (a flag, a module's training mode, data-dependent control "
    "flow). Make it deterministic, or checkpoint it without a policy.";

using dispatch::for_each_tensor;

// How a cached tensor was modified, for the errors.
std::string own_change(const VersionWatch& own) {
  return c10::str("version ", own.version(), " when cached, ", own.current_version(), " now");
}
constexpr const char* kThroughAnotherTensor =
    "through another tensor on its storage, such as the output of aten::_unsafe_view";

// `value` with each tensor slot (a tensor, defined or not, alone or in a
// list) replaced by `f` of it, in order.
template <class F>
c10::IValue map_tensors(const c10::IValue& value, F&& f) {
  if (value.isTensor()) {
    return f(value.toTensor());
  }
  if (value.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : value.toTensorList()) {
      out.push_back(f(t));
    }
    return out;
  }
  if (value.isList()) {
    auto list = value.toList();
    c10::impl::GenericList out(list.elementType());
    for (const c10::IValue& element : list) {
      out.push_back(map_tensors(element, f));
    }
    return out;
  }
  return value;
}

c10::IValue with_detached_tensors(const c10::IValue& value) {
  return map_tensors(value, detached_alias);
}

}  // namespace

void OpCache::append_recompute(const c10::OperatorHandle& op) {
  calls_[op].emplace_back();
}

void OpCache::watch(StorageInfo& info, const at::Tensor& t) {
  const VersionWatch watch(t);
  for (const auto& known : info.watches) {
    if (known.identity() == watch.identity()) {
      return;  // views share their base's counter: one watch covers them
    }
  }
  info.watches.push_back(watch);
}

void OpCache::append_saved(const c10::OperatorHandle& op,
                           c10::ArrayRef<c10::IValue> outputs,
                           std::optional<GeneratorSnapshot> generator) {
  Call call;
  call.state = Call::State::Saved;
  call.policy_saved = true;
  call.outputs.reserve(outputs.size());
  for (const auto& output : outputs) {
    call.outputs.push_back(with_detached_tensors(output));
    for_each_tensor(call.outputs.back(), [&](const at::Tensor& t) {
      call.versions.emplace_back(t);
    });
  }
  call.generator = std::move(generator);
  hold(call.outputs);
  ++saved_calls_;
  calls_[op].push_back(std::move(call));
}

void OpCache::watch_aliases(c10::ArrayRef<c10::IValue> values) {
  if (storages_.empty()) {
    return;
  }
  for (const auto& value : values) {
    for_each_tensor(value, [&](const at::Tensor& t) {
      if (!t.has_storage()) {
        return;
      }
      auto it = storages_.find(t.storage().unsafeGetStorageImpl());
      if (it != storages_.end()) {
        watch(it->second, t);
      }
    });
  }
}

std::optional<std::pair<size_t, std::string>> OpCache::first_modified(
    const Call& call) const {
  if (call.is_stashed) {
    return first_modified_stashed(call);
  }
  std::optional<std::pair<size_t, std::string>> found;
  size_t i = 0;
  for (const auto& output : call.outputs) {
    for_each_tensor(output, [&](const at::Tensor& t) {
      const size_t index = i++;
      if (found.has_value()) {
        return;
      }
      const VersionWatch& own = call.versions[index];
      if (own.changed()) {
        found.emplace(index, own_change(own));
        return;
      }
      if (!t.has_storage()) {
        return;
      }
      const auto& info = storages_.at(t.storage().unsafeGetStorageImpl());
      for (const auto& other : info.watches) {
        if (other.changed()) {
          found.emplace(index, kThroughAnotherTensor);
          return;
        }
      }
    });
  }
  return found;
}

std::optional<std::pair<size_t, std::string>> OpCache::first_modified_stashed(
    const Call& call) const {
  for (size_t index = 0; index < call.versions.size(); ++index) {
    const VersionWatch& own = call.versions[index];
    if (own.changed()) {
      return std::make_pair(index, own_change(own));
    }
  }
  for (const auto& other : call.storage_watches) {
    if (other.changed()) {
      return std::make_pair(size_t{0}, std::string(kThroughAnotherTensor));
    }
  }
  return std::nullopt;
}

void OpCache::demote_modified() {
  for (auto& [op, calls] : calls_) {
    for (auto& call : calls) {
      if (call.state == Call::State::Saved && first_modified(call).has_value()) {
        drop(call);
        call.state = Call::State::Recompute;
        ++demoted_calls_;
        TORCH_WARN_ONCE(
            "sac: the output of ", op.operator_name(), " was cached but then "
            "modified in place later in the checkpointed forward, so it will "
            "be recomputed instead (caching it would give wrong gradients). "
            "LibTorch's C++ torch::nn::Linear does this on inputs of more than "
            "2 dimensions (aten::mm, then the bias added in place); flatten "
            "such inputs to 2-D so that it runs aten::addmm, and save that.");
      }
    }
  }
}

void OpCache::begin_recording() { recording_ = true; }

void OpCache::end_recording() {
  recording_ = false;
  demote_modified();
}

void OpCache::stash(TensorStash& stash) {
  TORCH_INTERNAL_ASSERT(!recording_, "sac: stash() of a cache still recording");
  for (auto& [op, calls] : calls_) {
    for (auto& call : calls) {
      if (call.state != Call::State::Saved || call.is_stashed) {
        continue;
      }
      // The storages do not stay: their watches go with the call.
      for (const auto& output : call.outputs) {
        for_each_tensor(output, [&](const at::Tensor& t) {
          if (t.has_storage()) {
            const auto& watches = storages_.at(t.storage().unsafeGetStorageImpl()).watches;
            call.storage_watches.insert(call.storage_watches.end(), watches.begin(),
                                        watches.end());
          }
        });
      }
      release(call.outputs);
      for (auto& output : call.outputs) {
        output = map_tensors(output, [&](const at::Tensor& t) {
          if (!t.defined()) {
            call.stashed.push_back(nullptr);
            return t;
          }
          auto hooks = stash.hooks();
          hooks->call_pack_hook(t);
          call.stashed.push_back(std::move(hooks));
          return at::Tensor();
        });
      }
      call.is_stashed = true;
    }
  }
}

std::vector<c10::IValue> OpCache::unstash(Call& call) {
  size_t slot = 0;
  std::vector<c10::IValue> outputs;
  for (const auto& output : call.outputs) {
    outputs.push_back(map_tensors(output, [&](const at::Tensor&) {
      const auto& hooks = call.stashed.at(slot++);
      return hooks == nullptr ? at::Tensor() : hooks->call_unpack_hook();
    }));
  }
  return outputs;
}

const OpCache::Call* OpCache::find(const c10::OperatorHandle& op,
                                   size_t call) const {
  const auto it = calls_.find(op);
  const size_t recorded = it == calls_.end() ? 0 : it->second.size();
  if (call < recorded) {
    return &it->second[call];
  }
  if (recording_) {
    return nullptr;
  }
  TORCH_CHECK(recorded > 0, "sac: ", op.operator_name(),
              " ran during recomputation but never in the checkpointed "
              "forward. ", kMismatchHint);
  TORCH_CHECK(false, "sac: ", op.operator_name(), " ran at least ", call + 1,
              " times during recomputation but only ", recorded,
              " times in the checkpointed forward. ", kMismatchHint);
}

OpCache::Record OpCache::record(const c10::OperatorHandle& op,
                                size_t call) const {
  const Call* found = find(op, call);
  if (found == nullptr) {
    return {/*policy_saved=*/false, /*cached=*/false, /*recorded=*/false};
  }
  const bool cached = found->state != Call::State::Recompute &&
                      // Modified already: end_recording will demote it.
                      !(recording_ && first_modified(*found).has_value());
  return {found->policy_saved, cached, /*recorded=*/true};
}

OpCache::Served OpCache::take(const c10::OperatorHandle& op, size_t index,
                              bool allow_mutation) {
  const Call* found = find(op, index);
  TORCH_INTERNAL_ASSERT(found != nullptr, "sac: take() of a call not recorded");
  Call& call = const_cast<Call&>(*found);
  if (recording_) {
    // The backward after the forward needs them too: hand out new aliases.
    TORCH_INTERNAL_ASSERT(call.state == Call::State::Saved);
    Served served;
    for (const auto& output : call.outputs) {
      served.outputs.push_back(with_detached_tensors(output));
    }
    served.generator = call.generator;
    return served;
  }
  TORCH_CHECK(call.state != Call::State::Served,
              "sac: Trying to backward an extra time through a region "
              "checkpointed with a selective policy: the outputs cached for ",
              op.operator_name(), " (call ", index,
              ") were already used by an earlier backward. Such a region can "
              "be backwarded once; run its forward again before another "
              "backward, or checkpoint it without a policy (full "
              "recomputation allows retain_graph).");
  TORCH_INTERNAL_ASSERT(call.state == Call::State::Saved);
  if (!allow_mutation) {
    const auto modified = first_modified(call);
    TORCH_CHECK(!modified.has_value(), "sac: a tensor cached for ",
                op.operator_name(), " (call ", index, ", tensor ",
                modified->first, ") was modified in place after the "
                "checkpointed forward (", modified->second, "), so it no "
                "longer holds the op's output. Do not modify the region's "
                "outputs in place before backward, stop saving ",
                op.operator_name(),
                ", or allow it with allow_cache_entry_mutation(true).");
  }
  Served served;
  if (call.is_stashed) {
    served.outputs = unstash(call);
    call.stashed.clear();
  } else {
    release(call.outputs);
    served.outputs = std::move(call.outputs);
  }
  served.generator = std::move(call.generator);
  call.outputs.clear();
  call.generator.reset();
  call.state = Call::State::Served;
  --saved_calls_;
  return served;
}

void OpCache::clear() {
  calls_.clear();
  storages_.clear();
  bytes_ = 0;
  saved_calls_ = 0;
}

void OpCache::hold(const std::vector<c10::IValue>& outputs) {
  for (const auto& output : outputs) {
    for_each_tensor(output, [&](const at::Tensor& t) {
      if (!t.has_storage()) {
        return;
      }
      StorageInfo& info = storages_[t.storage().unsafeGetStorageImpl()];
      if (info.refs++ == 0) {
        info.nbytes = t.storage().nbytes();
        bytes_ += info.nbytes;
      }
      watch(info, t);
    });
  }
}

void OpCache::release(const std::vector<c10::IValue>& outputs) {
  for (const auto& output : outputs) {
    for_each_tensor(output, [&](const at::Tensor& t) {
      if (!t.has_storage()) {
        return;
      }
      auto it = storages_.find(t.storage().unsafeGetStorageImpl());
      TORCH_INTERNAL_ASSERT(it != storages_.end());
      if (--it->second.refs == 0) {
        bytes_ -= it->second.nbytes;
        storages_.erase(it);
      }
    });
  }
}

void OpCache::drop(Call& call) {
  if (!call.is_stashed) {
    release(call.outputs);
  }
  call.outputs.clear();
  call.stashed.clear();
  call.versions.clear();
  call.generator.reset();
  --saved_calls_;
}

}  // namespace sac
