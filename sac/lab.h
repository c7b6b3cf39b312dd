// sac's policy lab: experiments on policies, op by op. What a region's op
// calls cost, what a policy does with them, the plan of least recomputation
// under a budget of bytes or of a training step's peak.
//
//   sac::RegionProfile profile = sac::profile([&] { return block->forward(x); });
//   // Keep at most half of what the region keeps without checkpointing.
//   sac::Policy policy = sac::budgeted_policy(profile, sac::Budget::fraction(0.5));
//   std::cout << sac::explain(policy, [&] { block->forward(x); });
//
// What it declares, by header (docs/lab.md says more):
//   sac/lab/profile.h      sac::profile: each op call's bytes and time
//   sac/lab/explain.h      sac::explain: a policy's answers and what came of them
//   sac/lab/budget.h       budgeted policies and plans (a knapsack of bytes)
//   sac/lab/peak.h         a training step's peak, predicted and planned for
//   sac/lab/memory.h       sac::measure_peak: a function's peak, from c10's reports;
//                          MemoryProbe, an allocator's counters
//   sac/lab/shape_plans.h  a plan per input shape
// The checkpointing API is sac/sac.h's; this door stands beside it.
#pragma once

#include <sac/lab/budget.h>
#include <sac/lab/explain.h>
#include <sac/lab/memory.h>
#include <sac/lab/peak.h>
#include <sac/lab/profile.h>
#include <sac/lab/shape_plans.h>
