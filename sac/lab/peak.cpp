#include <sac/lab/peak.h>

#include <sac/base/internal/region_events.h>
#include <sac/cache/internal/new_storages.h>
#include <sac/dispatch/internal/boxed.h>
#include <sac/dispatch/internal/interceptor.h>
#include <sac/lab/internal/choices.h>
#include <sac/lab/internal/knapsack.h>
#include <sac/policy/internal/op_traits.h>

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <optional>
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
    find_freed(now);
    phases_.push_back(std::move(current_));
  }

  void mark(StepPhase::Kind kind, int region) {
    close();
    current_ = StepPhase{kind, region, {}, {}, {}};
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

int64_t StepPhase::peak() const {
  return *std::max_element(step_peaks.begin(), step_peaks.end());
}

int64_t StepPhases::peak() const {
  int64_t peak = 0;
  for (const auto& phase : phases_) {
    peak = std::max(peak, phase.peak());
  }
  return peak;
}

size_t StepPhases::find_call(int region, const c10::OperatorHandle& op, size_t call) const {
  const auto found = std::find_if(calls_.begin(), calls_.end(), [&](const StepCall& c) {
    return c.region == region && c.op == op && c.call == call;
  });
  TORCH_CHECK(found != calls_.end(), "sac::StepPhases: region ", region, " of the plan keeps call ",
              call, " of ", toString(op.operator_name()), ", which region ", region,
              " of the measured step did not make. Profile and measure the same step, with its "
              "regions in the same order.");
  return static_cast<size_t>(found - calls_.begin());
}

bool StepPhases::counts(const StepPhase& phase, int region) {
  return std::find(phase.alive.begin(), phase.alive.end(), region) != phase.alive.end() ||
         (phase.kind == StepPhase::Kind::Forward && phase.region == region);
}

int64_t StepPhases::adds_at(size_t call, int64_t plan_bytes, size_t phase, size_t step) const {
  const StepCall& c = calls_[call];
  const StepPoint now{phase, step};
  if (!(c.made < now)) {
    return 0;
  }
  if (c.storages.empty()) {
    return plan_bytes;  // an alias of an unkeepable call's output: always
  }
  // A gap's peak is where it begins (ops allocate; between them memory is
  // only freed): a storage adds its bytes there if the measured step had
  // freed it before. In an op's stretch, if freed by its end.
  const bool gap = phases_[phase].step_is_gap[step];
  int64_t bytes = 0;
  for (const auto& storage : c.storages) {
    bytes += (gap ? storage.freed < now : !(now < storage.freed)) ? storage.bytes : 0;
  }
  return bytes;
}

std::vector<int64_t> StepPhases::predicted_phases(
    const std::vector<std::vector<KeptCall>>& kept_calls) const {
  TORCH_CHECK(kept_calls.size() == static_cast<size_t>(regions_),
              "sac::StepPhases::predict_peak: the step ran ", regions_,
              " regions, but the plan has ", kept_calls.size(),
              " policies; plan one policy per region, in the order their forwards begin.");
  // Each kept call's index among the step's calls, with the plan's bytes.
  std::vector<std::vector<std::pair<size_t, int64_t>>> kept(regions_);
  for (int region = 0; region < regions_; ++region) {
    for (const auto& k : kept_calls[region]) {
      kept[region].emplace_back(find_call(region, k.op, k.call), k.bytes);
    }
  }
  std::vector<int64_t> predicted;
  for (size_t p = 0; p < phases_.size(); ++p) {
    const StepPhase& phase = phases_[p];
    std::vector<int> counted;
    for (int region = 0; region < regions_; ++region) {
      if (counts(phase, region)) {
        counted.push_back(region);
      }
    }
    int64_t bytes = 0;
    for (size_t s = 0; s < phase.step_peaks.size(); ++s) {
      int64_t added = 0;
      for (const int region : counted) {
        for (const auto& [call, plan_bytes] : kept[region]) {
          added += adds_at(call, plan_bytes, p, s);
        }
      }
      bytes = std::max(bytes, phase.step_peaks[s] + added);
    }
    predicted.push_back(bytes);
  }
  return predicted;
}

int64_t StepPhases::predict_peak(const std::vector<std::vector<KeptCall>>& kept_calls) const {
  const std::vector<int64_t> predicted = predicted_phases(kept_calls);
  return predicted.empty() ? 0 : *std::max_element(predicted.begin(), predicted.end());
}

PeakPlan StepPhases::plan_for_peak(const std::vector<RegionProfile>& profiles,
                                   int64_t peak_bytes, std::optional<OffloadCost> offload,
                                   size_t grid) const {
  TORCH_CHECK(profiles.size() == static_cast<size_t>(regions_),
              "sac::StepPhases::plan_for_peak: the step ran ", regions_, " regions, but ",
              profiles.size(), " profiles were given; give one per region, in order.");
  TORCH_CHECK(grid >= 2, "sac::StepPhases::plan_for_peak: grid must be at least 2.");
  TORCH_CHECK(peak() <= peak_bytes, "sac::StepPhases::plan_for_peak: the step's peak under "
              "full recomputation is ", peak(), " bytes, over the budget of ", peak_bytes,
              " bytes: no plan of what to keep fits. Raise the budget, or shrink the step "
              "(smaller batches, more regions).");
  const auto start = std::chrono::steady_clock::now();
  const int64_t everything =
      budgeted_plan(profiles, Budget::fraction(1.0)).budget_bytes;

  PeakPlan best;
  best.peak_budget = peak_bytes;
  size_t tried = 0;
  // What a plan costs a step: its recomputation and its offloads' trips.
  auto cost = [](const BudgetedPlan& plan) {
    return plan.recompute_seconds + plan.offload_seconds;
  };
  // Tries the plan at `bytes`: whether its predicted peak fits; keeps it if
  // it costs least so far.
  auto fits = [&](int64_t bytes) {
    ++tried;
    BudgetedPlan plan = budgeted_plan(profiles, Budget::bytes(bytes), offload);
    const int64_t predicted = predict_peak(plan);
    if (predicted > peak_bytes) {
      return false;
    }
    if (tried == 1 || cost(plan) < cost(best.plan)) {
      best.plan = std::move(plan);
      best.predicted_peak = predicted;
    }
    return true;
  };
  auto grid_bytes = [&](size_t i) {
    return static_cast<int64_t>(static_cast<double>(everything) * static_cast<double>(i) /
                                static_cast<double>(grid - 1));
  };
  fits(0);  // full recomputation fits (checked above)
  int64_t last_fit = 0;             // the greatest grid budget that fits
  int64_t lo = 0;                   // the greatest that fits below `hi`
  std::optional<int64_t> hi;        // the least that does not fit
  for (size_t i = 1; i < grid; ++i) {
    const int64_t bytes = grid_bytes(i);
    if (fits(bytes)) {
      last_fit = bytes;
      lo = hi ? lo : bytes;
    } else if (!hi) {
      hi = bytes;
    }
  }
  if (hi && *hi > last_fit) {  // halve between the last fit below it and it
    while (*hi - lo > std::max<int64_t>(1, everything / 4096)) {
      const int64_t mid = lo + (*hi - lo) / 2;
      (fits(mid) ? lo : *hi) = mid;
    }
  }

  // The bound: at a stretch, any plan that fits keeps choices whose bytes
  // there sum to at most the stretch's headroom; the best such (exact
  // knapsack) saves at least as much as any plan that fits.
  std::vector<lab::CallChoice> choices;
  for (size_t r = 0; r < profiles.size(); ++r) {
    for (auto& c : lab::choices_of(profiles[r], r, offload)) {
      choices.push_back(std::move(c));
    }
  }
  std::vector<std::vector<std::pair<size_t, int64_t>>> members(choices.size());
  double everything_seconds = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    for (const OpCallProfile* call : choices[i].calls) {
      members[i].emplace_back(find_call(static_cast<int>(choices[i].profile), call->op, call->call),
                              call == choices[i].calls.front() ? choices[i].bytes : 0);
    }
    everything_seconds += choices[i].left.seconds;
  }
  auto bound_at = [&](size_t p, size_t step) {
    std::vector<lab::Item> items;
    for (size_t i = 0; i < choices.size(); ++i) {
      int64_t weight = 0;
      if (counts(phases_[p], static_cast<int>(choices[i].profile))) {
        for (const auto& [call, bytes] : members[i]) {
          weight += adds_at(call, bytes, p, step);
        }
      }
      items.push_back({weight, choices[i].left.seconds});
    }
    const lab::Choice relaxed = lab::solve_knapsack(items, peak_bytes - phases_[p].step_peaks[step]);
    return relaxed.exact ? relaxed.value : relaxed.upper_bound;
  };
  // The stretches: where every region's kept outputs count (after the last
  // forward), and where the plan's prediction peaks.
  double bound = everything_seconds;
  const std::vector<int64_t> predicted = predicted_phases(best.plan.kept_calls);
  for (size_t p = 0; p < phases_.size(); ++p) {
    const bool all_alive = phases_[p].alive.size() == static_cast<size_t>(regions_);
    if (all_alive || predicted[p] == best.predicted_peak) {
      for (size_t step = 0; step < phases_[p].step_peaks.size(); ++step) {
        bound = std::min(bound, bound_at(p, step));
      }
    }
  }
  // The least any plan that fits can cost: every profiled call's time, with
  // each choice left out the cheaper way, less the bound on what keeping
  // saves over that.
  double least = -bound;
  for (const auto& profile : profiles) {
    for (const auto& call : profile.calls()) {
      least += call.seconds;
    }
  }
  for (const auto& choice : choices) {
    least += choice.left.seconds;
    for (const OpCallProfile* call : choice.calls) {
      least -= call->seconds;
    }
  }
  best.gap_seconds = std::max(0.0, cost(best.plan) - least);
  best.exact = best.gap_seconds <= 1e-12;
  best.byte_budgets_tried = tried;
  best.solver_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return best;
}

