// sac policy_lab: op-level checkpointing experiments on the GPT of
// examples/gpt_train.
//
// It profiles every block of the model (sac::profile), prints the op table,
// then places policies on the memory/time plane: the presets and op lists
// named by --policies, and a sweep of budgets (one exact plan for all the
// blocks at once, sac::budgeted_plan), and for each named policy the plan
// at its bytes (budget=NAME). Every point is predicted from the
// profiles AND measured by really training with it: the bytes the blocks
// keep after the forward (the counting allocator, over full recomputation),
// the recomputation time per step (sac::RegionStatistics) and the step time,
// medians of --runs steps; and the gradients are checked bit for bit against
// training without checkpointing. The step's peak, too, is predicted for
// every point (from one step under full recomputation, sac/lab/peak.h) and
// measured. Then plans for a sweep of peak budgets
// (sac::StepPhases::plan_for_peak), drawn beside the other points on the
// peak/recomputation plane. It writes the points as CSV and draws them with
// gnuplot.
//
//   cmake --build build --target policy_lab
//   build/examples/policy_lab [--layers 4] [--embed 128] [--heads 4] [--seq 128]
//       [--batch 8] [--vocab 512] [--threads 1] [--runs 5] [--profile_runs 5]
//       [--policies
//       nothing,everything,compute_intensive,dots,ops:aten::addmm+aten::gelu,budget:0.25]
//       [--sweep 0,0.1,...,1] [--peak_points 6] [--table 20] [--out policy_lab_out]
//       [--plot=true]
//
// or .ci/policy_lab with the same flags. A policy is a preset (nothing,
// everything, compute_intensive, dots, dots_no_batch, torchtitan,
// matmuls+attention), an op list (ops:aten::addmm+aten::mm), or a budget
// (budget:0.3 of what the blocks keep without checkpointing, or budget:4MiB, budget:4096).
// Exit status 0 only if every point's gradients are bit-identical.
#include <sac/sac.h>
#include <sac/policy/presets.h>
#include <sac/lab.h>

#include "examples/gpt.h"
#include "examples/gpt_flags.h"

#include <absl/flags/flag.h>
#include <absl/flags/usage.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

ABSL_FLAG(int64_t, threads, 1, "intra-op threads (at::set_num_threads)");
ABSL_FLAG(int64_t, runs, 5, "measured steps per point (after one warm-up step); medians");
ABSL_FLAG(int64_t, profile_runs, 5, "runs of each block's profile (each call's least time)");
ABSL_FLAG(std::vector<std::string>, policies,
          std::vector<std::string>({"nothing", "everything", "compute_intensive", "dots",
                                    "ops:aten::addmm+aten::gelu", "budget:0.25"}),
          "comma-separated policies: presets, ops:a+b, budget:fraction|bytes|NMiB");
ABSL_FLAG(std::vector<std::string>, sweep,
          std::vector<std::string>({"0", "0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7", "0.8",
                                    "0.9", "1"}),
          "budgets of the frontier, as fractions of what the blocks keep without checkpointing");
ABSL_FLAG(int64_t, peak_points, 6,
          "peak budgets from full recomputation's peak to saving everything's: a plan for "
          "each (sac::StepPhases::plan_for_peak), its peak predicted and measured");
ABSL_FLAG(int64_t, table, 20, "rows of the op table (the first block's calls by bytes; 0: all)");
ABSL_FLAG(std::string, out, "policy_lab_out",
          "directory for ops.csv, frontier.csv and frontier.png");
ABSL_FLAG(bool, plot, true, "draw frontier.png with gnuplot");

