#include <sac/lab/profile.h>

#include <sac/base/internal/saved_tensor_hooks.h>
#include <sac/base/internal/version_watch.h>
#include <sac/cache/internal/new_storages.h>
#include <sac/dispatch/internal/boxed.h>
#include <sac/dispatch/internal/interceptor.h>
#include <sac/lab/internal/flops.h>
#include <sac/policy/internal/op_traits.h>

#include <ATen/core/grad_mode.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <ostream>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace sac {
namespace {

using Clock = std::chrono::steady_clock;

c10::Device first_device(c10::ArrayRef<c10::IValue> outputs) {
  std::optional<c10::Device> device;
  for (const auto& output : outputs) {
    detail::for_each_tensor(output, [&](const at::Tensor& t) {
      if (!device.has_value() && t.defined()) {
        device = t.device();
      }
    });
  }
  return device.value_or(c10::kCPU);
}

// Notes in `entry`, call `index`, that `t`'s storage was made by an
// earlier call.
void share_storage(OpCallProfile& entry, size_t index,
                   const std::unordered_map<const c10::StorageImpl*, size_t>& made_by,
                   const at::Tensor& t) {
  auto maker = made_by.find(t.storage().unsafeGetStorageImpl());
  if (maker == made_by.end() || maker->second == index) {
    return;
  }
  auto& shared = entry.shares_storage_with;
  if (std::find(shared.begin(), shared.end(), maker->second) == shared.end()) {
    shared.push_back(maker->second);
  }
}

class Profiler final : public detail::OpObserver {
 public:
  void before_op(const detail::ObservedOp& call, c10::ArrayRef<c10::IValue> args) override {
    for (const auto& arg : args) {
      detail::for_each_tensor(arg, [&](const at::Tensor& t) { storages_.meet(t); });
    }
    // A formula needs the arguments and the outputs: keep the former until then.
    args_.clear();
    if (detail::counts_flops(call.op)) {
      args_.assign(args.begin(), args.end());
    }
    started_ = Clock::now();
  }

  void after_op(const detail::ObservedOp& call, c10::ArrayRef<c10::IValue> outputs) override {
    const double seconds = std::chrono::duration<double>(Clock::now() - started_).count();
    OpCallProfile entry{call.op};
    entry.call = calls_of_[call.op]++;
    entry.seconds = seconds;
    if (!args_.empty()) {
      entry.flops = detail::flops_of(call.op, args_, outputs);
      args_.clear();
    }
    for (const auto& output : outputs) {
      detail::for_each_tensor(output, [&](const at::Tensor& t) {
        const int64_t bytes = storages_.meet(t);
        if (bytes > 0) {
          made_by_[t.storage().unsafeGetStorageImpl()] = entries.size();
          made_.push_back(t.storage().getWeakStorageImpl());
        }
        entry.output_bytes += bytes;
      });
    }
    entry.device = first_device(outputs);
    entry.view = detail::is_view(call.op);
    entry.in_place = call.op.schema().is_mutable();
    entry.random = detail::is_random(call.op);
    entry.collective = detail::is_collective(call.op);
    entry.cacheable = detail::is_cacheable(call.op);
    for (const auto& output : outputs) {
      detail::for_each_tensor(output, [&](const at::Tensor& t) {
        if (t.has_storage()) {
          auto& watch = watches_[t.storage().unsafeGetStorageImpl()];
          watch.writers.emplace_back(t);
          if (entry.cacheable) {
            watch.calls.push_back(entries.size());
            share_storage(entry, entries.size(), made_by_, t);
          }
        }
      });
    }
    entries.push_back(std::move(entry));
  }

  // Marks the call that made `t`'s storage, if one did, as returned by the
  // region: that storage's bytes are no longer the call's to keep (its
  // other outputs' still are).
  void returned(const at::Tensor& t) {
    if (!t.defined() || !t.has_storage()) {
      return;
    }
    auto maker = made_by_.find(t.storage().unsafeGetStorageImpl());
    if (maker == made_by_.end()) {
      return;
    }
    OpCallProfile& call = entries[maker->second];
    call.returned = true;
    call.output_bytes -= static_cast<int64_t>(t.storage().nbytes());
    made_by_.erase(maker);  // counted once however often it is returned
  }

