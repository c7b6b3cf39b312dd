// sac::fit: a training step of a torch::nn model planned into a peak, in one
// call.
//
//   sac::apply_activation_checkpointing(model, sac::modules_of_type<BlockImpl>());
//   auto step = [&] {
//     optimizer.zero_grad();
//     torch::nll_loss(model->forward(x), y).backward();
//     optimizer.step();
//   };
//   sac::Fit plan = sac::fit(*model, step, sac::Fit::fraction(0.6), {&optimizer});
//   std::cout << plan;   // per region: kept or recomputed, bytes, time
//   plan.apply(*model);  // each wrapper checkpoints as planned; train on
//
// The regions are the model's checkpoint wrappers (sac::checkpoint_wrapper,
// apply_activation_checkpointing), in the order the step runs them. The
// step runs twice, each time from the state it found: once with each
// region profiled alone (sac::profile), and once measured with every region
// recomputing everything, the smallest step there is
// (sac::measure_step_phases). Every plan's peak, the plain step's too, is
// predicted from that one step, so a step that does not fit unchecked is
// planned without being run unchecked. After each run the model's
// parameters, buffers and gradients, the given optimizers' states and the
// CPU generator are put back.
//
// Peaks count the CPU memory the step allocates over what was live when it
// began (sac/lab/memory.h): plan on the CPU, on one intra-op thread.
#pragma once

#include <sac/policy/policy.h>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace sac {

class Fit {
 public:
  // A peak budget: a fraction in (0, 1] of the step's peak without
  // checkpointing, or bytes.
  class Peak {
   public:
    double fraction() const { return fraction_; }
    int64_t bytes() const { return bytes_; }

   private:
    friend class Fit;
    Peak(double fraction, int64_t bytes) : fraction_(fraction), bytes_(bytes) {}
    double fraction_;
    int64_t bytes_;
  };
  static Peak fraction(double fraction);
  static Peak bytes(int64_t bytes);

  // One per region, in the order the step runs them.
  struct Region {
    std::string label;  // the wrapper's region name, or its module's
    bool checkpointed;
    Policy policy;
    int64_t kept_bytes = 0;        // what it keeps after the forward
    double recompute_seconds = 0;  // what its recomputation takes
    int64_t recompute_flops = 0;   // and computes (see OpCallProfile::flops)
  };
  const std::vector<Region>& regions() const { return regions_; }
  // The step's peak under the plan, and the peak budget it fits.
  int64_t predicted_peak() const { return predicted_peak_; }
  int64_t peak_budget() const { return peak_budget_; }
  // The step's peak without checkpointing and under full recomputation.
  int64_t plain_peak() const { return plain_peak_; }
  int64_t recomputation_peak() const { return recomputation_peak_; }
  // What the plan recomputes a step, and how long planning took.
  double recompute_seconds() const { return recompute_seconds_; }
  int64_t recompute_flops() const;
  double planning_seconds() const { return planning_seconds_; }

  // Gives each wrapper of `model` that the plan covers its policy (its own
  // options kept); an error for a model whose wrappers are not the ones
  // planned.
  void apply(torch::nn::Module& model) const;

  void print(std::ostream& out) const;
  friend std::ostream& operator<<(std::ostream& out, const Fit& plan) {
    plan.print(out);
    return out;
  }

 private:
  friend Fit fit(torch::nn::Module& model, const std::function<void()>& step, Fit::Peak peak,
                 const std::vector<torch::optim::Optimizer*>& optimizers, int runs);
  Fit() = default;

  std::vector<Region> regions_;
  std::vector<std::weak_ptr<torch::nn::Module>> wrappers_;
  int64_t predicted_peak_ = 0;
  int64_t peak_budget_ = 0;
  int64_t plain_peak_ = 0;
  int64_t recomputation_peak_ = 0;
  double recompute_seconds_ = 0;
  double planning_seconds_ = 0;
};

// The plan of least recomputation for `step` (a training step of `model`:
// forward, backward, optimizer step) whose peak is at most `peak`. The
// states of `optimizers` (those the step steps) are put back with the
// model's after each run. Each region is profiled `runs` times.
Fit fit(torch::nn::Module& model, const std::function<void()>& step, Fit::Peak peak,
        const std::vector<torch::optim::Optimizer*>& optimizers = {}, int runs = 2);

}  // namespace sac