namespace {

using sac_examples::Batch;
using sac_examples::Config;
using sac_examples::CountingAllocator;
using sac_examples::Gpt;
using sac_examples::GptBlockImpl;

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty()      ? 0
         : v.size() % 2 ? v[v.size() / 2]
                        : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// ---- The model, block by block -----------------------------------------------

// The model's blocks with the inputs they see in its forward: what the
// profiles and the explanations run.
struct Blocks {
  std::vector<std::shared_ptr<GptBlockImpl>> modules;
  std::vector<at::Tensor> inputs;
};

Blocks blocks_of(Gpt& model, const Batch& batch) {
  Blocks blocks;
  at::Tensor h = model->embed(batch.inputs);
  for (size_t i = 0; i < model->blocks->size(); ++i) {
    blocks.modules.push_back(model->blocks->ptr<GptBlockImpl>(i));
    blocks.inputs.push_back(h.detach().requires_grad_());
    h = blocks.modules.back()->forward(blocks.inputs.back());
  }
  return blocks;
}

// ---- Points ------------------------------------------------------------------

// A policy per block, placed on the plane.
struct Point {
  std::string label;
  // "sweep" (a budget of the frontier), "policy" (named on the command
  // line) or "matched" (a budget of a named policy's predicted bytes).
  std::string kind;
  std::vector<sac::Policy> policies;
  // Predicted from the profiles.
  int64_t predicted_bytes = 0;
  double predicted_recompute_ms = 0;
  double solver_ms = -1;  // budgets only
  // Measured.
  int64_t measured_bytes = 0;        // allocator, over full recomputation
  int64_t statistics_bytes = 0;      // RegionStatistics::bytes_saved
  double measured_recompute_ms = 0;  // RegionStatistics::recompute_seconds
  double step_ms = 0;
  bool identical = false;
  // The step's peak (forward + backward) over what was live before it,
  // predicted from the calls each block keeps (sac/lab/peak.h) and measured.
  std::vector<std::vector<sac::SavedCall>> saved_calls;
  int64_t predicted_peak = 0;
  int64_t measured_peak = 0;
};

Point budget_point(const std::string& label, const std::string& kind,
                   const std::vector<sac::RegionProfile>& profiles, sac::Budget budget) {
  const sac::BudgetedPlan plan = sac::budgeted_plan(profiles, budget, std::nullopt, false);
  if (!plan.exact) {
    std::printf("note: %s: the solver stopped at its node limit; the plan is within %.3f ms of "
                "the best\n",
                label.c_str(), plan.gap_seconds * 1e3);
  }
  Point p{label, kind, plan.policies};
  p.predicted_bytes = plan.saved_bytes;
  p.predicted_recompute_ms = plan.recompute_seconds * 1e3;
  p.solver_ms = plan.solver_seconds * 1e3;
  p.saved_calls = plan.saved_calls;
  return p;
}

// A named policy for every block, predicted by sac::explain: the bytes its
// saved calls keep, and the profiled time of the calls it leaves to the
// recomputation.
Point explained_point(const std::string& label, const sac::Policy& policy, const Blocks& blocks,
                      const std::vector<sac::RegionProfile>& profiles) {
  Point p{label, "policy", std::vector<sac::Policy>(blocks.modules.size(), policy)};
  for (size_t i = 0; i < blocks.modules.size(); ++i) {
    torch::manual_seed(42);
    const sac::Explanation e =
        sac::explain(policy, [&] { blocks.modules[i]->forward(blocks.inputs[i]); });
    const auto& profiled = profiles[i].calls();
    if (e.calls().size() != profiled.size()) {
      throw std::runtime_error("block " + std::to_string(i) + " ran different ops under " + label);
    }
    p.predicted_bytes += e.saved_bytes();
    p.saved_calls.push_back(e.saved_calls());
    for (size_t c = 0; c < profiled.size(); ++c) {
      const auto outcome = e.calls()[c].outcome;
      if (outcome != sac::ExplainedCall::Outcome::Saved &&
          outcome != sac::ExplainedCall::Outcome::Offloaded) {
        p.predicted_recompute_ms += profiled[c].seconds * 1e3;
      }
    }
  }
  return p;
}

sac::Policy preset(const std::string& name) {
  if (name == "nothing") return sac::nothing_saveable();
  if (name == "everything") return sac::everything_saveable();
  if (name == "compute_intensive") return sac::compute_intensive_ops();
  if (name == "dots") return sac::dots_saveable();
  if (name == "dots_no_batch") return sac::dots_with_no_batch_dims_saveable();
  if (name == "torchtitan") return sac::torchtitan_default();
  if (name == "matmuls+attention") return sac_examples::save_matmuls_and_attention();
  throw std::invalid_argument(
      "unknown policy '" + name +
      "'; expected a preset (nothing, everything, "
      "compute_intensive, dots, dots_no_batch, torchtitan, matmuls+attention), "
      "ops:aten::a+aten::b, or budget:0.3 / budget:4MiB / budget:4096");
}

// budget:0.3 (a fraction), budget:4MiB, budget:4096 (bytes).
sac::Budget parse_budget(const std::string& text) {
  try {
    size_t used = 0;
    if (text.size() > 3 && text.compare(text.size() - 3, 3, "MiB") == 0) {
      const double m = std::stod(text.substr(0, text.size() - 3), &used);
      return sac::Budget::bytes(static_cast<int64_t>(m * 1024 * 1024));
    }
    if (text.find('.') != std::string::npos || text == "0" || text == "1") {
      return sac::Budget::fraction(std::stod(text, &used));
    }
    return sac::Budget::bytes(std::stoll(text, &used));
  } catch (const std::logic_error&) {
    throw std::invalid_argument("budget:" + text +
                                " is not a fraction (0.3), bytes (4096) "
                                "or MiB (4MiB)");
  }
}

Point named_point(const std::string& spec, const Blocks& blocks,
                  const std::vector<sac::RegionProfile>& profiles) {
  if (spec.rfind("budget:", 0) == 0) {
    return budget_point(spec, "policy", profiles, parse_budget(spec.substr(7)));
  }
  if (spec.rfind("ops:", 0) == 0) {
    std::vector<std::string> ops;
    std::string rest = spec.substr(4);
    for (size_t plus; (plus = rest.find('+')) != std::string::npos; rest = rest.substr(plus + 1)) {
      ops.push_back(rest.substr(0, plus));
    }
    ops.push_back(rest);
    return explained_point(spec, sac::Policy::save_ops(ops), blocks, profiles);
  }
  return explained_point(spec, preset(spec), blocks, profiles);
}

// ---- Measuring ---------------------------------------------------------------

struct Reference {
  at::Tensor loss;
  std::vector<at::Tensor> grads;
};

std::vector<at::Tensor> gradients(Gpt& model) {
  std::vector<at::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.grad().clone());
  return out;
}

