#include "lab.h"

#include "python_policy.h"

#include <sac/sac.h>
#include <sac/lab.h>

#include <pybind11/functional.h>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace py = pybind11;

namespace sac::python {
namespace {

template <typename Printable, typename... Args>
std::string printed(const Printable& value, Args... args) {
  std::ostringstream out;
  value.print(out, args...);
  return out.str();
}

// Exactly one of the three, as sac::Budget takes it.
Budget budget_of(std::optional<int64_t> bytes, std::optional<double> fraction,
                 std::optional<double> of_everything_saveable) {
  TORCH_CHECK(int{bytes.has_value()} + int{fraction.has_value()} +
                      int{of_everything_saveable.has_value()} ==
                  1,
              "sac: give the budget as bytes=..., as fraction=... (of what the regions keep "
              "unchecked) or as of_everything_saveable=... (of what saving every keepable call "
              "keeps), exactly one of them.");
  if (bytes) return Budget::bytes(*bytes);
  return fraction ? Budget::fraction(*fraction)
                  : Budget::of_everything_saveable(*of_everything_saveable);
}

RegionProfile::SortBy sort_by(const std::string& name) {
  if (name == "order") return RegionProfile::SortBy::Order;
  if (name == "bytes") return RegionProfile::SortBy::Bytes;
  if (name == "time") return RegionProfile::SortBy::Time;
  TORCH_CHECK(false, "sac: sort by \"order\", \"bytes\" or \"time\", not \"", name, "\"");
}

std::string op_name(const OpCallProfile& call) { return c10::toString(call.op.operator_name()); }

const char* outcome_name(ExplainedCall::Outcome outcome) {
  switch (outcome) {
    case ExplainedCall::Outcome::NotDecided: return "not_decided";
    case ExplainedCall::Outcome::Saved: return "saved";
    case ExplainedCall::Outcome::Offloaded: return "offloaded";
    case ExplainedCall::Outcome::Recomputed: return "recomputed";
    case ExplainedCall::Outcome::Demoted: return "demoted";
  }
  return "?";
}

py::dict counts_as_dict(const RegionStatistics::Counts& c) {
  py::dict d;
#define SAC_COUNT(field) d[#field] = c.field
  SAC_COUNT(forwards);
  SAC_COUNT(calls_seen);
  SAC_COUNT(calls_saved);
  SAC_COUNT(calls_offloaded);
  SAC_COUNT(calls_recomputed);
  SAC_COUNT(calls_demoted);
  SAC_COUNT(tags);
  SAC_COUNT(bytes_saved);
  SAC_COUNT(bytes_offloaded);
  SAC_COUNT(bytes_dropped);
  SAC_COUNT(collectives_issued);
  SAC_COUNT(recomputations);
  SAC_COUNT(calls_served);
  SAC_COUNT(calls_rerun);
  SAC_COUNT(collectives_reissued);
  SAC_COUNT(agreements);
  SAC_COUNT(recompute_seconds);
#undef SAC_COUNT
  return d;
}

}  // namespace

void add_lab(py::module_& m) {
  py::class_<RegionStatistics, std::shared_ptr<RegionStatistics>>(
      m, "RegionStatistics",
      "What selective regions did with their ops, summed over the regions given it.")
      .def(py::init<>())
      .def(
          "read", [](const RegionStatistics& s) { return counts_as_dict(s.read()); },
          "The counts so far, as a dict (sac/cache/statistics.h says what each means).")
      .def("reset", &RegionStatistics::reset)
      .def("__str__", [](const RegionStatistics& s) { return printed(s.read()); });

  py::class_<OpCallProfile>(m, "OpCallProfile", "One op call of a profiled region.")
      .def_property_readonly("op", &op_name)
      .def_readonly("call", &OpCallProfile::call)
      .def_readonly("output_bytes", &OpCallProfile::output_bytes)
      .def_readonly("seconds", &OpCallProfile::seconds)
      .def_readonly("flops", &OpCallProfile::flops)
      .def_readonly("view", &OpCallProfile::view)
      .def_readonly("in_place", &OpCallProfile::in_place)
      .def_readonly("random", &OpCallProfile::random)
      .def_readonly("collective", &OpCallProfile::collective)
      .def_readonly("cacheable", &OpCallProfile::cacheable)
      .def_readonly("modified_later", &OpCallProfile::modified_later)
      .def_readonly("returned", &OpCallProfile::returned)
      .def_readonly("past_stop", &OpCallProfile::past_stop)
      .def_property_readonly("keepable", &OpCallProfile::keepable)
      .def("__repr__", [](const OpCallProfile& c) {
        return "<torch_sac.OpCallProfile " + op_name(c) + " #" + std::to_string(c.call) + ", " +
               std::to_string(c.output_bytes) + " bytes>";
      });

  py::class_<RegionProfile>(m, "RegionProfile", "What a region's ops cost, call by call.")
      .def_property_readonly("calls", &RegionProfile::calls)
      .def("keepable_bytes", &RegionProfile::keepable_bytes)
      .def_property_readonly("plain_bytes", &RegionProfile::plain_bytes)
      .def("keepable_seconds", &RegionProfile::keepable_seconds)
      .def(
          "with_seconds",
          [](const RegionProfile& p, const std::vector<double>& seconds) {
            TORCH_CHECK(seconds.size() == p.calls().size(),
                        "torch_sac.RegionProfile.with_seconds: expected one cost per call, ",
                        p.calls().size(), " in all, in the order of `calls`; got ", seconds.size(),
                        ".");
            std::vector<OpCallProfile> calls = p.calls();
            for (size_t i = 0; i < calls.size(); ++i) {
              TORCH_CHECK(seconds[i] >= 0,
                          "torch_sac.RegionProfile.with_seconds: a cost must not be "
                          "negative; call ",
                          i, " got ", seconds[i], ".");
              calls[i].seconds = seconds[i];
            }
            return RegionProfile(std::move(calls), p.plain_bytes());
          },
          py::arg("seconds"),
          "A copy whose calls cost `seconds` (one per call, in order): plans then "
          "minimise that cost instead of the profiled time (FLOPs, for one).")
      .def(
          "table",
          [](const RegionProfile& p, const std::string& sort, size_t limit) {
            return printed(p, sort_by(sort), limit);
          },
          py::arg("sort") = "order", py::arg("limit") = 0)
      .def("csv",
           [](const RegionProfile& p) {
             std::ostringstream out;
             p.write_csv(out);
             return out.str();
           })
      .def("__str__", [](const RegionProfile& p) { return printed(p); });

  m.def(
      "profile",
      // sac.profile hands over the tensors among what the region returns.
      [](const std::function<std::optional<std::vector<at::Tensor>>()>& region, int runs,
         int warmup) {
        return detail::profile_region(
            [&](std::vector<at::Tensor>& returned) {
              std::optional<std::vector<at::Tensor>> out = region();
              if (out.has_value()) {
                returned = std::move(*out);
              }
              return out.has_value();
            },
            runs, warmup);
      },
      py::arg("region"), py::arg("runs") = 3, py::arg("warmup") = 0);

  py::class_<BudgetedPlan>(m, "BudgetedPlan",
                           "One budget shared by several regions. saved_bytes and "
                           "recompute_seconds are the profiled shapes'.")
      .def_readonly("policies", &BudgetedPlan::policies)
      .def_readonly("checkpointed", &BudgetedPlan::checkpointed)
      .def_readonly("budget_bytes", &BudgetedPlan::budget_bytes)
      .def_readonly("saved_bytes", &BudgetedPlan::saved_bytes)
      .def_property_readonly(
          "saved_calls",
          [](const BudgetedPlan& plan) {
            std::vector<std::vector<std::tuple<std::string, size_t, int64_t>>> out;
            for (const auto& region : plan.saved_calls) {
              auto& calls = out.emplace_back();
              for (const SavedCall& c : region) {
                calls.emplace_back(c10::toString(c.op.operator_name()), c.call, c.bytes);
              }
            }
            return out;
          })
      .def_readonly("recompute_seconds", &BudgetedPlan::recompute_seconds)
      .def_readonly("exact", &BudgetedPlan::exact)
      .def_readonly("gap_seconds", &BudgetedPlan::gap_seconds)
      .def_readonly("solver_seconds", &BudgetedPlan::solver_seconds);
  m.def(
      "budgeted_plan",
      [](const std::vector<RegionProfile>& profiles, std::optional<int64_t> bytes,
         std::optional<double> fraction, std::optional<double> of_everything_saveable,
         bool unchecked_regions) {
        return budgeted_plan(profiles, budget_of(bytes, fraction, of_everything_saveable),
                             std::nullopt, unchecked_regions);
      },
      py::arg("profiles"), py::kw_only(), py::arg("bytes") = py::none(),
      py::arg("fraction") = py::none(), py::arg("of_everything_saveable") = py::none(),
      py::arg("unchecked_regions") = true);
  m.def(
      "budgeted_policy",
      [](const RegionProfile& profile, std::optional<int64_t> bytes, std::optional<double> fraction,
         std::optional<double> of_everything_saveable, bool unchecked_regions) {
        return budgeted_policy(profile, budget_of(bytes, fraction, of_everything_saveable),
                               std::nullopt, unchecked_regions);
      },
      py::arg("profile"), py::kw_only(), py::arg("bytes") = py::none(),
      py::arg("fraction") = py::none(), py::arg("of_everything_saveable") = py::none(),
      py::arg("unchecked_regions") = true);

  py::class_<ExplainedCall>(m, "ExplainedCall", "One call, the policy's answer and its fate.")
      .def_readonly("profile", &ExplainedCall::profile)
      .def_property_readonly("answer",
                             [](const ExplainedCall& c) -> py::object {
                               return c.answer ? to_python(*c.answer) : py::none();
                             })
      .def_property_readonly("outcome",
                             [](const ExplainedCall& c) { return outcome_name(c.outcome); });
  py::class_<Explanation>(m, "Explanation", "What a policy does with a region, call by call.")
      .def_property_readonly("calls", &Explanation::calls)
      .def("saved_bytes", &Explanation::saved_bytes)
      .def("offloaded_bytes", &Explanation::offloaded_bytes)
      .def("recompute_seconds", &Explanation::recompute_seconds)
      .def("__str__", [](const Explanation& e) { return printed(e); });
  m.def("explain", &explain, py::arg("policy"), py::arg("region"));

  py::class_<PeakPlan>(m, "PeakPlan", "The plan of least recomputation under a peak budget.")
      .def_readonly("plan", &PeakPlan::plan)
      .def_property_readonly("policies", [](const PeakPlan& p) { return p.plan.policies; })
      .def_readonly("peak_budget", &PeakPlan::peak_budget)
      .def_readonly("predicted_peak", &PeakPlan::predicted_peak)
      .def_readonly("exact", &PeakPlan::exact)
      .def_readonly("gap_seconds", &PeakPlan::gap_seconds)
      .def_readonly("solver_seconds", &PeakPlan::solver_seconds);
  py::class_<StepPhases>(m, "StepPhases",
                         "A training step's allocations, recorded under full recomputation: "
                         "what the peak of a step under any plan is predicted from.")
      .def_property_readonly("regions", &StepPhases::regions)
      .def_property_readonly("events", &StepPhases::events)
      .def("peak", &StepPhases::peak)
      .def_property_readonly("plain_peak", &StepPhases::plain_peak)
      .def_property_readonly("why_no_plain_peak", &StepPhases::why_no_plain_peak)
      .def_property_readonly("left", &StepPhases::left)
      .def("with_plain_peak", &StepPhases::with_plain_peak, py::arg("plain_peak"),
           py::arg("why_not") = "")
      .def(
          "predict_peak",
          [](const StepPhases& p, const BudgetedPlan& plan) { return p.predict_peak(plan); },
          py::arg("plan"))
      .def(
          "predict_peak_of",
          [](const StepPhases& p, const std::vector<Explanation>& regions) {
            std::vector<std::vector<SavedCall>> kept;
            for (const Explanation& e : regions) {
              kept.push_back(e.saved_calls());
            }
            return p.predict_peak(kept);
          },
          py::arg("explanations"))
      .def(
          "plan_for_peak",
          [](const StepPhases& p, const std::vector<RegionProfile>& profiles, int64_t peak_bytes) {
            return p.plan_for_peak(profiles, peak_bytes);
          },
          py::arg("profiles"), py::arg("peak_bytes"))
      .def("__str__", [](const StepPhases& p) { return printed(p, nullptr); });
  m.def(
      "measure_step_phases",
      [](const std::function<void()>& step, const std::function<int64_t()>& live,
         const std::function<int64_t()>& peak, const std::function<void()>& reset_peak) {
        MemoryProbe probe;
        probe.live = live;
        probe.peak = peak;
        probe.reset_peak = reset_peak;
        return measure_step_phases(probe, step);
      },
      py::arg("step"), py::kw_only(), py::arg("live") = py::none(), py::arg("peak") = py::none(),
      py::arg("reset_peak") = py::none());
  m.def(
      "measure_peak", [](const std::function<void()>& fn) { return measure_peak(fn); },
      py::arg("fn"));
}

}  // namespace sac::python
