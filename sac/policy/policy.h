// A selective checkpointing policy: for each op call in a region, whether to
// save its outputs, recompute them or offload them.
//
// Policies come from the factories below, from the presets
// (sac/policy/presets.h) and from combinators of other policies
// (sac/policy/combinators.h). All of them are `Policy` values, usable
// wherever a policy is: CheckpointOptions::policy, the wrappers and scopes.
#pragma once

#include <sac/policy/checkpoint_policy.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace sac {

// A policy is asked about every call of an op in its domain, in a region run
// under a caching mode, once, after the op ran. It is cheap to copy: copies
// share one immutable rule (and one callback object: a stateful callback
// keeps its state across copies).
class Policy {
 public:
  using Fn = std::function<CheckpointPolicy(const SelectiveCheckpointContext&,
                                            const c10::OperatorHandle& op,
                                            c10::ArrayRef<c10::IValue> args)>;
  using BoolFn =
      std::function<bool(const SelectiveCheckpointContext&, const c10::OperatorHandle& op,
                         c10::ArrayRef<c10::IValue> args)>;

  // The op calls a policy is asked about: every cacheable op
  // (Note [Cacheable ops]), or a list of them; and the named values
  // (sac/policy/tag.h), or not.
  struct Domain {
    bool every_cacheable_op = false;
    std::vector<c10::OperatorHandle> ops;  // without every_cacheable_op
    // Whether the policy is asked about sac::tag calls, and the names it
    // mentions: a region whose forward tags none of them is reported.
    bool tags = false;
    std::vector<std::string> names;

    static Domain every_cacheable() {
      Domain domain;
      domain.every_cacheable_op = true;
      return domain;
    }
    static Domain listed(std::vector<c10::OperatorHandle> ops) {
      Domain domain;
      domain.ops = std::move(ops);
      return domain;
    }

    bool contains(const c10::OperatorHandle& op) const;
    // Both domains' ops and tags.
    Domain united_with(const Domain& other) const;
    // This domain with `other`'s tags and names added.
    Domain with_tags_of(const Domain& other) const;
  };

  // What a policy is made of: the answer for one call. Implement it for a
  // kind of policy the factories, presets and combinators do not make.
  class Rule {
   public:
    virtual ~Rule() = default;
    // The answer for one call of `op`. A combinator asks each of its rules
    // about every op of the combined domain: a rule answers PreferRecompute
    // for ops not in its domain. A rule whose domain has no tags is
    // never asked about sac::tag.
    virtual CheckpointPolicy decide(const SelectiveCheckpointContext& ctx,
                                    const c10::OperatorHandle& op,
                                    c10::ArrayRef<c10::IValue> args) const = 0;
    virtual Domain domain() const = 0;
    // How the policy reads in messages: "save_ops(aten::mm)".
    virtual std::string describe() const = 0;
    // False for a region a budgeted plan leaves unchecked (sac/lab/budget.h):
    // it keeps what autograd saves, which costs less than keeping every
    // call. sac::checkpoint and sac::CheckpointRegion then run the region
    // plainly, as Python's sac.context_fn does under PyTorch's checkpoint;
    // create_selective_checkpoint_contexts refuses it.
    virtual bool checkpoints() const { return true; }
  };

  explicit Policy(std::shared_ptr<const Rule> rule);

  // Saves (MustSave) the outputs of the listed ops and recomputes
  // (PreferRecompute) everything else. Names are resolved now, strictly (see
  // Note [Resolving op names]): an unknown name, an ambiguous one, or one that
  // sac can never cache (a view, an in-place op, a composite op that never
  // reaches below autograd, an op PyTorch ignores) throws a c10::Error that
  // says why and what to write instead. An empty list is an error too: it
  // would be full recomputation in disguise (say nothing_saveable() if that
  // is meant).
  static Policy save_ops(const std::vector<std::string>& op_names);

  // Answers `answer` for the listed ops (resolved as for save_ops) and
  // PreferRecompute for everything else.
  static Policy answer_ops(const std::vector<std::string>& op_names, CheckpointPolicy answer);
  // The same for operators found already (no checks), described as
  // `description` in messages.
  static Policy answer_ops(std::vector<c10::OperatorHandle> ops, CheckpointPolicy answer,
                           std::string description);

  // Asks `fn` about each call of every cacheable op, after the call ran:
  // `args` are its arguments, `ctx.op_output` its outputs.
  static Policy from_fn(Fn fn);
  // As above; true means MustSave and false PreferRecompute.
  static Policy from_fn(BoolFn fn);

  // Whether this policy is asked about `op` at all. Both passes of a region
  // consult it, so they count the same calls whatever else sac
  // intercepts.
  bool decides_about(const c10::OperatorHandle& op) const { return domain_->contains(op); }

  // The answer for one call. A combinator asks its policies about every op
  // of its domain; each answers PreferRecompute for the ops not in its own.
  // Tags are kept from the rules that do not ask about them here, so that a
  // callback written for aten ops never meets sac::tag.
  CheckpointPolicy decide(const SelectiveCheckpointContext& ctx, const c10::OperatorHandle& op,
                          c10::ArrayRef<c10::IValue> args) const {
    if (!domain_->tags && is_tag_op(op)) {
      return CheckpointPolicy::PreferRecompute;
    }
    return rule_->decide(ctx, op, args);
  }

  const Domain& domain() const { return *domain_; }
  const Rule& rule() const { return *rule_; }

  // Asks the dispatch floor to intercept every op in the domain.
  void prepare_interception() const;

  std::string describe() const { return rule_->describe(); }
  // Whether a region under this policy is checkpointed (see Rule::checkpoints).
  bool checkpoints() const { return rule_->checkpoints(); }

 private:
  // Whether `op` is sac::tag's operator (Note [The tag operator]).
  static bool is_tag_op(const c10::OperatorHandle& op);

  std::shared_ptr<const Rule> rule_;
  std::shared_ptr<const Domain> domain_;
};

}  // namespace sac