struct Step {
  int64_t kept = 0;  // after the forward, over what was live before
  int64_t peak = 0;  // during forward and backward, over the same
  double ms = 0;
  at::Tensor loss;
  std::vector<at::Tensor> grads;
};

// One training step's forward and backward (no optimizer: every point sees
// the same weights), each block checkpointed under its policy, or none.
// Copies of the gradients are taken after the peak is read, unless
// `keep_gradients` is false.
Step step(Gpt& model, const Batch& batch, const std::vector<sac::Policy>* policies,
          const std::shared_ptr<sac::RegionStatistics>& statistics, bool keep_gradients = true) {
  for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
  torch::manual_seed(42);  // the same dropout masks at every point
  Step s;
  const int64_t before = CountingAllocator::live_bytes();
  CountingAllocator::reset_peak();
  const auto start = Clock::now();
  at::Tensor h = model->embed(batch.inputs);
  for (size_t i = 0; i < model->blocks->size(); ++i) {
    auto block = model->blocks->ptr<GptBlockImpl>(i);
    if (policies == nullptr) {
      h = block->forward(h);
    } else {
      // The recomputation calls the function during backward, after this
      // loop: it holds its block by value.
      const auto options = sac::CheckpointOptions().policy((*policies)[i]).statistics(statistics);
      h = sac::checkpoint(
          options, [block](const at::Tensor& in) { return block->forward(in); }, h);
    }
  }
  at::Tensor loss = sac_examples::GptImpl::loss_of(model->logits(h), batch.targets);
  h = at::Tensor();
  s.kept = CountingAllocator::live_bytes() - before;
  loss.backward();
  s.ms = ms_since(start);
  s.peak = CountingAllocator::peak_bytes() - before;
  s.loss = loss.detach();
  if (keep_gradients) s.grads = gradients(model);
  return s;
}

bool identical(const Step& s, const Reference& reference) {
  if (!torch::equal(s.loss, reference.loss)) return false;
  for (size_t i = 0; i < s.grads.size(); ++i) {
    if (!torch::equal(s.grads[i], reference.grads[i])) return false;
  }
  return true;
}