void StepPhases::print(std::ostream& out, const BudgetedPlan* plan) const {
  const std::vector<int64_t> predicted =
      plan != nullptr ? predicted_phases(plan->kept_calls) : std::vector<int64_t>();
  out << std::left << std::setw(10) << "phase" << std::right << std::setw(8) << "region"
      << std::setw(16) << "measured" << (plan != nullptr ? "       predicted" : "")
      << "  alive\n";
  for (size_t i = 0; i < phases_.size(); ++i) {
    const StepPhase& phase = phases_[i];
    out << std::left << std::setw(10) << kind_name(phase.kind) << std::right << std::setw(8)
        << phase.region << std::setw(16) << phase.peak();
    if (plan != nullptr) {
      out << std::setw(16) << predicted[i];
    }
    out << "  " << phase.alive.size() << " regions\n";
  }
}

MemoryProbe device_memory_probe(c10::Device device) {
  TORCH_CHECK(device.type() != c10::DeviceType::CPU,
              "sac::device_memory_probe: the CPU has no caching device allocator to read; on the "
              "CPU, give sac::MemoryProbe your allocator's counters (examples/memory_meter.h).");
  c10::Allocator* registered = nullptr;
  try {
    registered = c10::GetAllocator(device.type());
  } catch (const c10::Error&) {  // none registered: c10 asserts
  }
  auto* allocator = dynamic_cast<c10::DeviceAllocator*>(registered);
  TORCH_CHECK(allocator != nullptr, "sac::device_memory_probe: ", device.type(),
              " has no caching device allocator (",
              registered == nullptr ? "none is registered: is its backend loaded?"
                                    : "its allocator is not a c10::DeviceAllocator",
              "), so there are no statistics to read; give sac::MemoryProbe the allocator's "
              "counters yourself.");
  const c10::DeviceIndex index = device.has_index() ? device.index() : 0;
  constexpr size_t kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return {[allocator, index] {
            return allocator->getDeviceStats(index).allocated_bytes[kAll].current;
          },
          [allocator, index] { return allocator->getDeviceStats(index).allocated_bytes[kAll].peak; },
          [allocator, index] { allocator->resetPeakStats(index); },
          [allocator, index] {
            const auto stats = allocator->getDeviceStats(index);
            const int64_t cached =
                stats.reserved_bytes[kAll].current - stats.allocated_bytes[kAll].current;
            return static_cast<int64_t>(allocator->getMemoryInfo(index).first) + cached;
          }};
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
