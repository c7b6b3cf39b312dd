#include <sac/nn/fit.h>

#include <sac/lab/peak.h>
#include <sac/lab/profile.h>
#include <sac/nn/checkpoint_wrapper.h>
#include <sac/policy/presets.h>

#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <mutex>
#include <set>
#include <sstream>
#include <utility>

namespace sac {
namespace {

// What a training step changes, put back after each of sac::fit's runs: the
// parameters and buffers, the gradients, the optimizers' states (by
// serialization: their tensors are updated in place), the CPU generator.
class StepState {
 public:
  StepState(torch::nn::Module& model, const std::vector<torch::optim::Optimizer*>& optimizers)
      : optimizers_(optimizers), generator_(cpu_generator().get_state()) {
    at::NoGradGuard no_grad;
    for (const at::Tensor& t : model.parameters()) {
      values_.emplace_back(t, t.clone());
      grads_.emplace_back(t, t.grad().defined() ? t.grad().clone() : at::Tensor());
    }
    for (const at::Tensor& t : model.buffers()) {
      values_.emplace_back(t, t.clone());
    }
    for (torch::optim::Optimizer* optimizer : optimizers_) {
      TORCH_CHECK(optimizer != nullptr, "sac::fit: an optimizer given is null.");
      torch::serialize::OutputArchive archive;
      optimizer->save(archive);
      std::ostringstream bytes;
      archive.save_to(bytes);
      states_.push_back(bytes.str());
    }
  }

  void restore() {
    at::NoGradGuard no_grad;
    for (auto& [tensor, value] : values_) {
      tensor.copy_(value);
    }
    for (auto& [tensor, grad] : grads_) {
      tensor.mutable_grad() = grad.defined() ? grad.clone() : at::Tensor();
    }
    for (size_t i = 0; i < optimizers_.size(); ++i) {
      std::istringstream bytes(states_[i]);
      torch::serialize::InputArchive archive;
      archive.load_from(bytes);
      // Loading sets the states saved and leaves the others: clear first.
      optimizers_[i]->state().clear();
      optimizers_[i]->load(archive);
    }
    at::Generator generator = cpu_generator();
    const std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(generator_);
  }

 private:
  static at::Generator cpu_generator() {
    return at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
  }

  std::vector<std::pair<at::Tensor, at::Tensor>> values_;
  std::vector<std::pair<at::Tensor, at::Tensor>> grads_;
  std::vector<torch::optim::Optimizer*> optimizers_;
  std::vector<std::string> states_;
  at::Tensor generator_;
};

// Runs `step` and puts the state back, whether it returned or threw.
void run_restored(const std::function<void()>& step, StepState& state) {
  try {
    step();
  } catch (...) {
    state.restore();
    throw;
  }
  state.restore();
}

// A step's run under sac::fit: which wrappers ran, in order, and, while
// profiling, each one's profile.
class Session final : public detail::FitSession {
 public:
  Session(bool profiling, int runs) : profiling_(profiling), runs_(runs) {}

  CheckpointOptions region(detail::CheckpointWrapperBase& wrapper, CheckpointOptions options,
                           const std::function<std::vector<at::Tensor>()>& run) override {
    TORCH_CHECK(!in_profile_, "sac::fit: the region of ", wrapper.region_label(),
                " runs inside the region of ", wrappers_.back()->region_label(),
                ": sac::fit plans checkpoint wrappers that do not nest. Wrap the outer "
                "modules or the inner ones, not both.");
    TORCH_CHECK(std::find(wrappers_.begin(), wrappers_.end(), &wrapper) == wrappers_.end(),
                "sac::fit: the wrapper of ", wrapper.region_label(),
                " ran twice in one step (a module called twice, its weights shared): one "
                "wrapper has one policy, so it cannot be planned per call. Wrap each use "
                "of the module apart, or leave it unwrapped.");
    wrappers_.push_back(&wrapper);
    if (profiling_) {
      in_profile_ = true;
      try {
        profiles_.push_back(sac::profile(run, runs_));
      } catch (...) {
        in_profile_ = false;
        throw;
      }
      in_profile_ = false;
    }
    return CheckpointOptions().policy(nothing_saveable()).name(options.name());
  }

  const std::vector<detail::CheckpointWrapperBase*>& wrappers() const { return wrappers_; }
  std::vector<RegionProfile>& profiles() { return profiles_; }