// Measures every point: a first step each for the bytes kept over
// `baseline` (full recomputation) and the gradients, then `runs` rounds of
// one step per point, so that the machine's drift touches every point alike;
// medians of the recomputation and step times.
void measure(std::vector<Point>& points, Gpt& model, const Batch& batch, int64_t runs,
             int64_t baseline, const sac::StepPhases& phases, const Reference& reference) {
  auto statistics = std::make_shared<sac::RegionStatistics>();
  for (Point& p : points) {
    statistics->reset();
    const Step first = step(model, batch, &p.policies, statistics);
    p.measured_bytes = first.kept - baseline;
    p.measured_peak = first.peak;
    p.predicted_peak = phases.predict_peak(p.saved_calls);
    p.statistics_bytes = statistics->read().bytes_saved;
    p.identical = identical(first, reference);
  }
  std::vector<std::vector<double>> recompute(points.size()), steps(points.size());
  for (int64_t r = 0; r < runs; ++r) {
    for (size_t i = 0; i < points.size(); ++i) {
      statistics->reset();
      const Step s = step(model, batch, &points[i].policies, statistics);
      points[i].identical = points[i].identical && identical(s, reference);
      recompute[i].push_back(statistics->read().recompute_seconds * 1e3);
      steps[i].push_back(s.ms);
    }
    std::printf(".");
    std::fflush(stdout);
  }
  for (size_t i = 0; i < points.size(); ++i) {
    points[i].measured_recompute_ms = median(recompute[i]);
    points[i].step_ms = median(steps[i]);
  }
}

// ---- Output ------------------------------------------------------------------

// The step's peak, predicted and measured, for every point.
void print_peaks(const std::vector<Point>& points, int64_t full_recomputation) {
  std::printf("\nthe step's peak (forward + backward), predicted from one step under full "
              "recomputation (%.3f MiB) and measured:\n%-32s %14s %14s %10s\n",
              mib(full_recomputation), "plan or policy", "predicted MiB", "measured MiB", "diff B");
  for (const Point& p : points) {
    std::printf("%-32s %14.3f %14.3f %10lld\n", p.label.c_str(), mib(p.predicted_peak),
                mib(p.measured_peak), (long long)(p.predicted_peak - p.measured_peak));
  }
}

// Plans for a sweep of peak budgets: each one's predicted and measured
// peak, the recomputation it leaves, and the solver's bound.
void plan_for_peaks(const sac::StepPhases& phases, const std::vector<sac::RegionProfile>& profiles,
                    Gpt& model, const Batch& batch, int64_t count, const std::string& csv) {
  if (count < 2) return;
  std::ofstream out(csv);
  out << "budget,predicted_peak,measured_peak,recompute_ms,gap_ms\n";
  const int64_t low = phases.peak();
  const int64_t high = phases.predict_peak(
      sac::budgeted_plan(profiles, sac::Budget::of_everything_saveable(1.0), std::nullopt, false));
  std::printf("\nplans for a peak budget (sac::StepPhases::plan_for_peak):\n%14s %14s %14s "
              "%16s %14s %10s\n",
              "budget MiB", "predicted MiB", "measured MiB", "recompute ms", "gap ms", "solve ms");
  for (int64_t i = 0; i < count; ++i) {
    const int64_t budget = low + (high - low) * i / (count - 1);
    const sac::PeakPlan plan = phases.plan_for_peak(profiles, budget);
    const Step s = step(model, batch, &plan.plan.policies, nullptr, /*keep_gradients=*/false);
    std::printf("%14.3f %14.3f %14.3f %16.3f %14s %10.1f\n", mib(budget), mib(plan.predicted_peak),
                mib(s.peak), plan.plan.recompute_seconds * 1e3,
                plan.exact ? "exact" : std::to_string(plan.gap_seconds * 1e3).c_str(),
                plan.solver_seconds * 1e3);
    out << budget << "," << plan.predicted_peak << "," << s.peak << ","
        << plan.plan.recompute_seconds * 1e3 << "," << plan.gap_seconds * 1e3 << "\n";
  }
  if (!out) throw std::runtime_error("cannot write " + csv);
}

// Runs gnuplot on `script` (which sets its terminal and output), kept
// beside the data `csv` as csv + ".gp".
void run_gnuplot(const std::string& csv, const std::string& script) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    throw std::runtime_error("gnuplot is not installed (.ci/install installs it: apt-get install "
                             "gnuplot-nox); rerun, or pass --plot=false for the CSV alone");
  }
  const std::string path = csv + ".gp";
  std::ofstream(path) << script;
  if (std::system(("gnuplot '" + path + "'").c_str()) != 0) {
    throw std::runtime_error("gnuplot failed on " + path);
  }
}

