// Note [Ranks agree before a replay]
//
// What a region's forward communicated, so that its replay can communicate
// again only when every rank of each group replays the same thing.
//
// A region that runs collectives (FSDP's all-gathers of a layer's
// parameters, a broadcast of buffers, the functional collectives of tensor
// parallelism) replays them in backward: the replay gathers the parameters
// again from the shards, as the forward did, and the ranks communicate
// again. Under SPMD every rank replays the same regions in the same order,
// and the replays pair up. A rank that replays another region at that point
// (its loss does not use a region's outputs, its code took another branch)
// would pair its collectives with another region's on the other ranks: a
// hang, or worse a silent exchange of the wrong parameters when the shapes
// match. So before a replay communicates, the ranks of each group it uses
// exchange a fingerprint of what they are about to replay (one small
// all-gather per group), and if any rank's differs, every rank throws the
// same error instead of communicating.
//
// A region's fingerprint on a group: the index, among every collective that
// regions of this process recorded on that group, of the region's first one;
// how many it recorded there; and a hash of their signatures
// (detail::collective_signature: ops, shapes, dtypes, arguments). Ranks that
// ran the same forward number the same collectives the same way.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sac::detail {

class Communication {
 public:
  // The forward is about to issue collective `op` with `args`.
  void note(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args);

  // Whether the forward issued any collective.
  bool empty() const { return groups_.empty(); }

  // Before a replay communicates: exchanges fingerprints with the other
  // ranks of each group, in the order the forward first used them, and
  // throws (on every rank) if any differs. Returns how many exchanges it made.
  size_t agree() const;

 private:
  struct Group {
    c10::intrusive_ptr<c10::intrusive_ptr_target> group;  // a c10d::ProcessGroup
    std::string name;
    c10::Device device = c10::kCPU;  // where its collectives' tensors were
    int64_t first = 0;               // the group's index of the first call
    int64_t calls = 0;
    uint64_t hash = 14695981039346656037ull;  // FNV-1a of the signatures
    std::string first_call;                   // for the error
  };
  std::vector<Group> groups_;
};

// Waits for the c10d::Work among `outputs` (a c10d:: collective returns one;
// the forward's code waited for it, a replay waits at once).
void wait_for_work(c10::ArrayRef<c10::IValue> outputs);

}  // namespace sac::detail
