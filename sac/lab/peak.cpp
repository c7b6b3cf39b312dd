#include <sac/lab/peak.h>

#include <sac/base/internal/region_events.h>
#include <sac/cache/internal/new_storages.h>
#include <sac/dispatch/internal/boxed.h>
#include <sac/dispatch/internal/interceptor.h>
#include <sac/policy/internal/op_traits.h>

#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <iomanip>
#include <ostream>
#include <unordered_map>
#include <utility>

namespace sac {
namespace {

using WeakStorage = c10::weak_intrusive_ptr<c10::StorageImpl>;

// Closes a phase at every mark and opens the next; between marks, notes the
// op calls of each region's forward and the storages their outputs made.
class PhaseRecorder final : public detail::RegionEvents, public dispatch::OpObserver {
 public:
  explicit PhaseRecorder(const MemoryProbe& probe) : probe_(probe), base_(probe.live()) {
    probe_.reset_peak();
  }

  void forward_began(const void* region) override {
    const int index = static_cast<int>(index_.size());
    index_[region] = index;
    alive_.push_back(false);
    calls_of_.emplace_back();
    running_.push_back(index);
    mark(StepPhase::Kind::Forward, index);
  }
  void forward_ended(const void* region) override {
    const int index = index_.at(region);
    alive_[index] = true;
    running_.erase(std::find(running_.begin(), running_.end(), index));
    if (running_.empty()) {
      mark(StepPhase::Kind::Between, -1);
    } else {
      mark(StepPhase::Kind::Forward, running_.back());
    }
  }
  void recomputation_began(const void* region) override {
    const auto found = index_.find(region);
    if (found == index_.end()) {
      return;  // a region from before the step
    }
    alive_[found->second] = false;
    mark(StepPhase::Kind::Backward, found->second);
  }

  void before_op(const dispatch::ObservedOp&, c10::ArrayRef<c10::IValue> args) override {
    for (const auto& arg : args) {
      dispatch::for_each_tensor(arg, [&](const at::Tensor& t) { storages_.meet(t); });
    }
    // The stretch since the last op ends: a gap.
    const StepPoint now{phases_.size(), current_.step_peaks.size()};
    end_stretch(/*gap=*/true);
    find_freed(now);
  }
  void after_op(const dispatch::ObservedOp& call, c10::ArrayRef<c10::IValue> outputs) override {
    const StepPoint now{phases_.size(), current_.step_peaks.size()};
    end_stretch(/*gap=*/false);
    find_freed(now);
    if (running_.empty()) {
      return;  // outside every region's forward
    }
    const int region = running_.back();
    calls_.push_back({region, call.op, calls_of_[region][call.op]++, now, {}});
    for (const auto& output : outputs) {
      dispatch::for_each_tensor(output, [&](const at::Tensor& t) {
        if (const int64_t bytes = storages_.meet(t); bytes > 0) {
          unfreed_.push_back({calls_.size() - 1, calls_.back().storages.size(),
                              WeakStorage::reclaim_copy(t.storage().unsafeGetStorageImpl())});
          calls_.back().storages.push_back({bytes});
        }
      });
    }
  }

  StepPhases finish() {
    close();
    return StepPhases(std::move(phases_), std::move(calls_), static_cast<int>(index_.size()));
  }

 private:
  void end_stretch(bool gap) {
    current_.step_peaks.push_back(probe_.peak() - base_);
    current_.step_is_gap.push_back(gap);
    probe_.reset_peak();
  }

  // Notes the storages found freed by `now`.
  void find_freed(StepPoint now) {
    auto freed = std::remove_if(unfreed_.begin(), unfreed_.end(), [&](const Watched& w) {
      if (!w.storage.expired()) {
        return false;
      }
      calls_[w.call].storages[w.index].freed = now;
      return true;
    });
    unfreed_.erase(freed, unfreed_.end());
  }

  void close() {
    const StepPoint now{phases_.size(), current_.step_peaks.size()};
    end_stretch(/*gap=*/true);
    current_.peak = *std::max_element(current_.step_peaks.begin(), current_.step_peaks.end());
    find_freed(now);
    phases_.push_back(std::move(current_));
  }

  void mark(StepPhase::Kind kind, int region) {
    close();
    current_ = StepPhase{kind, region, 0, {}, {}, {}};
    for (size_t i = 0; i < alive_.size(); ++i) {
      if (alive_[i]) {
        current_.alive.push_back(static_cast<int>(i));
      }
    }
  }