// Draws the frontier (predicted and measured) and the named policies
// (measured, labelled, with their predictions) from frontier.csv.
void plot(const std::string& csv, const std::string& png, const std::string& title) {
  std::ostringstream gp;
  gp << "set datafile separator ','\n"
        "set terminal pngcairo size 1100,700 font ',11' noenhanced\n"
        "set output '"
     << png
     << "'\n"
        "set title \""
     << title
     << "\"\n"
        "set xlabel 'activation bytes the blocks keep after forward (MiB)'\n"
        "set ylabel 'recomputation time per step (ms)'\n"
        "set key top right\n"
        "set grid\n"
        "mib(b) = b / 1048576.0\n"
        "is(k) = strcol(2) eq k\n"
        "plot '"
     << csv
     << "' using (is('sweep') ? mib($3) : 1/0):6 with linespoints lw 2 pt 6 "
        "title 'budgeted, predicted', \\\n"
        "  '' using (is('sweep') ? mib($4) : 1/0):7 with points pt 7 ps 1.3 "
        "title 'budgeted, measured', \\\n"
        "  '' using (is('policy') ? mib($3) : 1/0):6 with points pt 4 ps 1.5 "
        "title 'named policies, predicted', \\\n"
        "  '' using (is('policy') ? mib($4) : 1/0):7 with points pt 5 ps 1.5 "
        "title 'named policies, measured', \\\n"
        "  '' using (is('matched') ? mib($4) : 1/0):7 with points pt 9 ps 1.6 "
        "title 'budgeted at a named policy''s bytes, measured', \\\n"
        "  '' using (is('policy') ? mib($4) : 1/0):7:1 with labels offset 1.2,0.8 left "
        "font ',10' notitle\n";
  run_gnuplot(csv, gp.str());
}

// Draws the plans for a peak budget from peaks.csv: on the left their
// peaks, predicted and measured, against the budget; on the right the
// recomputation each leaves against its peak, beside the bytes plans and
// the named policies of frontier.csv on the same axes.
void plot_peaks(const std::string& peaks_csv, const std::string& frontier_csv,
                const std::string& png, const std::string& title) {
  std::ostringstream gp;
  gp << "set datafile separator ','\n"
        "set terminal pngcairo size 1600,700 font ',11' noenhanced\n"
        "set output '"
     << png
     << "'\n"
        "set multiplot layout 1,2 title \""
     << title
     << "\"\n"
        "mib(b) = b / 1048576.0\n"
        "is(k) = strcol(2) eq k\n"
        "set grid\n"
        "set key top left\n"
        "set title 'plans for a peak budget'\n"
        "set xlabel 'peak budget of the step (MiB)'\n"
        "set ylabel 'peak of the step, forward + backward (MiB)'\n"
        "plot '"
     << peaks_csv
     << "' using (mib($1)):(mib($1)) with lines dt 2 lc rgb 'gray' "
        "title 'the budget', \\\n"
        "  '' using (mib($1)):(mib($2)) with linespoints lw 2 pt 6 ps 1.6 "
        "title 'peak, predicted', \\\n"
        "  '' using (mib($1)):(mib($3)) with points pt 7 ps 0.9 title 'peak, measured'\n"
        "set key top right\n"
        "set offsets 0, graph 0.12, 0, 0\n"
        "set title 'every plan and policy: recomputation against the step''s peak'\n"
        "set xlabel 'peak of the step, forward + backward (MiB)'\n"
        "set ylabel 'recomputation time per step, predicted (ms)'\n"
        "plot '"
     << peaks_csv
     << "' using (mib($2)):4 with linespoints lw 2 pt 6 ps 1.4 "
        "title 'for a peak budget, predicted', \\\n"
        "  '' using (mib($3)):4 with points pt 7 ps 0.8 title 'for a peak budget, measured', \\\n"
        "  '"
     << frontier_csv
     << "' using (is('sweep') ? mib($11) : 1/0):6 with linespoints "
        "lw 2 pt 8 ps 1.4 title 'for a byte budget, predicted', \\\n"
        "  '' using (is('sweep') ? mib($12) : 1/0):6 with points pt 9 ps 0.9 "
        "title 'for a byte budget, measured', \\\n"
        "  '' using (is('policy') ? mib($11) : 1/0):6 with points pt 4 ps 1.6 "
        "title 'named policies, predicted', \\\n"
        "  '' using (is('policy') ? mib($12) : 1/0):6 with points pt 5 ps 0.9 "
        "title 'named policies, measured', \\\n"
        "  '' using (is('policy') ? mib($12) : 1/0):6:1 with labels offset 1.2,0.8 left "
        "font ',10' notitle\n"
        "unset multiplot\n";
  run_gnuplot(peaks_csv, gp.str());
}

