#include <sac/lab/internal/plan_trace.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace sac::detail {
namespace {

const TracedCall* find_call(
    const std::unordered_map<c10::OperatorHandle, std::vector<TracedCall>>& calls,
    const c10::OperatorHandle& op, size_t call_index) {
  const auto found = calls.find(op);
  return found == calls.end() || call_index >= found->second.size() ? nullptr
                                                                    : &found->second[call_index];
}

}  // namespace

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
                   const std::vector<bool>& checkpointed) {
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

}  // namespace sac::detail
