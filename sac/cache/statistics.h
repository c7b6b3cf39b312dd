// What selective-checkpointing regions did with their ops, for the caller to
// read after forward and after backward.
//
//   auto stats = std::make_shared<sac::RegionStatistics>();
//   auto y = sac::checkpoint(sac::CheckpointOptions().policy(p).statistics(stats), fn, x);
//   stats->read().print(std::cout);   // the forward: saved, recomputed, bytes
//   y.sum().backward();
//   stats->read().print(std::cout);   // and the recomputation: served, rerun, time
//
// The counts are sums over every region that shares the object (pass one to
// each block of a model for the model's totals; reset() between steps).
// Counting is off unless a region has a RegionStatistics: the byte counts
// cost a hash lookup per op call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <mutex>

namespace sac {

// A sum of Counts that regions add to: after each forward and each
// recomputation, from whichever thread ran it (a backward may recompute on
// autograd's device threads).
class RegionStatistics {
 public:
  struct Counts {
    // ---- Forward: complete once a region's forward has ended.
    size_t forwards = 0;  // regions whose forward ended
    // Op calls the policy was asked about (tags not included), and what came
    // of them at the end of the forward (tags and in-place changes included):
    // seen = saved + offloaded + recomputed.
    size_t calls_seen = 0;
    size_t calls_saved = 0;       // outputs saved (on their device)
    size_t calls_offloaded = 0;   // outputs copied to the offload target
    size_t calls_recomputed = 0;  // left to the recomputation
    // Of the recomputed: answered save or offload, but an output was modified
    // in place later in the forward (Note [The op cache]).
    size_t calls_demoted = 0;
    size_t tags = 0;  // sac::tag calls (sac/policy/tag.h)
    // Bytes of the storages the seen calls' outputs hold (each storage counted
    // once; for a region whose ops make their outputs, as sac::profile counts
    // them), split as: saved on the device after the forward (before a
    // sac::OffloadGuard stashes them), moved to the offload target, or left
    // for the recomputation to make again.
    int64_t bytes_saved = 0;
    int64_t bytes_offloaded = 0;
    int64_t bytes_dropped = 0;
    // Collectives the forwards issued, decided about or not: the functional
    // ones (Note [The collective ledger]) and, where the mode sees them (the
    // fallback-key mechanism, and every sac::CheckpointRegion), c10d's own
    // (a ProcessGroup's calls: FSDP's all-gathers, DDP's broadcasts).
    size_t collectives_issued = 0;

    // ---- Backward: each recomputation adds to these.
    size_t recomputations = 0;  // passes (one per region and backward, usually)
    size_t calls_served = 0;    // seen calls served from the cache
    size_t calls_rerun = 0;     // seen calls run again (early stop runs fewer)
    // Collectives issued again (not served from the cache), counted as
    // collectives_issued is: each one communicated again.
    size_t collectives_reissued = 0;
    // The ranks' fingerprint exchanges before a sac::CheckpointRegion's replay
    // communicates (Note [Ranks agree before a replay]): one small all-gather
    // per process group the replay uses, on top of collectives_reissued.
    size_t agreements = 0;
    // Wall time of the recomputation passes, autograd's work in them included.
    double recompute_seconds = 0;

    Counts& operator+=(const Counts& other);
    void print(std::ostream& out) const;
  };

  Counts read() const;
  void reset();
  void add(const Counts& counts);

 private:
  mutable std::mutex mutex_;
  Counts counts_;
};

}  // namespace sac
