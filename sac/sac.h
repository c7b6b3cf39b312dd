// sac: selective activation checkpointing for LibTorch.
//
//   auto policy = sac::Policy::save_ops({"aten::mm", "aten::addmm"});
//   auto y = sac::checkpoint(sac::CheckpointOptions().policy(policy),
//                            [&](const at::Tensor& x) { return mlp->forward(x); },
//                            x);
//
// The front door: the checkpointing API, 38 names
// (python3 tools/public_names.py sac/sac.h; CI keeps it at 40 or fewer).
// What it declares, by header:
//   sac/checkpoint/checkpoint.h    sac::checkpoint and its options (options.h)
//   sac/checkpoint/region.h        the same for any code, by an RAII guard
//   sac/checkpoint/scope.h         the options of a block of code
//   sac/checkpoint/graph_exec_group.h  backward passes that recompute once
//   sac/policy/policy.h            which op calls to save, recompute, offload
//   sac/policy/combinators.h       any_of, all_of, except, every_nth, ...
//   sac/policy/tag.h, names.h      named values: sac::tag and name policies
//   sac/cache/selective_modes.h    PyTorch's create_selective_checkpoint_contexts
//   sac/cache/statistics.h         what regions did with their ops, counted
//   sac/offload/offload.h          saved tensors kept in host memory
//   sac/base/copy_target.h         where offloaded tensors go (host_memory())
//   sac/base/context.h             the contexts a context_fn returns
//   sac/base/error.h               sac::CheckpointError
//   sac/dispatch/mechanism.h       how sac sits below autograd (SAC_DISPATCH)
//   sac/checkpoint/guards.h        thread-local overrides of the options:
//                                  debug, early stop, the determinism check
// The other doors, each included on its own:
//   sac/policy/presets.h           ready-made policies (JAX's, torchtitan's, ...)
//   sac/lab.h                      the policy lab: profiles, explanations,
//                                  budgets, a training step's peak
//   sac/nn/...                     torch::nn models: checkpoint_wrapper.h,
//                                  apply_activation_checkpointing.h,
//                                  checkpoint_sequential.h, offload_wrapper.h
//                                  (they bring in torch::nn's headers)
// The floors' internal/ headers (interceptors, the op cache, the recorder)
// are not part of the API and are not installed.
#pragma once

#include <sac/base/context.h>
#include <sac/base/copy_target.h>
#include <sac/base/error.h>
#include <sac/cache/selective_modes.h>
#include <sac/cache/statistics.h>
#include <sac/checkpoint/checkpoint.h>
#include <sac/checkpoint/graph_exec_group.h>
#include <sac/checkpoint/guards.h>
#include <sac/checkpoint/options.h>
#include <sac/checkpoint/region.h>
#include <sac/checkpoint/scope.h>
#include <sac/dispatch/mechanism.h>
#include <sac/offload/offload.h>
#include <sac/policy/checkpoint_policy.h>
#include <sac/policy/combinators.h>
#include <sac/policy/names.h>
#include <sac/policy/policy.h>
#include <sac/policy/tag.h>