 private:
  bool profiling_;
  int runs_;
  bool in_profile_ = false;
  std::vector<detail::CheckpointWrapperBase*> wrappers_;
  std::vector<RegionProfile> profiles_;
};

// `model` and every module under it.
std::set<const torch::nn::Module*> modules_of(torch::nn::Module& model) {
  std::set<const torch::nn::Module*> own;
  for (const auto& module : model.modules()) {
    own.insert(module.get());
  }
  return own;
}

// The calls of `profile` that `saved` does not keep (matched by op and
// call): what the region recomputes.
std::vector<const OpCallProfile*> recomputed(const RegionProfile& profile,
                                             const std::vector<SavedCall>& saved) {
  std::set<std::pair<std::string, size_t>> kept;
  for (const SavedCall& call : saved) {
    kept.emplace(c10::toString(call.op.operator_name()), call.call);
  }
  std::vector<const OpCallProfile*> calls;
  for (const OpCallProfile& call : profile.calls()) {
    if (kept.count({c10::toString(call.op.operator_name()), call.call}) == 0) {
      calls.push_back(&call);
    }
  }
  return calls;
}

}  // namespace

Fit::Peak Fit::fraction(double fraction) {
  TORCH_CHECK(fraction > 0 && fraction <= 1,
              "sac::Fit::fraction: a fraction of the plain step's peak is in (0, 1]; got ",
              fraction, ". Give bytes with sac::Fit::bytes.");
  return Peak(fraction, 0);
}

Fit::Peak Fit::bytes(int64_t bytes) {
  TORCH_CHECK(bytes > 0, "sac::Fit::bytes: a peak in bytes must be positive; got ", bytes, ".");
  return Peak(0, bytes);
}

Fit fit(torch::nn::Module& model, const std::function<void()>& step, Fit::Peak peak,
        const std::vector<torch::optim::Optimizer*>& optimizers, int runs) {
  const auto start = std::chrono::steady_clock::now();
  TORCH_CHECK(runs >= 1, "sac::fit: runs must be at least 1; got ", runs, ".");
  StepState state(model, optimizers);

  Session profiling(/*profiling=*/true, runs);
  run_restored(step, state);
  std::vector<detail::CheckpointWrapperBase*> wrappers = profiling.wrappers();
  TORCH_CHECK(!wrappers.empty(),
              "sac::fit: the step ran no checkpoint wrapper of sac's. Wrap the model's "
              "layers first (sac::apply_activation_checkpointing(model, "
              "sac::modules_of_type<BlockImpl>()), or sac::checkpoint_wrapper), and give "
              "sac::fit a step that runs them.");
  // The wrappers must be the model's: a plan is applied to them there.
  const std::set<const torch::nn::Module*> own = modules_of(model);
  for (const detail::CheckpointWrapperBase* wrapper : wrappers) {
    TORCH_CHECK(own.count(wrapper) != 0, "sac::fit: the step ran the wrapper of ",
                wrapper->region_label(),
                ", which is not a module of the model given. Give "
                "sac::fit the model whose wrappers the step runs.");
  }

  StepPhases phases = [&] {
    Session measuring(/*profiling=*/false, runs);
    std::optional<StepPhases> measured;
    run_restored([&] { measured.emplace(measure_step_phases(step)); }, state);
    TORCH_CHECK(measuring.wrappers() == wrappers,
                "sac::fit: the step ran other wrappers, or in another order, the second "
                "time (",
                measuring.wrappers().size(), " regions, then ", wrappers.size(),
                "): sac::fit plans a step that runs the same regions each time.");
    return std::move(*measured);
  }();
  TORCH_CHECK(phases.regions() == static_cast<int>(wrappers.size()), "sac::fit: the step ran ",
              phases.regions(), " checkpointed regions, ", wrappers.size(),
              " of them through the model's wrappers: sac::fit plans the wrappers' regions "
              "only. Wrap the other checkpointed code too, or plan it with the lab's calls "
              "(sac::measure_step_phases, StepPhases::plan_for_peak).");
  const std::optional<int64_t> plain = phases.plain_peak();
  TORCH_CHECK(plain.has_value(), "sac::fit: the plain step's peak cannot be predicted (",
              phases.why_no_plain_peak(), ").");

  int64_t budget = peak.bytes();
  if (budget == 0) {
    budget = static_cast<int64_t>(peak.fraction() * static_cast<double>(*plain));
  }
  // The least peak: full recomputation's, or the plain step's where that is
  // lower (a tiny step, where the generator states checkpointing keeps
  // outweigh what it spares).
  TORCH_CHECK(budget >= std::min(phases.peak(), *plain), "sac::fit: a peak of ", budget,
              " bytes is below the step's least: with every region recomputing everything "
              "it peaks at ",
              phases.peak(), " bytes (", static_cast<double>(phases.peak()) / *plain,
              " of the plain step's ", *plain,
              "). Raise the peak, or shrink the step (a smaller batch, more layers wrapped).");

  const PeakPlan fits = phases.plan_for_peak(profiling.profiles(), budget);
  Fit plan;
  plan.predicted_peak_ = fits.predicted_peak;
  plan.peak_budget_ = fits.peak_budget;
  plan.plain_peak_ = *plain;
  plan.recomputation_peak_ = phases.peak();
  plan.recompute_seconds_ = fits.plan.recompute_seconds;
  const BudgetedPlan& chosen = fits.plan;
  for (size_t i = 0; i < wrappers.size(); ++i) {
    Fit::Region region{wrappers[i]->region_label(), chosen.checkpointed[i], chosen.policies[i]};
    if (region.checkpointed) {
      for (const SavedCall& call : chosen.saved_calls[i]) {
        region.kept_bytes += call.bytes;
      }
      for (const OpCallProfile* call : recomputed(profiling.profiles()[i], chosen.saved_calls[i])) {
        region.recompute_seconds += call->recompute_seconds();
        region.recompute_flops += call->recompute_flops();
      }
    } else {
      region.kept_bytes = profiling.profiles()[i].plain_bytes();
    }
    plan.regions_.push_back(std::move(region));
    plan.wrappers_.push_back(wrappers[i]->shared_from_this());
  }
  plan.planning_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return plan;
}

void Fit::apply(torch::nn::Module& model) const {
  const std::set<const torch::nn::Module*> own = modules_of(model);
  for (size_t i = 0; i < wrappers_.size(); ++i) {
    const std::shared_ptr<torch::nn::Module> module = wrappers_[i].lock();
    TORCH_CHECK(module != nullptr && own.count(module.get()) != 0,
                "sac::Fit::apply: the plan's region ", regions_[i].label,
                " is not a wrapper of this model: a plan applies to the model it was made "
                "for (a copy has wrappers of its own; plan it with sac::fit).");
  }
  for (size_t i = 0; i < wrappers_.size(); ++i) {
    auto* wrapper = dynamic_cast<detail::CheckpointWrapperBase*>(wrappers_[i].lock().get());
    CheckpointOptions options = wrapper->options().value_or(CheckpointOptions());
    TORCH_CHECK(!options.context_fn(), "sac::Fit::apply: the wrapper of ", regions_[i].label,
                " checkpoints with a context_fn, which the plan's policy would replace. "
                "Give the wrapper options without one.");
    wrapper->set_options(std::move(options.policy(regions_[i].policy)));
  }
}

int64_t Fit::recompute_flops() const {
  int64_t flops = 0;
  for (const Region& region : regions_) {
    flops += region.recompute_flops;
  }
  return flops;
}

void Fit::print(std::ostream& out) const {
  const auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  out << std::fixed << std::setprecision(3) << "sac::fit: " << regions_.size() << " regions, peak "
      << mib(predicted_peak()) << " MiB predicted within " << mib(peak_budget())
      << " MiB (plain step " << mib(plain_peak_) << " MiB, full recomputation "
      << mib(recomputation_peak_) << " MiB); recomputes " << recompute_seconds() * 1e3 << " ms and "
      << recompute_flops() / 1e6 << " MFLOP a step; planned in " << planning_seconds_ << " s\n";
  out << std::left << std::setw(24) << "region" << std::right << std::setw(14) << "checkpointed"
      << std::setw(14) << "kept MiB" << std::setw(16) << "recompute ms" << std::setw(18)
      << "recompute MFLOP\n";
  for (const Region& region : regions_) {
    out << std::left << std::setw(24) << region.label << std::right << std::setw(14)
        << (region.checkpointed ? "yes" : "no") << std::setw(14) << mib(region.kept_bytes)
        << std::setw(16) << region.recompute_seconds * 1e3 << std::setw(18)
        << region.recompute_flops / 1e6 << "\n";
  }
}

}  // namespace sac