  const MemoryProbe& probe_;
  const int64_t base_;
  StepPhase current_;
  std::vector<StepPhase> phases_;
  std::unordered_map<const void*, int> index_;
  std::vector<bool> alive_;
  std::vector<int> running_;  // regions whose forward runs, innermost last
  std::vector<std::unordered_map<c10::OperatorHandle, size_t>> calls_of_;  // per region
  std::vector<StepCall> calls_;
  // The storages the calls made that were not found freed yet.
  struct Watched {
    size_t call;
    size_t index;  // in the call's storages
    WeakStorage storage;
  };
  std::vector<Watched> unfreed_;
  NewStorages storages_;
};

const char* kind_name(StepPhase::Kind kind) {
  switch (kind) {
    case StepPhase::Kind::Between: return "between";
    case StepPhase::Kind::Forward: return "forward";
    case StepPhase::Kind::Backward: return "backward";
  }
  return "?";
}

}  // namespace

int64_t StepPhases::peak() const {
  int64_t peak = 0;
  for (const auto& phase : phases_) {
    peak = std::max(peak, phase.peak);
  }
  return peak;
}

std::vector<int64_t> StepPhases::predicted_phases(const BudgetedPlan& plan) const {
  TORCH_CHECK(plan.kept_calls.size() == static_cast<size_t>(regions_),
              "sac::StepPhases::predict_peak: the step ran ", regions_,
              " regions, but the plan has ", plan.kept_calls.size(),
              " policies; plan one policy per region, in the order their forwards begin.");
  // Each kept call's index among the step's calls, with the plan's bytes.
  std::vector<std::vector<std::pair<size_t, int64_t>>> kept(regions_);
  for (int region = 0; region < regions_; ++region) {
    for (const auto& k : plan.kept_calls[region]) {
      const auto found = std::find_if(calls_.begin(), calls_.end(), [&](const StepCall& c) {
        return c.region == region && c.op == k.op && c.call == k.call;
      });
      TORCH_CHECK(found != calls_.end(), "sac::StepPhases::predict_peak: region ", region,
                  " of the plan keeps call ", k.call, " of ", toString(k.op.operator_name()),
                  ", which region ", region, " of the measured step did not make. Profile "
                  "and measure the same step, with its regions in the same order.");
      kept[region].emplace_back(static_cast<size_t>(found - calls_.begin()), k.bytes);
    }
  }
  // What keeping call `call` (`plan_bytes` by the plan) adds at a moment,
  // storage by storage, by whether the measured step had freed it. A call
  // that made no storage but is planned to keep bytes (an alias of an
  // unkeepable call's output) adds them always.
  auto adds = [&](size_t call, int64_t plan_bytes, auto&& freed_then) {
    const StepCall& c = calls_[call];
    if (c.storages.empty()) {
      return plan_bytes;
    }
    int64_t bytes = 0;
    for (const auto& storage : c.storages) {
      bytes += freed_then(storage.freed) ? storage.bytes : 0;
    }
    return bytes;
  };
  std::vector<int64_t> predicted;
  for (size_t p = 0; p < phases_.size(); ++p) {
    const StepPhase& phase = phases_[p];
    std::vector<int> adding = phase.alive;
    if (phase.kind == StepPhase::Kind::Forward) {
      adding.push_back(phase.region);
    }
    int64_t bytes = 0;
    for (size_t s = 0; s < phase.step_peaks.size(); ++s) {
      // A gap's peak is where it begins (ops allocate; between them memory
      // is only freed): a kept output adds its bytes there if the measured
      // step had freed it before. In an op's stretch, if freed by its end.
      const StepPoint now{p, s};
      const bool gap = phase.step_is_gap[s];
      int64_t added = 0;
      for (const int region : adding) {
        for (const auto& [call, plan_bytes] : kept[region]) {
          if (calls_[call].made < now) {
            added += adds(call, plan_bytes, [&](StepPoint freed) {
              return gap ? freed < now : !(now < freed);
            });
          }
        }
      }
      bytes = std::max(bytes, phase.step_peaks[s] + added);
    }
    predicted.push_back(bytes);
  }
  return predicted;
}

int64_t StepPhases::predict_peak(const BudgetedPlan& plan) const {
  const std::vector<int64_t> predicted = predicted_phases(plan);
  return predicted.empty() ? 0 : *std::max_element(predicted.begin(), predicted.end());
}

void StepPhases::print(std::ostream& out, const BudgetedPlan* plan) const {
  const std::vector<int64_t> predicted =
      plan != nullptr ? predicted_phases(*plan) : std::vector<int64_t>();
  out << std::left << std::setw(10) << "phase" << std::right << std::setw(8) << "region"
      << std::setw(16) << "measured" << (plan != nullptr ? "       predicted" : "")
      << "  alive\n";
  for (size_t i = 0; i < phases_.size(); ++i) {
    const StepPhase& phase = phases_[i];
    out << std::left << std::setw(10) << kind_name(phase.kind) << std::right << std::setw(8)
        << phase.region << std::setw(16) << phase.peak;
    if (plan != nullptr) {
      out << std::setw(16) << predicted[i];
    }
    out << "  " << phase.alive.size() << " regions\n";
  }
}

StepPhases measure_step_phases(const MemoryProbe& probe, const std::function<void()>& step) {
  TORCH_CHECK(probe.live && probe.peak && probe.reset_peak,
              "sac::measure_step_phases: the probe needs live, peak and reset_peak.");
  // Under per-op kernels, the cacheable ops must be intercepted to be seen.
  dispatch::intercept_ops_matching(&policy::is_cacheable);
  PhaseRecorder recorder(probe);
  {
    detail::RegionEventsGuard listening(&recorder);
    dispatch::ObserverGuard observing(&recorder);
    step();
  }
  return recorder.finish();
}

}  // namespace sac