void write_csv(const std::string& path, const std::vector<Point>& points) {
  std::ofstream out(path);
  out << "label,kind,predicted_bytes,measured_bytes,statistics_bytes,predicted_recompute_ms,"
         "measured_recompute_ms,step_ms,solver_ms,identical,predicted_peak,measured_peak\n";
  for (const Point& p : points) {
    out << p.label << "," << p.kind << "," << p.predicted_bytes << "," << p.measured_bytes << ","
        << p.statistics_bytes << "," << p.predicted_recompute_ms << "," << p.measured_recompute_ms
        << "," << p.step_ms << "," << p.solver_ms << "," << (p.identical ? 1 : 0) << ","
        << p.predicted_peak << "," << p.measured_peak << "\n";
  }
  if (!out) throw std::runtime_error("cannot write " + path);
}

void print_points(const std::vector<Point>& points) {
  std::printf("\n%-32s %12s %12s %12s %12s %9s %9s  %s\n", "point", "pred MiB", "meas MiB",
              "pred rc ms", "meas rc ms", "step ms", "solve ms", "grads identical");
  for (const Point& p : points) {
    char solver[16] = "-";
    if (p.solver_ms >= 0) std::snprintf(solver, sizeof solver, "%.3f", p.solver_ms);
    std::printf("%-32s %12.3f %12.3f %12.2f %12.2f %9.1f %9s  %s\n",
                (p.kind == "sweep" ? "budget " + p.label : p.label).c_str(), mib(p.predicted_bytes),
                mib(p.measured_bytes), p.predicted_recompute_ms, p.measured_recompute_ms, p.step_ms,
                solver, p.identical ? "yes" : "NO");
  }
}

// ---- Command line ------------------------------------------------------------

