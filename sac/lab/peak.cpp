#include <sac/lab/peak.h>

#include <sac/lab/internal/choices.h>
#include <sac/lab/internal/knapsack.h>
#include <sac/lab/internal/step_trace.h>

#include <sac/base/internal/region_events.h>

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace sac {
namespace {

using detail::kNever;
using detail::StepTrace;
using detail::TracedCall;
using detail::TracedRegion;

// Note [A plan's trace]
// The measured step keeps nothing. Under a plan the step runs the same ops in the
// same order (the recomputation runs the forward's calls again and stops where
// the measured one stopped: once every tensor autograd saved is made again),
// and its trace's allocations are the measured trace's but for three changes, per
// call K the plan keeps:
//  1. K's forward outputs are held by the cache until the recomputation takes
//     them (at K's call there), or until the recomputation ends if it stops
//     before K, or until the region's frame is released if nothing recomputes
//     it (its forward saved nothing autograd needs), or until the forward
//     ends if K was demoted (modified in place later: the cache drops it
//     then). Their frees move no earlier than that.
//  2. K's call in the recomputation is served from the cache: nothing it
//     allocated in the measured trace is allocated (its outputs, its
//     temporaries), but a random call restores the generator, which on the
//     CPU allocates its state for a moment.
//  3. The served outputs stand where the recomputed ones stood, so a kept
//     storage is freed no earlier than the recomputed storage it replaces
//     was.
// Those changes are exact if the op calls allocate the same bytes in both
// traces, which holds for ops that see the same shapes; what cannot be placed
// so (a kept call whose output lies on the storage of a call the plan
// recomputes: that storage's lifetime in the recomputation changes) is an
// error, not a guess.

// A plan's changes to the measured trace's events.
struct Changes {
  std::vector<size_t> removed;                      // events that do not happen
  std::vector<std::pair<size_t, int64_t>> frees;    // bytes freed before an event
  std::vector<std::pair<size_t, int64_t>> moments;  // bytes allocated for a moment there
};

const TracedCall* find_call(
    const std::unordered_map<c10::OperatorHandle, std::vector<TracedCall>>& calls,
    const c10::OperatorHandle& op, size_t call_index) {
  const auto found = calls.find(op);
  return found == calls.end() || call_index >= found->second.size() ? nullptr
                                                                    : &found->second[call_index];
}

void check_one_policy_per_region(const StepTrace& trace, size_t policies) {
  TORCH_CHECK(policies == trace.regions.size(), "sac::StepPhases::predict_peak: the step ran ",
              trace.regions.size(), " regions, but the plan has ", policies,
              " policies; plan one policy per region, in the order their forwards begin.");
}

Changes changes_of(const StepTrace& trace, const std::vector<std::vector<SavedCall>>& kept) {
  check_one_policy_per_region(trace, kept.size());
  const auto& allocations = trace.allocations;
  std::unordered_map<size_t, size_t> held;  // allocation: freed no earlier than
  auto hold = [&](size_t allocation, size_t position) {
    if (allocation != kNever) {
      auto [it, added] = held.emplace(allocation, position);
      it->second = std::max(it->second, position);
    }
  };
  std::unordered_set<size_t> served;  // allocations of served calls
  struct Standing {                   // a kept output on a storage made before its call
    size_t kept;
    size_t recomputed;
    const SavedCall* call;
  };
  std::vector<Standing> standing;
  Changes changes;
  for (size_t r = 0; r < kept.size(); ++r) {
    const TracedRegion& region = trace.regions[r];
    for (const SavedCall& k : kept[r]) {
      const TracedCall* forward = find_call(region.forward, k.op, k.call);
      TORCH_CHECK(forward != nullptr, "sac::StepPhases: region ", r, " of the plan keeps call ",
                  k.call, " of ", toString(k.op.operator_name()), ", which region ", r,
                  " of the measured step did not make. Profile and measure the same step, with "
                  "its regions in the same order.");
      if (k.demoted) {
        for (const size_t output : forward->outputs) {
          hold(output, region.forward_end);
        }
        continue;
      }
      const TracedCall* recomputed = find_call(region.recompute, k.op, k.call);
      if (recomputed == nullptr) {
        // Past the recomputation's stop: released as it ends. Never
        // recomputed (the forward saved nothing autograd needs): released
        // with the region's frame.
        const size_t until =
            region.recompute_begin != kNever ? region.recompute_end : region.released;
        for (const size_t output : forward->outputs) {
          hold(output, until);
        }
        continue;
      }
      for (size_t e = recomputed->begin; e < recomputed->end; ++e) {
        if (trace.events[e].delta > 0) {
          served.insert(trace.events[e].allocation);
        }
      }
      for (size_t i = 0; i < recomputed->outputs.size(); ++i) {
        const size_t mine = i < forward->outputs.size() ? forward->outputs[i] : kNever;
        const size_t theirs = recomputed->outputs[i];
        hold(mine, recomputed->begin);
        if (theirs == kNever) {
          continue;
        }
        if (allocations[theirs].made >= recomputed->begin &&
            allocations[theirs].made < recomputed->end) {
          hold(mine, allocations[theirs].freed);
        } else {
          standing.push_back({mine, theirs, &k});
        }
      }
      if (recomputed->random && trace.on_cpu) {
        changes.moments.emplace_back(recomputed->begin, trace.rng_state_bytes);
      }
    }
  }
  for (const Standing& s : standing) {
    TORCH_CHECK(served.count(s.recomputed) > 0,
                "sac::StepPhases::predict_peak: the plan keeps "
                "call ",
                s.call->call, " of ", toString(s.call->op.operator_name()),
                ", whose output lies on the storage of an earlier call that the plan "
                "recomputes (a view or aten::_unsafe_view of it). When the recomputation frees "
                "that storage then is not in the measured step, so the peak is not predicted. "
                "Keep the call that made the storage too (budgeted plans keep calls that share "
                "a storage together).");
    hold(s.kept, allocations[s.recomputed].freed);
  }
  for (const size_t allocation : served) {
    changes.removed.push_back(allocations[allocation].made);
    if (allocations[allocation].freed != kNever) {
      changes.removed.push_back(allocations[allocation].freed);
    }
  }
  for (const auto& [allocation, until] : held) {
    const size_t freed = allocations[allocation].freed;
    if (until == kNever || (freed != kNever && until > freed)) {
      if (freed != kNever) {
        changes.removed.push_back(freed);
      }
      if (until != kNever) {
        changes.frees.emplace_back(until, allocations[allocation].bytes);
      }
    }
  }
  return changes;
}

// The step's bytes under `changes`: at each event, the most live at once
// (after it, or for a moment before it); and the peak's event.
struct Simulated {
  std::vector<int64_t> peak_at;
  int64_t peak = 0;
  size_t at = 0;
};

Simulated simulate(const StepTrace& trace, const Changes& changes) {
  const size_t n = trace.events.size();
  std::vector<char> removed(n, 0);
  for (const size_t e : changes.removed) {
    removed[e] = 1;
  }
  std::vector<int64_t> freed(n + 1, 0), moment(n + 1, 0);
  for (const auto& [position, bytes] : changes.frees) {
    freed[position] += bytes;
  }
  for (const auto& [position, bytes] : changes.moments) {
    moment[position] = std::max(moment[position], bytes);
  }
  Simulated out;
  out.peak_at.resize(n);
  int64_t live = 0;
  for (size_t e = 0; e <= n; ++e) {
    live -= freed[e];
    int64_t here = live + moment[e];
    if (e == n) {
      if (here > out.peak) {
        out.peak = here;
        out.at = n > 0 ? n - 1 : 0;
      }
      break;
    }
    if (removed[e] == 0) {
      live += trace.events[e].delta;
    }
    here = std::max(here, live);
    out.peak_at[e] = here;
    if (here > out.peak) {
      out.peak = here;
      out.at = e;
    }
  }
  return out;
}

// What `changes` add to the bytes live after event `at` (negative where they
// free or skip).
int64_t added_at(const StepTrace& trace, const Changes& changes, size_t at) {
  int64_t bytes = 0;
  std::unordered_set<size_t> seen;
  for (const size_t e : changes.removed) {
    if (e <= at && seen.insert(e).second) {
      bytes -= trace.events[e].delta;
    }
  }
  for (const auto& [position, freed] : changes.frees) {
    bytes -= position <= at ? freed : 0;
  }
  return bytes;
}

const char* kind_name(StepPhase::Kind kind) {
  switch (kind) {
    case StepPhase::Kind::Between: return "between";
    case StepPhase::Kind::Forward: return "forward";
    case StepPhase::Kind::Backward: return "backward";
  }
  return "?";
}

// The most live over a phase's events (and as it begins).
int64_t phase_peak(const std::vector<int64_t>& after, const StepPhase& phase) {
  int64_t peak = phase.begin > 0 ? after[phase.begin - 1] : 0;
  for (size_t e = phase.begin; e < phase.end; ++e) {
    peak = std::max(peak, after[e]);
  }
  return peak;
}

// What a plan costs a step: its recomputation and its offloads' trips.
double plan_cost(const BudgetedPlan& plan) { return plan.recompute_seconds + plan.offload_seconds; }

// Note [Planning for a peak]
// A plan is the budgeted plan of some byte budget (sac/lab/budget.h): the
// search tries byte budgets, predicts each plan's peak from the step's
// trace, and keeps the cheapest plan whose peak fits. Then a bound on what
// any plan that fits can cost says how far from the best that one may be
// (PeakPlan::gap_seconds).

// The search: `grid` byte budgets evenly from none to everything keepable,
// then halving between the greatest that fits and the next. The grid is the
// same for every peak budget, and the halving runs between its greatest
// budget that fits and the next: a greater peak budget fits the same grid
// budgets and more, and where it halves the same interval it moves up
// wherever this one does, so (the knapsack's cost falling with its budget)
// it never recomputes more.
PeakPlan cheapest_plan_that_fits(const StepPhases& step, const std::vector<RegionProfile>& profiles,
                                 int64_t peak_bytes, std::optional<OffloadCost> offload,
                                 size_t grid) {
  const int64_t everything =
      budgeted_plan(profiles, Budget::fraction(1.0), std::nullopt, false).budget_bytes;
  PeakPlan best;
  best.peak_budget = peak_bytes;
  size_t tried = 0;
  // Tries the plan at `bytes`: whether its predicted peak fits; keeps it if
  // it costs least so far.
  auto fits = [&](int64_t bytes) {
    ++tried;
    BudgetedPlan plan = budgeted_plan(profiles, Budget::bytes(bytes), offload, false);
    const int64_t predicted = step.predict_peak(plan);
    if (predicted > peak_bytes) {
      return false;
    }
    if (tried == 1 || plan_cost(plan) < plan_cost(best.plan)) {
      best.plan = std::move(plan);
      best.predicted_peak = predicted;
    }
    return true;
  };
  auto grid_bytes = [&](size_t i) {
    return static_cast<int64_t>(static_cast<double>(everything) * static_cast<double>(i) /
                                static_cast<double>(grid - 1));
  };
  fits(0);  // full recomputation fits (the caller checked)
  size_t greatest = 0;
  for (size_t i = 1; i < grid; ++i) {
    if (fits(grid_bytes(i))) {
      greatest = i;
    }
  }
  if (greatest + 1 < grid) {
    int64_t lo = grid_bytes(greatest);
    int64_t hi = grid_bytes(greatest + 1);
    while (hi - lo > std::max<int64_t>(1, everything / 4096)) {
      const int64_t mid = lo + (hi - lo) / 2;
      (fits(mid) ? lo : hi) = mid;
    }
  }
  best.byte_budgets_tried = tried;
  return best;
}

// The bound: after an event, any plan that fits keeps choices whose bytes
// there sum to at most the headroom; the best such (exact knapsack, with
// the choices that free bytes there taken) saves at least as much as any
// plan that fits. Asked at the events where `best` peaks and where keeping
// everything does. Returns the least any plan that fits can cost: every
// profiled call's time, with each choice left out the cheaper way, less the
// bound on what keeping saves over that.
double least_cost_that_fits(const StepTrace& trace, const std::vector<int64_t>& live,
                            const std::vector<RegionProfile>& profiles, int64_t peak_bytes,
                            std::optional<OffloadCost> offload, const BudgetedPlan& best) {
  std::vector<detail::CallChoice> choices;
  for (size_t r = 0; r < profiles.size(); ++r) {
    for (auto& c : detail::choices_of(profiles[r], r, offload)) {
      choices.push_back(std::move(c));
    }
  }
  std::vector<Changes> changes;
  double everything_seconds = 0;
  for (const auto& choice : choices) {
    std::vector<std::vector<SavedCall>> alone(profiles.size());
    for (const OpCallProfile* call : choice.calls) {
      alone[choice.profile].push_back({call->op, call->call, 0});
    }
    changes.push_back(changes_of(trace, alone));
    everything_seconds += choice.left.seconds;
  }
  auto bound_at = [&](size_t event) {
    std::vector<detail::Item> items;
    int64_t capacity = peak_bytes - live[event];
    double taken = 0;
    for (size_t i = 0; i < choices.size(); ++i) {
      const int64_t weight = added_at(trace, changes[i], event);
      if (weight <= 0) {
        capacity -= weight;
        taken += choices[i].left.seconds;
      } else {
        items.push_back({weight, choices[i].left.seconds});
      }
    }
    if (capacity < 0) {
      return 0.0;
    }
    const detail::Choice relaxed = detail::solve_knapsack(items, capacity);
    return taken + (relaxed.exact ? relaxed.value : relaxed.upper_bound);
  };
  double bound = everything_seconds;
  if (!live.empty()) {
    bound = std::min(bound, bound_at(simulate(trace, changes_of(trace, best.saved_calls)).at));
    const BudgetedPlan all = budgeted_plan(profiles, Budget::fraction(1.0), offload, false);
    bound = std::min(bound, bound_at(simulate(trace, changes_of(trace, all.saved_calls)).at));
  }
  double least = -bound;
  for (const auto& profile : profiles) {
    for (const auto& call : profile.calls()) {
      least += call.recompute_seconds();
    }
  }
  for (const auto& choice : choices) {
    least += choice.left.seconds;
    for (const OpCallProfile* call : choice.calls) {
      least -= call->recompute_seconds();
    }
  }
  return least;
}

// Note [The plain step]
// Leaving every region unchecked is the step without checkpointing, whose
// saved tensors the trace (every region keeping nothing) does not hold. So
// that plan's peak is measured, not predicted: the step runs once more with
// each sac region plain (RegionEvents::regions_run_plainly, which
// sac::checkpoint, sac::CheckpointRegion and Python's sac.context_fn under
// PyTorch's checkpoint ask), and the probe's peak is
// read. The two runs are alike only if the second starts from what the first
// did, so the plain one is measured only where the first left the live bytes
// as it found them (by its own trace: on ranks, Gloo's threads allocate
// beside it); and only if no region began as a checkpoint all the same
// (a checkpoint of one's own under create_selective_checkpoint_contexts,
// which cannot leave it).
// Mixing plain and checkpointed regions is not predicted.

// Hears the plain step's regions: it asks them to run plainly, and counts
// those that began as checkpoints all the same.
class PlainRegions final : public detail::RegionEvents {
 public:
  void forward_began(const void*) override { ++checkpointed; }
  void forward_ended(const void*) override {}
  void recomputation_began(const void*) override {}
  void recomputation_ended(const void*) override {}
  void released(const void*) override {}
  void outputs_kept(size_t) override {}
  bool regions_run_plainly() const override { return true; }

  size_t checkpointed = 0;
};

// The plain step's peak over its start, or none and why not. `left`: the
// bytes the recorded step left live, by its own trace (other threads, Gloo's
// on ranks, allocate and free beside it, which the probe counts too).
std::pair<std::optional<int64_t>, std::string> measure_plain_step(const MemoryProbe& probe,
                                                                  const std::function<void()>& step,
                                                                  int64_t left) {
  if (left != 0) {
    return {std::nullopt,
            "the recorded step left " + std::to_string(left) +
                " bytes more live than it found (gradients it made, an optimizer's state), "
                "so a second run would start elsewhere. Set the gradients to none at the "
                "step's end, and make the optimizer's state before measuring"};
  }
  PlainRegions plain;
  const int64_t base = probe.live();
  probe.reset_peak();
  {
    detail::RegionEventsGuard listening(&plain);
    step();
  }
  if (plain.checkpointed > 0) {
    return {std::nullopt,
            std::to_string(plain.checkpointed) +
                " region(s) checkpointed in the plain run all the same (a checkpoint of "
                "one's own under create_selective_checkpoint_contexts, which cannot run "
                "plainly). Give measure_step_phases a plain_step: the step with "
                "checkpointing off"};
  }
  return {probe.peak() - base, ""};
}

}  // namespace

StepPhases::StepPhases(std::shared_ptr<const detail::StepTrace> trace)
    : trace_(std::move(trace)), live_(trace_->live()) {
  std::vector<StepPhase> phases = trace_->phases;
  for (StepPhase& phase : phases) {
    phase.peak = phase_peak(live_, phase);
  }
  phases_ = std::move(phases);
}

const std::vector<StepPhase>& StepPhases::phases() const { return phases_; }
int StepPhases::regions() const { return static_cast<int>(trace_->regions.size()); }
size_t StepPhases::events() const { return trace_->events.size(); }

int64_t StepPhases::peak() const {
  int64_t peak = 0;
  for (const int64_t bytes : live_) {
    peak = std::max(peak, bytes);
  }
  return peak;
}

std::optional<int64_t> StepPhases::plain_peak() const { return plain_peak_; }

const std::string& StepPhases::why_no_plain_peak() const { return why_no_plain_peak_; }

StepPhases StepPhases::with_plain_peak(std::optional<int64_t> plain_peak,
                                       std::string why_not) const {
  TORCH_CHECK(!plain_peak.has_value() || *plain_peak >= 0,
              "sac::StepPhases::with_plain_peak: a peak must not be negative; got ", *plain_peak,
              ".");
  TORCH_CHECK(plain_peak.has_value() || !why_not.empty(),
              "sac::StepPhases::with_plain_peak: say why there is no plain peak.");
  StepPhases out = *this;
  out.plain_peak_ = plain_peak;
  out.why_no_plain_peak_ = plain_peak.has_value() ? "" : std::move(why_not);
  return out;
}

int64_t StepPhases::predict_peak(const BudgetedPlan& plan) const {
  const auto unchecked = std::count(plan.checkpointed.begin(), plan.checkpointed.end(), false);
  if (unchecked == 0) {
    return predict_peak(plan.saved_calls);
  }
  TORCH_CHECK(static_cast<size_t>(unchecked) == plan.checkpointed.size(),
              "sac::StepPhases::predict_peak: the plan leaves ", unchecked, " of its ",
              plan.checkpointed.size(),
              " regions unchecked and checkpoints the others; a mix is not predicted yet (Note "
              "[The plain step], sac/lab/peak.cpp). Plan with unchecked_regions off to predict "
              "its peak, or use plan_for_peak.");
  TORCH_CHECK(plain_peak_.has_value(),
              "sac::StepPhases::predict_peak: the plan checkpoints no region, and the plain "
              "step's peak was not measured: ",
              why_no_plain_peak_, ".");
  check_one_policy_per_region(*trace_, plan.checkpointed.size());
  return *plain_peak_;
}

int64_t StepPhases::predict_peak(const std::vector<std::vector<SavedCall>>& saved_calls) const {
  return simulate(*trace_, changes_of(*trace_, saved_calls)).peak;
}

PeakPlan StepPhases::plan_for_peak(const std::vector<RegionProfile>& profiles, int64_t peak_bytes,
                                   std::optional<OffloadCost> offload, size_t grid) const {
  TORCH_CHECK(profiles.size() == static_cast<size_t>(regions()),
              "sac::StepPhases::plan_for_peak: the step ran ", regions(), " regions, but ",
              profiles.size(), " profiles were given; give one per region, in order.");
  TORCH_CHECK(grid >= 2, "sac::StepPhases::plan_for_peak: grid must be at least 2.");
  if (plain_peak_.has_value() && *plain_peak_ <= peak_bytes) {
    PeakPlan plain;
    plain.plan = detail::plan_unchecked(profiles);
    plain.peak_budget = peak_bytes;
    plain.predicted_peak = *plain_peak_;
    plain.exact = true;  // it recomputes nothing
    return plain;
  }
  TORCH_CHECK(peak() <= peak_bytes,
              "sac::StepPhases::plan_for_peak: the step's peak under "
              "full recomputation is ",
              peak(), " bytes, over the budget of ", peak_bytes,
              " bytes: no plan of what to keep fits. Raise the budget, or shrink the step "
              "(smaller batches, more regions).");
  const auto start = std::chrono::steady_clock::now();
  PeakPlan best = cheapest_plan_that_fits(*this, profiles, peak_bytes, offload, grid);
  const double least =
      least_cost_that_fits(*trace_, live_, profiles, peak_bytes, offload, best.plan);
  best.gap_seconds = std::max(0.0, plan_cost(best.plan) - least);
  best.exact = best.gap_seconds <= 1e-12;
  best.solver_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return best;
}

void StepPhases::print(std::ostream& out, const BudgetedPlan* plan) const {
  std::vector<int64_t> predicted;
  if (plan != nullptr) {
    predicted = simulate(*trace_, changes_of(*trace_, plan->saved_calls)).peak_at;
  }
  out << std::left << std::setw(10) << "phase" << std::right << std::setw(8) << "region"
      << std::setw(10) << "events" << std::setw(16) << "measured"
      << (plan != nullptr ? "       predicted" : "") << "\n";
  for (const StepPhase& phase : phases_) {
    out << std::left << std::setw(10) << kind_name(phase.kind) << std::right << std::setw(8)
        << phase.region << std::setw(10) << phase.end - phase.begin << std::setw(16) << phase.peak;
    if (plan != nullptr) {
      out << std::setw(16) << phase_peak(predicted, phase);
    }
    out << "\n";
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
  return {
      [allocator, index] { return allocator->getDeviceStats(index).allocated_bytes[kAll].current; },
      [allocator, index] { return allocator->getDeviceStats(index).allocated_bytes[kAll].peak; },
      [allocator, index] { allocator->resetPeakStats(index); },
      [allocator, index] {
        const auto stats = allocator->getDeviceStats(index);
        const int64_t cached =
            stats.reserved_bytes[kAll].current - stats.allocated_bytes[kAll].current;
        return static_cast<int64_t>(allocator->getMemoryInfo(index).first) + cached;
      }};
}

StepPhases measure_step_phases(const MemoryProbe& probe, const std::function<void()>& step,
                               const std::function<void()>& plain_step) {
  StepPhases phases(std::make_shared<const detail::StepTrace>(detail::trace_step(probe, step)));
  const int64_t left = phases.live_.empty() ? 0 : phases.live_.back();
  std::tie(phases.plain_peak_, phases.why_no_plain_peak_) =
      measure_plain_step(probe, plain_step ? plain_step : step, left);
  return phases;
}

}  // namespace sac
