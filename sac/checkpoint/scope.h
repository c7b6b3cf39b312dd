// sac::CheckpointScope: the checkpoint options of a block of code, in a line.
//
//   {
//     sac::CheckpointScope scope(sac::CheckpointOptions().policy(policy));
//     auto y = sac::checkpoint(fn, x);  // selective, with `policy`
//     sac::CheckpointRegion region;     // so is this region
//   }
//
// While a scope lives, sac::checkpoint calls and CheckpointRegion guards on
// its thread that are given no options use the scope's; those given options
// use their own. Scopes nest: the innermost wins, and the outer one is back
// when it ends (also by exception). Each region still gets its own selective
// modes: a policy in the scope is shared, its contexts are not.
#pragma once

#include <sac/checkpoint/options.h>

namespace sac {

class CheckpointScope {
 public:
  explicit CheckpointScope(CheckpointOptions options);
  ~CheckpointScope();
  CheckpointScope(const CheckpointScope&) = delete;
  CheckpointScope& operator=(const CheckpointScope&) = delete;
};

namespace detail {
// The innermost scope's options on this thread, or the defaults.
CheckpointOptions scoped_options();
}  // namespace detail

}  // namespace sac
