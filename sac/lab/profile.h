// sac::profile: what a region's ops cost, call by call.
//
//   sac::RegionProfile p = sac::profile([&] { block->forward(x); });  // 3 runs
//   p.print(std::cout, sac::RegionProfile::SortBy::Bytes);
//
// The profile runs the region, as a plain forward (autograd as usual), and
// notes each op call that reaches below autograd: the op, which call
// of it this is (the `ctx.call` a policy is told), the bytes of the new
// storage its outputs hold, its time, and what it is. The cacheable calls
// (Note [Cacheable ops]) are the choices of a policy; their bytes are what
// saving them holds on the device, exactly.
//
// Under the fallback-key mechanism every op is seen; under per-op kernels,
// the cacheable ops only (views and in-place ops are not intercepted there;
// see Note [The interceptor]).
//
// Which calls the recomputation reaches is read from the saved tensors:
// with early stop, a checkpoint's recomputation ends once autograd has saved
// again every tensor it saved in the forward, so the calls after the last
// save are never run again (OpCallProfile::past_stop). Profile the region as
// the step runs it, with autograd recording (a profile without it is
// refused): a region that saves nothing is never recomputed, and every call
// of its profile is past the stop.
//
// The region really runs: its random ops draw from their generators and its
// in-place ops on buffers (BatchNorm's running statistics) happen. Seed and
// restore what the experiment needs before the runs it compares.
#pragma once

#include <sac/base/returned.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace sac {

struct OpCallProfile {
  c10::OperatorHandle op;
  // Which call of `op` in the region it is, from 0.
  size_t call = 0;
  // Bytes of the storages among its outputs that no input and no earlier
  // call held (each storage counted once): what saving the call holds on the device.
  int64_t output_bytes = 0;
  // Wall time of the call, in seconds (on CPU, its compute).
  double seconds = 0;
  // Its floating-point operations by torch.utils.flop_counter's formulas:
  // matrix products, convolutions and fused attention; 0 for other ops.
  int64_t flops = 0;
  bool view = false;        // an output aliases an input
  bool in_place = false;    // it writes an input (in-place or out=)
  bool random = false;      // it draws from a generator
  bool collective = false;  // a c10d collective
  bool cacheable = false;   // a policy is asked about it
  // The region returns a tensor on its outputs' new storage (see
  // profile()): saving the call holds nothing of that storage the caller
  // does not hold, and output_bytes leave it out.
  bool returned = false;
  // Where its first tensor output lives: an accelerator's outputs can be
  // offloaded (sac/lab/budget.h).
  c10::Device device = c10::kCPU;
  // An output was modified in place later in the region (LibTorch's
  // nn::Linear adds its bias in place on 3-D input): sac would demote the
  // call to recomputation, so saving it holds nothing on the device.
  bool modified_later = false;
  // The recomputation never reaches it: with early stop (the default) a
  // recomputation ends once autograd has saved again every tensor it saved
  // in the forward, and the profile saw the last of those saved before this
  // call ran. Left out, it costs nothing; kept, it saves nothing.
  bool past_stop = false;
  // Earlier calls (indices in RegionProfile::calls()) whose new storage this
  // cacheable call's outputs hold too, as aten::_unsafe_view holds a
  // matmul's result: saving either holds those bytes, which are counted once,
  // at the call that made them. A budgeted plan saves such calls together.
  std::vector<size_t> shares_storage_with = {};

  // A choice for a policy: cacheable and kept when saved.
  bool keepable() const { return cacheable && !modified_later; }
  // What leaving it to the recomputation costs: its time, or nothing past
  // the stop.
  double recompute_seconds() const { return past_stop ? 0 : seconds; }
  int64_t recompute_flops() const { return past_stop ? 0 : flops; }
};

class RegionProfile {
 public:
  // `plain_bytes` < 0: not measured (a profile made by hand, or of a region
  // that returns nothing).
  explicit RegionProfile(std::vector<OpCallProfile> calls, int64_t plain_bytes = -1)
      : calls_(std::move(calls)), plain_bytes_(plain_bytes) {}

  // In the order the region ran them.
  const std::vector<OpCallProfile>& calls() const { return calls_; }
  // What the region keeps when it is not checkpointed: the bytes of the
  // storages its calls made that were still alive when its first profiled
  // run returned (what autograd saved for backward), beyond what it returned.
  // A storage the region hands out otherwise (assigned to a variable the
  // caller reads) counts here too: return it instead. Negative if not
  // measured.
  int64_t plain_bytes() const { return plain_bytes_; }
  // What saving every keepable call keeps (everything_saveable()).
  int64_t keepable_bytes() const;
  // What recomputing every keepable call costs (those past the stop cost
  // nothing).
  double keepable_seconds() const;

  enum class SortBy { Order, Bytes, Time };
  // A table, one row per call; `limit` rows at most (0: all).
  void print(std::ostream& out, SortBy sort = SortBy::Order, size_t limit = 0) const;
  // The same as CSV with a header row.
  void write_csv(std::ostream& out) const;

 private:
  std::vector<OpCallProfile> calls_;
  int64_t plain_bytes_;
};

namespace detail {
// The region, handing what it returns to its argument; false if it
// returns nothing at all (void, or None from Python).
using ProfiledRegion = std::function<bool(std::vector<at::Tensor>& returned)>;
RegionProfile profile_region(const ProfiledRegion& region, int runs, int warmup);

}  // namespace detail

// Runs `region` `warmup` times unprofiled, then `runs` times profiled (see
// above): bytes and kinds from the first profiled run, each call's time the
// least of all runs (the first run of a process pays for warm-up). Every
// profiled run must make the same op calls; a run that differs is an error.
// A region whose first run does more (lazy initialisation: FSDP's, a cache
// filled once) needs warmup = 1.
//
// `region` returns what it makes (a tensor, a std::vector or std::tuple of
// them: a block's output, a loss): the calls that made those are
// `returned`, and keeping them costs nothing (a plan's saved bytes are then
// what checkpointing the region keeps beyond its outputs). A region that
// returns nothing (void) drops its graph as it returns, so what it keeps
// unchecked is not measured: plain_bytes() is -1, and a budgeted plan
// never leaves it unchecked.
template <class Region>
RegionProfile profile(Region&& region, int runs = 3, int warmup = 0) {
  return detail::profile_region(
      [&](std::vector<at::Tensor>& returned) {
        if constexpr (std::is_void_v<std::invoke_result_t<Region&>>) {
          region();
          return false;
        } else {
          detail::collect_returned(region(), returned);
          return true;
        }
      },
      runs, warmup);
}

}  // namespace sac
