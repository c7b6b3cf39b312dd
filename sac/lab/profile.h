// sac::profile: what a region's ops cost, call by call.
//
//   sac::RegionProfile p = sac::profile([&] { block->forward(x); });  // 3 runs
//   p.print(std::cout, sac::RegionProfile::SortBy::Bytes);
//
// The profile runs the region, as a plain forward (autograd as usual), and
// records each op call that reaches below autograd: the op, which call
// of it this is (the `ctx.call` a policy is told), the bytes of the new
// storage its outputs hold, its time, and what it is. The cacheable calls
// (Note [Cacheable ops]) are the choices of a policy; their bytes are what
// saving them keeps, exactly.
//
// Under the fallback-key mechanism every op is seen; under per-op kernels,
// the cacheable ops only (views and in-place ops are not intercepted there;
// see Note [The interceptor]).
//
// The region really runs: its random ops draw from their generators and its
// in-place ops on buffers (BatchNorm's running statistics) happen. Seed and
// restore what the experiment needs before the runs it compares.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <utility>
#include <vector>

namespace sac {

struct OpCallProfile {
  c10::OperatorHandle op;
  // Which call of `op` in the region it is, from 0.
  size_t call = 0;
  // Bytes of the storages among its outputs that no input and no earlier
  // call held (each storage counted once): what saving the call keeps.
  int64_t output_bytes = 0;
  // Wall time of the call, in seconds (on CPU, its compute).
  double seconds = 0;
  bool view = false;        // an output aliases an input
  bool in_place = false;    // it writes an input (in-place or out=)
  bool random = false;      // it draws from a generator
  bool collective = false;  // a c10d collective
  bool cacheable = false;   // a policy is asked about it
  // Where its first tensor output lives: an accelerator's outputs can be
  // offloaded (sac/lab/budget.h).
  c10::Device device = c10::kCPU;
  // An output was modified in place later in the region (LibTorch's
  // nn::Linear adds its bias in place on 3-D input): sac would demote the
  // call to recomputation, so saving it keeps nothing.
  bool modified_later = false;
  // Earlier calls (indices in RegionProfile::calls()) whose new storage this
  // cacheable call's outputs hold too, as aten::_unsafe_view holds a
  // matmul's result: saving either keeps those bytes, which are counted once,
  // at the call that made them. A budgeted plan saves such calls together.
  std::vector<size_t> shares_storage_with;

  // A choice for a policy: cacheable and kept when saved.
  bool keepable() const { return cacheable && !modified_later; }
};

class RegionProfile {
 public:
  explicit RegionProfile(std::vector<OpCallProfile> calls) : calls_(std::move(calls)) {}

  // In the order the region ran them.
  const std::vector<OpCallProfile>& calls() const { return calls_; }
  // What saving every keepable call keeps (everything_saveable()).
  int64_t keepable_bytes() const;
  // What recomputing every keepable call costs.
  double keepable_seconds() const;

  enum class SortBy { Order, Bytes, Time };
  // A table, one row per call; `limit` rows at most (0: all).
  void print(std::ostream& out, SortBy sort = SortBy::Order, size_t limit = 0) const;
  // The same as CSV with a header row.
  void write_csv(std::ostream& out) const;

 private:
  std::vector<OpCallProfile> calls_;
};

// Runs `region` `runs` times and profiles its ops (see above): bytes and
// kinds from the first run, each call's time the least of all runs (the
// first run of a process pays for warm-up). Every run must make the same op
// calls; a run that differs is an error.
RegionProfile profile(const std::function<void()>& region, int runs = 3);

}  // namespace sac
