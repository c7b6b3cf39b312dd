// The errors a checkpointed run may stop with: sac's documented limits.
#pragma once

#include "program.h"

namespace {

// ---- Expected limits ---------------------------------------------------------
//
// A checkpointed run that stops with a c10::Error whose message contains one
// of these substrings hit a documented limit: the case counts as an expected
// limit of that category, not as a failure. Where `applies` is set, the entry
// holds only for programs that do what the limit is about (the same message
// from a program that does not is a failure: sac blamed the wrong thing).
// Anything else is a failure.
//
// (A case whose *reference* run throws is not listed here: the program itself
// is invalid under plain autograd, so the case is skipped and counted as
// invalid.)
struct Program;
bool modifies_region_output_later(const Program& p);
bool modifies_region_read_later(const Program& p);
bool retains_graph(const Program& p);
bool has_inner_grad(const Program& p);
bool under_offload_guard(const Program& p);
bool drifts_in_region(const Program& p);

struct AllowedError {
  const char* substring;
  const char* category;
  bool (*applies)(const Program&);
};
const AllowedError kAllowedErrors[] = {
    // Autograd's own version check of saved tensors. Checkpointing saves a
    // region's tensor arguments the way autograd saves op inputs, so an
    // argument modified in place after the region read it fails here even
    // where plain autograd saved nothing of it.
    {"modified by an inplace operation", "inplace-modified", nullptr},
    // The same check where sac::OffloadGuard's hooks keep the saved tensor.
    {"sac::OffloadGuard: a tensor saved for backward was modified in place", "inplace-modified",
     &under_offload_guard},
    // A selective region serves its cache to one backward pass; a second
    // backward through it cannot be served: retain_graph and a second
    // backward of the loss, or an inner torch::autograd::grad that runs
    // through the region (or inside its forward) before the loss's backward.
    {"backward an extra time", "extra-backward (retain_graph)", &retains_graph},
    {"backward an extra time", "extra-backward (inner grad)", &has_inner_grad},
    // A selective region's cached output modified in place after the
    // region's forward (allow_cache_entry_mutation(true) would allow it).
    {"was modified in place after the checkpointed forward", "cached-output-modified",
     &modifies_region_output_later},
    // A tensor the region reads from outside (captured, not an argument)
    // modified in place before the recomputation read it again. The first
    // wording is the one asked for; the second the one sac now uses.
    {"was modified in place after the checkpointed function read it", "outside-modified",
     &modifies_region_read_later},
    {"was modified in place after the forward read it", "outside-modified",
     &modifies_region_read_later},
    // The same for a sac::CheckpointRegion guard, whose outside tensors are
    // its region's inputs and captured leaves alike.
    {"was modified in place after the region read it", "outside-modified",
     &modifies_region_read_later},
    // A drift step (an op with its own state) recomputed: the value check,
    // on in every region around one, names the saved tensor that differs.
    {"gave a different value than its forward", "value-differs", &drifts_in_region},
};

}  // namespace