  // Bytes of the storages the calls made that are alive now, but those in
  // `returned`: after the region returned, what its autograd graph holds.
  int64_t alive_bytes(const std::vector<at::Tensor>& returned) const {
    std::unordered_set<const c10::StorageImpl*> handed_out;
    for (const at::Tensor& t : returned) {
      if (t.defined() && t.has_storage()) {
        handed_out.insert(t.storage().unsafeGetStorageImpl());
      }
    }
    int64_t bytes = 0;
    for (const auto& weak : made_) {
      const c10::intrusive_ptr<c10::StorageImpl> storage = weak.lock();
      if (storage && handed_out.count(storage.get()) == 0) {
        bytes += static_cast<int64_t>(storage->nbytes());
      }
    }
    return bytes;
  }

  // Marks the calls whose outputs' storage was written after they returned,
  // through any tensor an op returned on it.
  void finish() {
    for (const auto& [storage, watch] : watches_) {
      for (const auto& writer : watch.writers) {
        if (writer.changed()) {
          for (const size_t call : watch.calls) {
            entries[call].modified_later = true;
          }
          break;
        }
      }
    }
    watches_.clear();
    made_by_.clear();
  }

  std::vector<OpCallProfile> entries;

 private:
  // Per storage an op returned a tensor on: the version counters of those
  // tensors since then, and the cacheable calls that returned it.
  struct StorageWatch {
    std::vector<detail::VersionWatch> writers;
    std::vector<size_t> calls;
  };
  std::unordered_map<const c10::StorageImpl*, StorageWatch> watches_;
  // The call whose outputs first held each storage the region made.
  std::unordered_map<const c10::StorageImpl*, size_t> made_by_;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> made_;  // each once
  std::unordered_map<c10::OperatorHandle, size_t> calls_of_;
  detail::NewStorages storages_;
  Clock::time_point started_;
  std::vector<c10::IValue> args_;  // of the call running, if it counts FLOPs
};

std::string flags(const OpCallProfile& c) {
  std::string out;
  auto add = [&](bool on, const char* name) {
    if (on) {
      out += (out.empty() ? "" : ",") + std::string(name);
    }
  };
  add(c.cacheable, "cacheable");
  add(c.modified_later, "modified-later");
  add(c.view, "view");
  add(c.in_place, "in-place");
  add(c.random, "random");
  add(c.collective, "collective");
  add(c.returned, "returned");
  add(c.past_stop, "past-stop");
  return out;
}

}  // namespace

int64_t RegionProfile::keepable_bytes() const {
  int64_t bytes = 0;
  for (const auto& c : calls_) {
    bytes += c.keepable() ? c.output_bytes : 0;
  }
  return bytes;
}

double RegionProfile::keepable_seconds() const {
  double seconds = 0;
  for (const auto& c : calls_) {
    seconds += c.keepable() ? c.recompute_seconds() : 0;
  }
  return seconds;
}

void RegionProfile::print(std::ostream& out, SortBy sort, size_t limit) const {
  std::vector<const OpCallProfile*> rows;
  for (const auto& c : calls_) {
    rows.push_back(&c);
  }
  if (sort == SortBy::Bytes) {
    std::stable_sort(rows.begin(), rows.end(),
                     [](auto* a, auto* b) { return a->output_bytes > b->output_bytes; });
  } else if (sort == SortBy::Time) {
    std::stable_sort(rows.begin(), rows.end(),
                     [](auto* a, auto* b) { return a->seconds > b->seconds; });
  }
  if (limit != 0 && rows.size() > limit) {
    rows.resize(limit);
  }
  out << std::left << std::setw(48) << "op" << std::right << std::setw(6) << "call" << std::setw(14)
      << "bytes" << std::setw(12) << "us"
      << "  kind\n";
  for (const auto* c : rows) {
    out << std::left << std::setw(48) << c10::toString(c->op.operator_name()) << std::right
        << std::setw(6) << c->call << std::setw(14) << c->output_bytes << std::setw(12)
        << std::fixed << std::setprecision(1) << c->seconds * 1e6 << "  " << flags(*c) << "\n";
  }
  out << "keepable: " << keepable_bytes() << " bytes, " << std::setprecision(1)
      << keepable_seconds() * 1e6 << " us\n";
}

