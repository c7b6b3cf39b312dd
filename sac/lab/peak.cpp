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

// Note [A region left unchecked]
// A region the plan leaves unchecked runs plainly: autograd holds what it
// saves until the node that saved it has run, and the region has no frame
// and no recomputation. The measured step, every region recomputing
// everything, heard all of that (sac/lab/internal/step_trace.h): each
// tensor the region's forward saved, packed by the frame, and when autograd
// let go of it (its holder died: the node ran, or the graph died); the
// region's inputs, which its frame held, and when the rest of the program
// let go of them. So against the measured trace:
//  1. a storage the forward saved lives on until autograd let go of it;
//  2. an input lives on until the rest of the program let go of it, or until
//     autograd let go of what the forward saved of it, whichever is later,
//     not until the frame let go of it;
//  3. nothing of its recomputation happens: every allocation made there is
//     gone, with its free (the served calls' rule, for all of them).

Changes changes_of(const StepTrace& trace, const std::vector<std::vector<SavedCall>>& kept,
                   const std::vector<bool>& checkpointed = {}) {
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
  // What events [begin, end) allocate does not happen.
  auto serve = [&](size_t begin, size_t end) {
    for (size_t e = begin; e < end; ++e) {
      if (trace.events[e].delta > 0) {
        served.insert(trace.events[e].allocation);
      }
    }
  };
  // Inputs of regions left unchecked: freed where the program and autograd
  // let go of them, not the frame (then no earlier than held).
  std::unordered_map<size_t, size_t> dropped;
  struct Standing {  // a kept output on a storage made before its call
    size_t kept;
    size_t recomputed;
    const SavedCall* call;
  };
  std::vector<Standing> standing;
  Changes changes;
  for (size_t r = 0; r < kept.size(); ++r) {
    const TracedRegion& region = trace.regions[r];
    if (!checkpointed.empty() && !checkpointed[r]) {  // Note [A region left unchecked]
      TORCH_CHECK(region.heard_whole, "sac::StepPhases::predict_peak: the plan leaves region ", r,
                  " unchecked, but its frame did not tell the measured step what it saves and "
                  "holds (a region of PyTorch's checkpoint, or a sac::CheckpointRegion), so how "
                  "it runs plainly is not known. Checkpoint it with sac::checkpoint, or plan "
                  "with unchecked_regions off.");
      for (const detail::TracedSave& save : region.saves) {
        hold(save.allocation, save.released);
      }
      if (region.recompute_begin != kNever) {
        serve(region.recompute_begin, region.recompute_end);
      }
      for (const detail::HeldInput& input : region.inputs) {
        const size_t plain_free =
            input.saved ? std::max(input.dropped, input.saves_released) : input.dropped;
        if (input.freed == kNever || plain_free >= input.freed) {
          continue;
        }
        const size_t allocation = trace.events[input.freed].allocation;
        if (allocation != kNever) {
          auto [it, added] = dropped.emplace(allocation, plain_free);
          it->second = std::min(it->second, plain_free);
        } else {  // made before the step
          changes.removed.push_back(input.freed);
          changes.frees.emplace_back(plain_free, -trace.events[input.freed].delta);
        }
      }
      continue;
    }
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
      serve(recomputed->begin, recomputed->end);
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
  // Each moved free: no earlier than held, from where it was freed (or,
  // for an unchecked region's input, where nothing but its frame held it).
  auto move_free = [&](size_t allocation, size_t from, std::optional<size_t> held_until) {
    const size_t freed = allocations[allocation].freed;
    const size_t until = held_until.has_value() ? std::max(from, *held_until) : from;
    if (until != freed) {
      if (freed != kNever) {
        changes.removed.push_back(freed);
      }
      if (until != kNever) {
        changes.frees.emplace_back(until, allocations[allocation].bytes);
      }
    }
  };
  for (const auto& [allocation, until] : held) {
    const auto early = dropped.find(allocation);
    move_free(allocation, early != dropped.end() ? early->second : allocations[allocation].freed,
              until);
  }
  for (const auto& [allocation, at] : dropped) {
    if (held.count(allocation) == 0) {
      move_free(allocation, at, std::nullopt);
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
      budgeted_plan(profiles, Budget::of_everything_saveable(1.0), std::nullopt, false)
          .budget_bytes;
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
    if (plan_cost(plan) < plan_cost(best.plan)) {
      best.plan = std::move(plan);
      best.predicted_peak = predicted;
    }
    return true;
  };
  auto grid_bytes = [&](size_t i) {
    return static_cast<int64_t>(static_cast<double>(everything) * static_cast<double>(i) /
                                static_cast<double>(grid - 1));
  };
  // Full recomputation fits (the caller checked).
  best.plan = detail::plan_keeping_nothing(profiles);
  best.predicted_peak = step.peak();
  ++tried;
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
    const BudgetedPlan all =
        budgeted_plan(profiles, Budget::of_everything_saveable(1.0), offload, false);
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

}  // namespace

StepPhases::StepPhases(std::shared_ptr<const detail::StepTrace> trace)
    : trace_(std::move(trace)), live_(trace_->live()) {
  std::vector<StepPhase> phases = trace_->phases;
  for (StepPhase& phase : phases) {
    phase.peak = phase_peak(live_, phase);
  }
  phases_ = std::move(phases);
  // The plain step's peak, predicted once where every region was heard whole.
  const auto& regions = trace_->regions;
  for (size_t r = 0; r < regions.size(); ++r) {
    if (!regions[r].heard_whole) {
      why_no_plain_peak_ =
          "region " + std::to_string(r) +
          "'s frame did not tell the measured step what it saves and holds (a region of "
          "PyTorch's checkpoint, or a sac::CheckpointRegion), so how it runs plainly is not "
          "predicted; give the plain step's peak (with_plain_peak)";
      return;
    }
  }
  plain_peak_ =
      simulate(*trace_, changes_of(*trace_, std::vector<std::vector<SavedCall>>(regions.size()),
                                   std::vector<bool>(regions.size(), false)))
          .peak;
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

int64_t StepPhases::left() const { return live_.empty() ? 0 : live_.back(); }

int64_t StepPhases::predict_peak(const BudgetedPlan& plan) const {
  if (!plan.checkpointed.empty() &&
      std::none_of(plan.checkpointed.begin(), plan.checkpointed.end(), [](bool c) { return c; })) {
    check_one_policy_per_region(*trace_, plan.checkpointed.size());
    const std::optional<int64_t> plain = plain_peak();
    TORCH_CHECK(plain.has_value(),
                "sac::StepPhases::predict_peak: the plan checkpoints no "
                "region, and the plain step's peak is not known: ",
                why_no_plain_peak(), ".");
    return *plain;
  }
  return simulate(*trace_, changes_of(*trace_, plan.saved_calls, plan.checkpointed)).peak;
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
  // Not checkpointing is a plan where its peak is known.
  const std::optional<int64_t> plain = plain_peak();
  if (plain.has_value() && *plain <= peak_bytes) {
    PeakPlan plain_plan;
    plain_plan.plan = detail::plan_unchecked(profiles);
    plain_plan.peak_budget = peak_bytes;
    plain_plan.predicted_peak = *plain;
    plain_plan.exact = true;  // it recomputes nothing
    return plain_plan;
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
    predicted =
        simulate(*trace_, changes_of(*trace_, plan->saved_calls, plan->checkpointed)).peak_at;
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

StepPhases measure_step_phases(const std::function<void()>& step) {
  return measure_step_phases(MemoryProbe{}, step);
}

StepPhases measure_step_phases(const MemoryProbe& probe, const std::function<void()>& step) {
  auto trace = std::make_shared<const detail::StepTrace>(detail::trace_step(probe, step));
  TORCH_CHECK(!trace->regions.empty(),
              "sac::measure_step_phases: the step ran no sac region, so there is nothing to "
              "plan. Checkpoint its layers with sac::checkpoint (or sac's contexts under "
              "PyTorch's checkpoint) keeping nothing, and measure the step that runs them.");
  return StepPhases(std::move(trace));
}

}  // namespace sac
