#include <sac/lab/peak.h>

#include <sac/lab/internal/choices.h>
#include <sac/lab/internal/peak_search.h>
#include <sac/lab/internal/plan_trace.h>
#include <sac/lab/internal/step_trace.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <optional>
#include <ostream>
#include <string>
#include <utility>

namespace sac {
namespace {

using detail::changes_of;
using detail::check_one_policy_per_region;
using detail::plan_cost;
using detail::simulate;

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
  PeakPlan best = detail::cheapest_plan_that_fits(*this, profiles, peak_bytes, offload, grid);
  const double least =
      detail::least_cost_that_fits(*trace_, live_, profiles, peak_bytes, offload, best.plan);
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