void RegionProfile::write_csv(std::ostream& out) const {
  out << "op,call,output_bytes,seconds,cacheable,modified_later,view,in_place,random,collective,"
         "device,returned,past_stop,flops\n";
  for (const auto& c : calls_) {
    out << c10::toString(c.op.operator_name()) << "," << c.call << "," << c.output_bytes << ","
        << std::scientific << std::setprecision(6) << c.seconds << "," << c.cacheable << ","
        << c.modified_later << "," << c.view << "," << c.in_place << "," << c.random << ","
        << c.collective << "," << c.device << "," << c.returned << "," << c.past_stop << ","
        << c.flops << "\n";
  }
}

namespace {

struct ProfiledRun {
  std::vector<OpCallProfile> calls;
  int64_t plain_bytes = 0;
};

ProfiledRun profile_once(const detail::ProfiledRegion& region) {
  Profiler profiler;
  std::vector<at::Tensor> returned;
  // The calls made when autograd saved its last tensor: a recomputation
  // stops there (OpCallProfile::past_stop). A save of a call's inputs comes
  // before its kernel runs, a save of its outputs after: the hooks hear
  // them, saving nothing themselves.
  size_t calls_at_last_save = 0;
  bool returns = false;
  detail::install_hooking_engine();
  {
    detail::ObserverGuard observing(&profiler);
    detail::SavedTensorHooksGuard saves(
        [&]() -> std::unique_ptr<torch::autograd::SavedVariableHooks> {
          calls_at_last_save = profiler.entries.size();
          return nullptr;
        });
    returns = region(returned);
  }
  for (size_t i = calls_at_last_save; i < profiler.entries.size(); ++i) {
    profiler.entries[i].past_stop = true;
  }
  for (const at::Tensor& t : returned) {
    profiler.returned(t);
  }
  // A region that returns nothing let its graph go: nothing of it is alive.
  const int64_t plain_bytes = returns ? profiler.alive_bytes(returned) : -1;
  profiler.finish();
  return {std::move(profiler.entries), plain_bytes};
}

}  // namespace

RegionProfile detail::profile_region(const detail::ProfiledRegion& region, int runs, int warmup) {
  TORCH_CHECK(runs >= 1, "sac::profile: runs must be at least 1; got ", runs, ".");
  TORCH_CHECK(warmup >= 0, "sac::profile: warmup must be 0 or more; got ", warmup, ".");
  TORCH_CHECK(at::GradMode::is_enabled(),
              "sac::profile: autograd is not recording here (torch::NoGradGuard, "
              "torch.no_grad() or inference mode), so the region saves nothing for backward: "
              "its plain_bytes would be 0 and every call would look past the "
              "recomputation's stop (OpCallProfile::past_stop). Profile the region as the "
              "training step runs it, with autograd recording.");
  for (int run = 0; run < warmup; ++run) {
    std::vector<at::Tensor> returned;
    region(returned);
  }
  // Under per-op kernels, the cacheable ops must be intercepted to be seen.
  detail::intercept_ops_matching(&detail::is_cacheable);
  ProfiledRun first = profile_once(region);
  std::vector<OpCallProfile>& calls = first.calls;
  for (int run = 1; run < runs; ++run) {
    const std::vector<OpCallProfile> again = profile_once(region).calls;
    // Where the second run is the first to differ, the first may have been
    // a lazy initialisation: say how to leave it out.
    const std::string advice =
        run == 1 && warmup == 0
            ? " If the first run differs because it initialises something once (FSDP's lazy "
              "initialisation, a cache filled on first use), leave it out of the profile: "
              "warmup = 1 (sac.profile(region, warmup=1) in Python)."
            : "";
    TORCH_CHECK(again.size() == calls.size(), "sac::profile: the region ran ", calls.size(),
                " op calls in its first profiled run and ", again.size(), " in run ", run + 1,
                ". Profile a region that runs the same ops "
                "each time (no data-dependent control flow), or profile it with runs = 1.",
                advice);
    for (size_t i = 0; i < calls.size(); ++i) {
      TORCH_CHECK(again[i].op == calls[i].op, "sac::profile: op call ", i, " was ",
                  c10::toString(calls[i].op.operator_name()), " in the first profiled run and ",
                  c10::toString(again[i].op.operator_name()), " in run ", run + 1,
                  ". Profile a region that runs the same ops each time, or with runs = 1.", advice);
      calls[i].seconds = std::min(calls[i].seconds, again[i].seconds);
    }
  }
  return RegionProfile(std::move(calls), first.plain_bytes);
}

}  // namespace sac
