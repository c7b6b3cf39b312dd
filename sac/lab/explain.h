// sac::explain: what a policy does with a region, call by call (JAX's
// print_saved_residuals, with the answers).
//
//   sac::Explanation e = sac::explain(policy, [&] { block->forward(x); });
//   e.print(std::cout);
//
// Runs the region once under the policy's caching mode (a forward that keeps
// autograd's own saved tensors, so nothing needs a backward), profiled as
// sac::profile does (times from that one run), and reports for every call the policy's answer and
// what came of it: saved on the device, offloaded, or recomputed (also when a tag or an in-place
// change overrode the answer).
#pragma once

#include <sac/lab/budget.h>
#include <sac/lab/profile.h>
#include <sac/policy/policy.h>

#include <functional>
#include <iosfwd>
#include <utility>
#include <optional>
#include <vector>

namespace sac {

struct ExplainedCall {
  OpCallProfile profile;
  // The policy's answer, for the calls it was asked about.
  std::optional<CheckpointPolicy> answer;
  // Demoted: saved, then modified in place later in the forward, so the
  // cache dropped it when the forward ended (it held the storage until then)
  // and the recomputation runs it. A call left to the recomputation
  // (Recomputed, Demoted) past its stop (profile.past_stop) is never run
  // again; print() says "past stop" for it.
  enum class Outcome { NotDecided, Saved, Offloaded, Recomputed, Demoted };
  Outcome outcome = Outcome::NotDecided;
};

class Explanation {
 public:
  explicit Explanation(std::vector<ExplainedCall> calls) : calls_(std::move(calls)) {}

  const std::vector<ExplainedCall>& calls() const { return calls_; }
  // Bytes the region keeps on the device after the forward (saved calls).
  int64_t saved_bytes() const;
  // The saved calls, each with the bytes it keeps (a saved call whose
  // outputs share the storage of an earlier call's, aten::_unsafe_view of a
  // matmul's, keeps that storage: its bytes count once), and the demoted
  // calls (SavedCall::demoted, no bytes): what sac::StepPhases::predict_peak
  // changes a step by.
  std::vector<SavedCall> saved_calls() const;
  // Bytes offloaded to the copy target.
  int64_t offloaded_bytes() const;
  // Time of the calls the recomputation runs: every call before its stop
  // (OpCallProfile::past_stop) but the kept ones (views, in-place ops and
  // calls the policy was not asked about included).
  double recompute_seconds() const;

  void print(std::ostream& out) const;

 private:
  std::vector<ExplainedCall> calls_;
};

Explanation explain(const Policy& policy, const std::function<void()>& region);

}  // namespace sac