int run_lab(int argc, char** argv) {
  absl::SetProgramUsageMessage("places checkpointing policies for a GPT on the memory/time plane");
  sac_examples::parse_flags(argc, argv);
  const Config c = sac_examples::config_from_flags(
      /*steps=*/1,
      {absl::GetFlag(FLAGS_threads), absl::GetFlag(FLAGS_runs), absl::GetFlag(FLAGS_profile_runs)});
  at::set_num_threads(static_cast<int>(absl::GetFlag(FLAGS_threads)));
  CountingAllocator::install();
  const std::filesystem::path out = absl::GetFlag(FLAGS_out);
  std::filesystem::create_directories(out);

  torch::manual_seed(0);
  Gpt model(c);
  const Batch batch = sac_examples::synthetic_batch(c, torch::kCPU);
  std::printf("sac policy_lab: %lld layers, embed %lld, %lld heads, seq %lld, batch %lld, "
              "vocab %lld, dropout %.1f, CPU, %d thread(s), dispatch %s, %lld runs per point\n",
              (long long)c.layers, (long long)c.embed, (long long)c.heads, (long long)c.seq,
              (long long)c.batch, (long long)c.vocab, c.dropout, at::get_num_threads(),
              std::string(sac::dispatch::to_string(sac::dispatch::mechanism())).c_str(),
              (long long)absl::GetFlag(FLAGS_runs));

  // Profiles, one per block, each with the input the block sees.
  const Blocks blocks = blocks_of(model, batch);
  std::vector<sac::RegionProfile> profiles;
  const auto profiling = Clock::now();
  for (size_t i = 0; i < blocks.modules.size(); ++i) {
    torch::manual_seed(42);
    profiles.push_back(sac::profile([&] { return blocks.modules[i]->forward(blocks.inputs[i]); },
                                    static_cast<int>(absl::GetFlag(FLAGS_profile_runs))));
  }
  std::printf("profiled %zu blocks in %.0f ms (%lld runs each); block 0 keeps %.3f MiB if every "
              "call is saved, its calls take %.2f ms\n\nblock 0, by bytes:\n",
              profiles.size(), ms_since(profiling), (long long)absl::GetFlag(FLAGS_profile_runs),
              mib(profiles[0].keepable_bytes()), profiles[0].keepable_seconds() * 1e3);
  profiles[0].print(std::cout, sac::RegionProfile::SortBy::Bytes,
                    static_cast<size_t>(absl::GetFlag(FLAGS_table)));
  {
    std::ofstream ops(out / "ops.csv");
    profiles[0].write_csv(ops);
  }

  std::vector<Point> points;
  for (const std::string& fraction : absl::GetFlag(FLAGS_sweep)) {
    points.push_back(
        budget_point(fraction, "sweep", profiles, sac::Budget::fraction(std::stod(fraction))));
  }
  for (const std::string& spec : absl::GetFlag(FLAGS_policies)) {
    points.push_back(named_point(spec, blocks, profiles));
  }
  // Each named policy that keeps something, against the budgeted plan at
  // its bytes: which calls should those bytes have kept?
  const size_t named = points.size();
  for (size_t i = absl::GetFlag(FLAGS_sweep).size(); i < named; ++i) {
    if (points[i].predicted_bytes > 0 && points[i].label.rfind("budget:", 0) != 0) {
      points.push_back(budget_point("budget=" + points[i].label, "matched", profiles,
                                    sac::Budget::bytes(points[i].predicted_bytes)));
    }
  }

  // The reference (no checkpointing), then full recomputation: the bytes
  // every point keeps are counted over it.
  step(model, batch, nullptr, nullptr);  // warm-up
  const Step plain = step(model, batch, nullptr, nullptr);
  const Reference reference{plain.loss, plain.grads};
  const std::vector<sac::Policy> nothing(blocks.modules.size(), sac::nothing_saveable());
  step(model, batch, &nothing, nullptr);
  const int64_t baseline = step(model, batch, &nothing, nullptr).kept;
  // One step under full recomputation, phase by phase: the budgeted plans'
  // peaks are predicted from it.
  for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
  const sac::MemoryProbe probe{[] { return CountingAllocator::live_bytes(); },
                               [] { return CountingAllocator::peak_bytes(); },
                               [] { CountingAllocator::reset_peak(); }};
  const sac::StepPhases phases = sac::measure_step_phases(probe, [&] {
    step(model, batch, &nothing, nullptr, /*keep_gradients=*/false);
  });
  std::printf("\nmeasuring %zu points, %lld rounds: ", points.size(),
              (long long)absl::GetFlag(FLAGS_runs));
  measure(points, model, batch, absl::GetFlag(FLAGS_runs), baseline, phases, reference);
  std::printf("\nno checkpointing: %.1f ms per step, keeps %.3f MiB more than full "
              "recomputation\n",
              plain.ms, mib(plain.kept - baseline));
  print_points(points);
  print_peaks(points, phases.peak());
  const std::string peaks_csv = (out / "peaks.csv").string();
  plan_for_peaks(phases, profiles, model, batch, absl::GetFlag(FLAGS_peak_points), peaks_csv);

  const std::string csv = (out / "frontier.csv").string();
  write_csv(csv, points);
  std::printf("\nwrote %s and %s", csv.c_str(), (out / "ops.csv").string().c_str());
  if (absl::GetFlag(FLAGS_plot)) {
    const std::string png = (out / "frontier.png").string();
    char title[200];
    std::snprintf(title, sizeof title,
                  "sac: %lld GPT blocks (embed %lld, seq %lld, batch %lld), CPU, %d thread(s)",
                  (long long)c.layers, (long long)c.embed, (long long)c.seq, (long long)c.batch,
                  at::get_num_threads());
    plot(csv, png, title);
    std::printf(" and %s", png.c_str());
    if (absl::GetFlag(FLAGS_peak_points) >= 2) {
      const std::string peaks_png = (out / "peaks.png").string();
      plot_peaks(peaks_csv, csv, peaks_png, title);
      std::printf(" and %s", peaks_png.c_str());
    }
  }
  std::printf("\n");
  bool all_identical = true;
  for (const Point& p : points) all_identical = all_identical && p.identical;
  std::printf("%s\n", all_identical ? "every point: gradients bit-identical to no checkpointing"
                                    : "NOT every point is bit-identical to no checkpointing");
  return all_identical ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return sac_examples::main_reporting_errors("policy_lab", run_lab, argc, argv);
}
