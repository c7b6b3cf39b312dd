// A program run plain and checkpointed, compared bit for bit; one case, and
// the child process's and --replay's loops.
#pragma once

#include "generator.h"
#include "limits.h"
#include "ops.h"
#include "program.h"

namespace {

// ---- Running ---------------------------------------------------------------

// The leaves and modules of one run. The reference and the checkpointed run
// each build their own, identically (same torch seed), so parameter updates
// of one never reach the other.
struct Instance {
  std::vector<at::Tensor> leaves;  // by value id; undefined for non-leaves
  std::vector<torch::nn::Linear> linears;
  std::vector<torch::nn::LayerNorm> norms;
  std::vector<torch::nn::BatchNorm1d> batch_norms;
  std::vector<at::Tensor> targets;  // gradients are taken w.r.t. these
  std::vector<std::string> target_names;
  std::vector<at::Tensor> params;  // updated after each iteration

  explicit Instance(const Program& p) : leaves(p.values.size()) {
    torch::manual_seed(p.seed ^ 0x5eed5eedull);
    for (size_t i = 0; i < p.values.size(); ++i) {
      const Value& v = p.values[i];
      if (v.leaf == Leaf::None) continue;
      at::Tensor t = torch::randn(v.shape) * v.init_scale + v.init_offset;
      if (v.leaf != Leaf::Buffer) {
        t.requires_grad_(true);
        targets.push_back(t);
        target_names.push_back(v.name);
        if (v.leaf == Leaf::Param) params.push_back(t);
      }
      leaves[i] = t;
    }
    for (size_t m = 0; m < p.modules.size(); ++m) {
      const ModuleSpec& spec = p.modules[m];
      linears.emplace_back(nullptr);
      norms.emplace_back(nullptr);
      batch_norms.emplace_back(nullptr);
      std::vector<std::pair<std::string, at::Tensor>> named;
      if (spec.batch_norm) {
        batch_norms[m] = torch::nn::BatchNorm1d(p.W);
        torch::NoGradGuard no_grad;
        batch_norms[m]->weight.add_(torch::randn({p.W}) * 0.1);
        batch_norms[m]->bias.add_(torch::randn({p.W}) * 0.1);
        named = {{"weight", batch_norms[m]->weight}, {"bias", batch_norms[m]->bias}};
      } else if (spec.layer_norm) {
        norms[m] = torch::nn::LayerNorm(torch::nn::LayerNormOptions({p.W}));
        torch::NoGradGuard no_grad;
        // Not the identity: gradients then depend on the affine parameters.
        norms[m]->weight.add_(torch::randn({p.W}) * 0.1);
        norms[m]->bias.add_(torch::randn({p.W}) * 0.1);
        named = {{"weight", norms[m]->weight}, {"bias", norms[m]->bias}};
      } else {
        linears[m] = torch::nn::Linear(torch::nn::LinearOptions(p.W, p.W).bias(spec.bias));
        named = {{"weight", linears[m]->weight}};
        if (spec.bias) named.emplace_back("bias", linears[m]->bias);
      }
      for (auto& [name, t] : named) {
        targets.push_back(t);
        target_names.push_back("m" + std::to_string(m) + "." + name);
        params.push_back(t);
      }
    }
  }
};

at::Tensor from_doubles(const std::vector<double>& data, size_t offset,
                        std::vector<int64_t> shape) {
  std::vector<float> f(data.begin() + offset, data.end());
  return torch::from_blob(f.data(), {static_cast<int64_t>(f.size())}, torch::kFloat)
      .clone()
      .view(shape);
}

using Env = std::vector<at::Tensor>;

// Runs a program, either inline (reference) or with its regions checkpointed.
// Regions' functions capture `this`: a Runner outlives the graphs it builds.
class Runner {
 public:
  Runner(const Program& p, Instance& inst, bool checkpointed)
      : p_(p), inst_(inst), checkpointed_(checkpointed) {}

  at::Tensor forward() {
    std::optional<sac::OffloadGuard> offload;
    if (checkpointed_ && p_.offload_guard != 0) {
      sac::OffloadOptions options;
      options.target(std::make_shared<HostCopies>());
      if (p_.offload_guard == 2) options.leave_in_place(inst_.params);
      if (p_.offload_guard == 3) options.min_bytes(int64_t{1} << 40);
      offload.emplace(options);
    }
    Env env = inst_.leaves;
    exec(env, 0, p_.steps.size(), -1);
    at::Tensor loss;
    for (size_t k = 0; k < p_.loss.size(); ++k) {
      at::Tensor term = env.at(p_.loss[k]).sum() * static_cast<double>(k + 1);
      loss = loss.defined() ? loss + term : term;
    }
    return loss;
  }

 private:
  void exec(Env& env, int begin, int end, int parent) {
    for (int i = begin; i < end;) {
      auto child = p_.region_at.find({parent, i});
      if (child != p_.region_at.end()) {
        region(env, child->second);
        i = p_.regions[child->second].end;
      } else {
        step(env, p_.steps[i++]);
      }
    }
  }

  std::vector<at::Tensor> body(int64_t r, const std::vector<at::Tensor>& args) {
    const Region& R = p_.regions.at(r);
    if (args.size() != R.ins.size()) {
      throw std::logic_error("sac_fuzz: region r" + std::to_string(r) + " got " +
                             std::to_string(args.size()) + " tensor arguments, expected " +
                             std::to_string(R.ins.size()));
    }
    Env local(p_.values.size());
    if (R.capture_leaves) {
      for (size_t i = 0; i < local.size(); ++i) local[i] = inst_.leaves[i];
    }
    for (size_t k = 0; k < args.size(); ++k) local[R.ins[k]] = args[k];
    exec(local, R.begin, R.end, r);
    std::vector<at::Tensor> outs;
    for (int id : R.outs) outs.push_back(local.at(id));
    return outs;
  }

  void region(Env& env, int r) {
    const Region& R = p_.regions[r];
    std::vector<at::Tensor> args;
    for (int id : R.ins) args.push_back(env.at(id));
    std::vector<at::Tensor> outs;
    if (!checkpointed_) {
      outs = body(r, args);
    } else if (as_guard(r)) {
      sac::CheckpointRegion guard(options_for(R));
      outs = body(r, args);
    } else {
      // The region index travels as a non-tensor argument, so a copy of it
      // must come back intact for the recomputation.
      const int64_t tag = r;
      const auto options = options_for(R);
      const int style = args.empty() ? 0 : R.arg_style;
      if (style == 0) {
        outs = sac::checkpoint(
            options, [this](const std::vector<at::Tensor>& xs, int64_t t) { return body(t, xs); },
            args, tag);
      } else {
        const std::vector<at::Tensor> rest(args.begin() + 1, args.end());
        if (style == 1) {
          outs = sac::checkpoint(
              options,
              [this](const at::Tensor& first, const std::vector<at::Tensor>& more, int64_t t) {
                std::vector<at::Tensor> xs{first};
                xs.insert(xs.end(), more.begin(), more.end());
                return body(t, xs);
              },
              args[0], rest, tag);
        } else {
          outs = sac::checkpoint(
              options,
              [this](const std::optional<at::Tensor>& first, const std::vector<at::Tensor>& more,
                     int64_t t) {
                std::vector<at::Tensor> xs{first.value()};
                xs.insert(xs.end(), more.begin(), more.end());
                return body(t, xs);
              },
              std::optional<at::Tensor>(args[0]), rest, tag);
        }
      }
    }
    if (outs.size() != R.outs.size()) {
      throw std::logic_error("sac_fuzz: region returned " + std::to_string(outs.size()) +
                             " values");
    }
    for (size_t k = 0; k < outs.size(); ++k) env[R.outs[k]] = outs[k];
  }

  // Whether region `r` runs under a sac::CheckpointRegion guard rather than
  // in a sac::checkpoint call.
  bool as_guard(int64_t r) const {
    switch (regions_as()) {
      case RegionsAs::Checkpoint: return false;
      case RegionsAs::Guard: return true;
      case RegionsAs::Mixed: return (p_.seed + static_cast<uint64_t>(r)) % 2 == 1;
    }
    return false;
  }

  static sac::Policy make_policy(const PolicySpec& s) {
    sac::Policy policy = make_base_policy(s);
    return s.keep_shape_deciding ? sac::any_of({policy, sac::shape_deciding_ops()}) : policy;
  }

  static sac::Policy make_base_policy(const PolicySpec& s) {
    using Ctx = sac::SelectiveCheckpointContext;
    using Args = c10::ArrayRef<c10::IValue>;
    switch (s.kind) {
      case PolicySpec::SaveOps: return sac::Policy::save_ops(s.names);
      case PolicySpec::SaveAll:
        return sac::Policy::from_fn(
            sac::Policy::Fn([](const Ctx&, const c10::OperatorHandle&, Args) {
              return sac::CheckpointPolicy::MustSave;
            }));
      case PolicySpec::HashName: {
        const uint64_t salt = s.salt;
        return sac::Policy::from_fn(
            sac::Policy::Fn([salt](const Ctx&, const c10::OperatorHandle& op, Args) {
              const auto& name = op.operator_name();
              switch (fnv1a(name.name + "." + name.overload_name, salt) % 4) {
                case 0: return sac::CheckpointPolicy::MustSave;
                case 1: return sac::CheckpointPolicy::PreferSave;
                case 2: return sac::CheckpointPolicy::MustRecompute;
                default: return sac::CheckpointPolicy::PreferRecompute;
              }
            }));
      }
      case PolicySpec::BoolHash: {
        const uint64_t salt = s.salt;
        return sac::Policy::from_fn(
            sac::Policy::BoolFn([salt](const Ctx&, const c10::OperatorHandle& op, Args) {
              return fnv1a(op.operator_name().name, salt) % 2 == 0;
            }));
      }
      case PolicySpec::EveryOther: {
        auto count = std::make_shared<uint64_t>(0);
        return sac::Policy::from_fn(
            sac::Policy::Fn([count](const Ctx&, const c10::OperatorHandle&, Args) {
              return (*count)++ % 2 == 0 ? sac::CheckpointPolicy::MustSave
                                         : sac::CheckpointPolicy::PreferRecompute;
            }));
      }
      case PolicySpec::None: break;
    }
    throw std::logic_error("sac_fuzz: no policy to make");
  }

  // Policy objects are made on first use, so a policy may well be created
  // after other regions (and other cases in this process) already ran.
  sac::Policy policy_for(const PolicySpec& s) {
    if (s.fresh) return make_policy(s);
    auto it = policies_.find(s.key);
    if (it == policies_.end()) it = policies_.emplace(s.key, make_policy(s)).first;
    return it->second;
  }

  sac::CheckpointOptions options_for(const Region& R) {
    sac::CheckpointOptions o;
    if (R.policy.kind != PolicySpec::None) {
      sac::Policy policy = policy_for(R.policy);
      switch (R.names) {
        case 1: policy = sac::any_of({policy, sac::save_only_these_names({"v0", "v2"})}); break;
        case 2: policy = sac::except(policy, sac::save_only_these_names({"v1"})); break;
        case 3:
          policy = sac::any_of({policy, sac::save_and_offload_only_these_names({"v3"}, {"v0"})});
          break;
        default: break;
      }
      std::shared_ptr<sac::CopyTarget> target;
      if (R.offload) {
        policy = sac::offload_if(policy, int64_t{0});
      }
      if (R.offload || R.names == 3) {
        target = std::make_shared<HostCopies>();
      }
      if (R.via_context_fn) {
        o.context_fn([policy, target] {
          return sac::RegionContexts(
              sac::create_selective_checkpoint_contexts(policy, false, target));
        });
      } else {
        o.policy(policy);
        if (target != nullptr) o.offload_to(target);
      }
    }
    o.early_stop(R.early_stop);
    if (R.no_determinism_check) o.determinism_check(sac::DeterminismCheck::None);
    if (R.value_check) o.determinism_check(sac::DeterminismCheck::Values);
    if (R.debug) o.debug(true);
    return o;
  }

  void step(Env& env, const Step& s) {
    auto in = [&](size_t k) -> at::Tensor& {
      at::Tensor& t = env.at(s.in.at(k));
      if (!t.defined()) {
        throw std::logic_error("sac_fuzz: " + p_.values[s.in[k]].name + " is not defined here");
      }
      return t;
    };
    // Every value is tagged: the identity, except to name policies.
    auto set = [&](size_t k, at::Tensor t) {
      env.at(s.out.at(k)) = t.defined() ? sac::tag(t, "v" + std::to_string(s.out.at(k) % 4)) : t;
    };
    switch (s.op) {
      // elementwise
      case Op::Add: set(0, in(0) + in(1)); break;
      case Op::Sub: set(0, in(0) - in(1)); break;
      case Op::Mul: set(0, in(0) * in(1)); break;
      case Op::DivConst: set(0, in(0) / s.reals[0]); break;
      case Op::Sin: set(0, torch::sin(in(0))); break;
      case Op::Exp: set(0, torch::exp(in(0).clamp(-3, 3))); break;
      case Op::Tanh: set(0, torch::tanh(in(0))); break;
      case Op::Sigmoid: set(0, torch::sigmoid(in(0))); break;
      case Op::Relu: set(0, torch::relu(in(0))); break;
      case Op::Gelu: set(0, torch::gelu(in(0), s.ints[0] ? "tanh" : "none")); break;
      case Op::Pow2: set(0, in(0).pow(2)); break;
      // reductions
      case Op::SumDim: set(0, in(0).sum({s.ints[0]}, s.ints[1] != 0)); break;
      case Op::MeanAll: set(0, in(0).mean()); break;
      case Op::MaxDim: {
        auto [values, indices] = in(0).max(-1, /*keepdim=*/true);
        set(0, values);
        set(1, indices);
        break;
      }
      case Op::Softmax: set(0, torch::softmax(in(0), s.ints[0])); break;
      case Op::LogSoftmax: set(0, torch::log_softmax(in(0), s.ints[0])); break;
      case Op::LayerNormF: set(0, torch::layer_norm(in(0), {p_.W}, in(1), in(2))); break;
      // matmuls
      case Op::Mm: set(0, in(0).mm(in(1))); break;
      case Op::MmT: set(0, (in(0).mm(in(1).t()) / static_cast<double>(p_.R)).mm(in(2))); break;
      case Op::Matmul3: set(0, in(0).matmul(in(1))); break;
      case Op::Bmm: {
        auto scores =
            torch::bmm(in(0), in(1).transpose(1, 2)) / std::sqrt(static_cast<double>(p_.W));
        set(0, torch::bmm(torch::softmax(scores, -1), in(2)));
        break;
      }
      case Op::Addmm: set(0, torch::addmm(in(0), in(1), in(2))); break;
      // views
      case Op::View: set(0, in(0).view(s.ints)); break;
      case Op::Reshape: {
        // The generator's contiguity is conservative (an elementwise result
        // of a non-contiguous input may well be contiguous): where it took
        // the result for a copy, it is one, so that in-place ops on it never
        // reach the input.
        const bool view = p_.values[s.out[0]].storage == p_.values[s.in[0]].storage;
        set(0, view ? in(0).reshape(s.ints) : in(0).reshape(s.ints).clone());
        break;
      }
      case Op::TransposeMix:
        // clone, not contiguous(): the transpose of a value that is itself a
        // transpose_copy is contiguous, and contiguous() would return it, an
        // alias the generator does not know of.
        set(0, in(0).dim() == 2
                   ? in(0).t().clone(at::MemoryFormat::Contiguous).t()
                   : in(0).transpose(0, 1).clone(at::MemoryFormat::Contiguous).transpose(0, 1));
        break;
      case Op::Narrow: set(0, in(0).narrow(-1, s.ints[0], s.ints[1])); break;
      case Op::Chunk: {
        const std::vector<at::Tensor> parts = in(0).chunk(2, -1);
        set(0, parts[0]);
        set(1, parts[1]);
        break;
      }
      case Op::SelectUnsqueeze: set(0, in(0).select(0, s.ints[0]).unsqueeze(0)); break;
      case Op::Expand: {
        auto e = in(0).expand(s.ints);
        set(0, s.reals.empty() ? e : e.contiguous());
        break;
      }
      // in-place
      case Op::FreshInplace: {
        at::Tensor h;
        switch (s.ints[0]) {
          case 0:
            h = in(0) * 2;
            h.add_(in(1));
            break;
          case 1:
            h = in(0) * 2;
            h.mul_(0.5);
            break;
          case 2:
            h = in(0) + 1;
            h.relu_();
            break;
          case 3: {
            h = in(0) * 1.5;
            if (h.dim() > 0) {
              auto v = h.narrow(-1, 0, std::min<int64_t>(2, h.size(-1)));
              v.mul_(2);
            } else {
              h.mul_(2);
            }
            break;
          }
          case 4:
            h = in(0).clone();
            h.sigmoid_();
            break;
          case 5:
          case 6:
          case 7:
          case 8: {
            h = in(0) * (s.ints[0] == 7 ? 0.5 : 2.0);
            if (h.dim() == 0) {
              h = h.clone();
            }
            at::Tensor v = h.dim() == 0 ? h
                           : s.ints[0] == 5 || s.ints[0] == 7
                               ? h.select(0, 0)
                               : h.narrow(-1, 0, std::min<int64_t>(2, h.size(-1)));
            switch (s.ints[0]) {
              case 5: v.relu_(); break;
              case 6: v.sigmoid_(); break;
              case 7: v.exp_(); break;
              default: v.tanh_(); break;
            }
            break;
          }
          case 9:
          case 10:
          case 11:
          case 12: {
            at::Tensor noise = torch::empty_like(in(0));
            switch (s.ints[0]) {
              case 9: noise.bernoulli_(0.5); break;
              case 10: noise.uniform_(); break;
              case 11: noise.normal_(); break;
              default: noise.exponential_(); break;
            }
            h = in(0) * noise;
            break;
          }
          default:
            // Early stop ends a recomputation by an exception this catch
            // takes; the catch block's ops throw it again (Note [Early stop
            // cannot be swallowed]). The forward never runs the catch block.
            try {
              h = in(0).sin() * 2;
            } catch (const std::exception&) {
              h = in(0).add(1.0).sin() * 2;
            }
            break;
        }
        set(0, h);
        break;
      }
      case Op::PoolInplace: {
        at::Tensor h = in(0);
        switch (s.ints[0]) {
          case 0: h.add_(in(1)); break;
          case 1: h.mul_(0.5); break;
          case 2: h.relu_(); break;
          case 3: {
            if (h.dim() > 0) {
              auto v = h.narrow(-1, 0, std::min<int64_t>(2, h.size(-1)));
              v.mul_(2);
            } else {
              h.mul_(2);
            }
            break;
          }
          default: h.tanh_(); break;
        }
        set(0, h);
        break;
      }
      // multi-output, random, index, cast
      case Op::Sort: {
        auto [values, indices] = torch::sort(in(0), -1, s.ints[0] != 0);
        set(0, values);
        set(1, indices);
        break;
      }
      case Op::Dropout: set(0, torch::dropout(in(0), s.reals[0], /*train=*/true)); break;
      case Op::RandLikeMul: set(0, torch::rand_like(in(0)) * in(0)); break;
      case Op::Argmax: set(0, in(0).argmax(1)); break;
      case Op::IndexSelect: set(0, in(0).index_select(0, in(1))); break;
      case Op::GatherFixed: {
        auto index = torch::from_blob(const_cast<int64_t*>(s.ints.data()),
                                      {static_cast<int64_t>(s.ints.size())}, torch::kLong)
                         .clone()
                         .view(in(0).sizes());
        set(0, torch::gather(in(0), -1, index));
        break;
      }
      case Op::GatherIdx: set(0, torch::gather(in(0), -1, in(1))); break;
      case Op::Cast64: {
        auto a = in(0).to(torch::kFloat64), b = in(1).to(torch::kFloat64);
        set(0, (s.ints[0] ? a * 1.5 + b.tanh() : a.sin() * b).to(torch::kFloat32));
        break;
      }
      // attention
      case Op::Sdpa: {
        const int64_t B = p_.B, T = p_.T, W = p_.W, H = p_.H;
        auto parts = in(0).matmul(in(1)).split(W, -1);
        auto heads = [&](const at::Tensor& t) {
          return s.ints[0] ? t.view({B, T, H, W / H}).transpose(1, 2) : t;
        };
        std::optional<at::Tensor> mask;
        if (s.ints[2]) mask = from_doubles(s.reals, 1, {T, T});
        auto out =
            at::scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]),
                                             mask, s.reals[0], /*is_causal=*/s.ints[1] != 0);
        set(0, s.ints[0] ? out.transpose(1, 2).reshape({B, T, W}) : out);
        break;
      }
      // modules
      case Op::LinearModule: set(0, inst_.linears.at(s.module)->forward(in(0))); break;
      case Op::LayerNormModule: set(0, inst_.norms.at(s.module)->forward(in(0))); break;
      case Op::BatchNormModule: set(0, inst_.batch_norms.at(s.module)->forward(in(0))); break;
      case Op::FunctionGrad: {
        const int64_t variant = s.ints[0] | s.ints[1] << 1 | s.ints[2] << 2 | s.ints[3] << 3;
        set(0, FunctionGrad::apply(in(0), in(1), variant, checkpointed_));
        break;
      }
      // non-tensor values
      case Op::ItemScale: set(0, in(0) * std::tanh(in(1).mean().item<double>())); break;
      case Op::Drift: set(0, in(0) * drift(in(0).detach(), &s - p_.steps.data())); break;
      case Op::InnerGrad: {
        at::Tensor a = in(0);
        auto t = (a.sin() * in(1)).sum();
        set(0, torch::autograd::grad({t}, {a}, {}, /*retain_graph=*/std::nullopt,
                                     /*create_graph=*/true)[0]);
        break;
      }
      case Op::BufferMutate:
        if (s.ints[0]) in(0).mul_(0.9);
        else in(0).add_(0.25);
        break;
      case Op::BufferOverwrite: {
        const at::Tensor value = in(1).detach().mean();
        at::Tensor buf = in(0);
        switch (s.ints[0]) {
          case 0: buf.copy_(value); break;
          case 1: buf.view({-1}).copy_(value); break;
          case 2: at::mul_out(buf, value.expand_as(buf), value.expand_as(buf)); break;
          case 3: buf.copy_(in(1).mean()); break;
          default: buf.select(0, 0).copy_(value); break;
        }
        set(0, in(1) * buf.mean());
        break;
      }
      // data from the host, views of one memory
      case Op::HostConst: {
        const std::vector<float> data(s.reals.begin(), s.reals.end());
        const auto n = static_cast<int64_t>(data.size());
        at::Tensor a = in(0), c;
        switch (s.ints[0]) {
          case 0: c = torch::tensor(data); break;
          case 1: c = torch::tensor(data).mul_(0.5); break;
          case 2: {
            // Memory the run owns and never changes, outside any allocator.
            auto& blob = blobs_[&s];
            if (blob.empty()) blob = data;
            c = torch::from_blob(blob.data(), {n});
            break;
          }
          case 3:
            c = torch::tensor(data);
            a = a + c;
            c.data_ptr<float>()[0] += 1;
            break;
          default: {
            c = torch::empty({n});
            const int64_t half = (n + 1) / 2;
            c.narrow(0, 0, half).fill_(0.25);
            for (int64_t i = half; i < n; ++i) c.data_ptr<float>()[i] = data[i];
          }
        }
        set(0, a * c);
        break;
      }
      case Op::HostIndex: set(0, in(0).index_select(0, torch::tensor(s.ints))); break;
      case Op::OverlapMul: set(0, in(0).narrow(-1, s.ints[0], in(1).size(-1)) * in(1)); break;
    }
  }

  const Program& p_;
  Instance& inst_;
  bool checkpointed_;
  std::map<int, sac::Policy> policies_;
  std::map<const Step*, std::vector<float>> blobs_;  // HostConst's from_blob memory
};

// What one iteration produced.
struct Snapshot {
  at::Tensor loss;
  std::vector<at::Tensor> grads, second_grads;
};

struct RunResult {
  std::vector<Snapshot> iterations;
  std::vector<std::string> target_names;
  bool threw = false;
  int error_iteration = -1;
  enum { C10, Std, Unknown } error_type = C10;
  std::string error;
};

// The program's backward passes (Program::Backward) into `snap`.
void backward(const Program& p, const Instance& inst, const at::Tensor& loss, Snapshot& snap) {
  using Backward = Program::Backward;
  const auto grad = [&](const at::Tensor& of, const std::vector<at::Tensor>& wrt, bool retain,
                        bool create = false) {
    return torch::autograd::grad({of}, wrt, {}, retain, create, /*allow_unused=*/true);
  };
  switch (p.backward) {
    case Backward::Once: snap.grads = grad(loss, inst.targets, false); return;
    case Backward::Twice:
      snap.grads = grad(loss, inst.targets, true);
      snap.second_grads = grad(loss, inst.targets, false);
      return;
    case Backward::SecondLoss:
      snap.grads = grad(loss, inst.targets, true);
      snap.second_grads = grad(loss * loss, inst.targets, false);
      return;
    case Backward::SecondOrder: {
      const std::vector<at::Tensor> first = grad(loss, inst.targets, true, /*create=*/true);
      at::Tensor squares;
      for (const at::Tensor& g : first) {
        snap.grads.push_back(g.defined() ? g.detach() : g);
        if (g.defined() && g.requires_grad()) {
          squares = squares.defined() ? squares + g.pow(2).sum() : g.pow(2).sum();
        }
      }
      if (!squares.defined()) return;
      // The buffer too where a write with grad gave it a history.
      std::vector<at::Tensor> wrt = inst.targets;
      if (p.buffer >= 0 && inst.leaves[p.buffer].requires_grad()) {
        wrt.push_back(inst.leaves[p.buffer]);
      }
      snap.second_grads = grad(squares, wrt, false);
      return;
    }
  }
}

// One iteration of a loop that leaves gradients in .grad (Program::Loop):
// backward() once or over two micro-batches, the gradients as they are
// then, a step, the gradients zeroed.
void train_step(const Program& p, Instance& inst, Runner& runner,
                std::optional<torch::optim::Adam>& adam, Snapshot& snap) {
  using Loop = Program::Loop;
  const int micro_batches = p.loop == Loop::Accumulate ? 2 : 1;
  for (int m = 0; m < micro_batches; ++m) {
    // A drift step's scale grows within a forward and its recomputation,
    // and starts again with each forward (each micro-batch's too).
    drift_calls.clear();
    const at::Tensor loss = runner.forward();
    if (m == 0) snap.loss = loss.detach().clone();
    loss.backward();
  }
  for (const at::Tensor& t : inst.targets) {
    snap.grads.push_back(t.grad().defined() ? t.grad().clone() : at::Tensor());
  }
  if (p.loop == Loop::Adam) {
    if (!adam) adam.emplace(inst.params, torch::optim::AdamOptions(kLearningRate));
    adam->step();
  } else {
    torch::NoGradGuard no_grad;
    for (const at::Tensor& q : inst.params) {
      if (q.grad().defined()) q.sub_(kLearningRate * q.grad());
    }
  }
  for (const at::Tensor& t : inst.targets) {
    if (!t.grad().defined()) continue;
    if (p.loop == Loop::ZeroedGrad) {
      t.mutable_grad().zero_();
    } else {
      t.mutable_grad() = at::Tensor();
    }
  }
}

RunResult run(const Program& p, bool checkpointed) {
  RunResult result;
  Instance inst(p);
  result.target_names = inst.target_names;
  Runner runner(p, inst, checkpointed);
  std::optional<torch::optim::Adam> adam;
  for (int it = 0; it < kIterations; ++it) {
    try {
      // Identical in both runs, so random ops draw the same numbers.
      torch::manual_seed(p.seed + it);
      drift_calls.clear();
      Snapshot snap;
      if (p.loop != Program::Loop::Grad) {
        train_step(p, inst, runner, adam, snap);
        result.iterations.push_back(std::move(snap));
        continue;
      }
      {
        at::Tensor loss = runner.forward();
        snap.loss = loss.detach().clone();
        backward(p, inst, loss, snap);
      }
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < inst.targets.size(); ++i) {
        const auto& t = inst.targets[i];
        const bool is_param =
            std::find_if(inst.params.begin(), inst.params.end(),
                         [&](const at::Tensor& q) { return q.is_same(t); }) != inst.params.end();
        if (is_param && snap.grads[i].defined()) t.sub_(kLearningRate * snap.grads[i]);
      }
      result.iterations.push_back(std::move(snap));
    } catch (const c10::Error& e) {
      result.threw = true;
      result.error = e.what_without_backtrace();
    } catch (const std::exception& e) {
      result.threw = true;
      result.error_type = RunResult::Std;
      result.error = std::string("std::exception (") + typeid(e).name() + "): " + e.what();
    } catch (...) {
      result.threw = true;
      result.error_type = RunResult::Unknown;
      result.error = "unknown exception (not a std::exception)";
    }
    if (result.threw) {
      result.error_iteration = it;
      break;
    }
  }
  return result;
}

// Bit-for-bit: NaNs compare equal to the same NaN, -0 differs from +0.
bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  return torch::equal(a.contiguous().reshape({-1}).view(torch::kByte),
                      b.contiguous().reshape({-1}).view(torch::kByte));
}

std::string diff_str(const at::Tensor& expected, const at::Tensor& actual) {
  std::ostringstream o;
  if (expected.scalar_type() != actual.scalar_type() || expected.sizes() != actual.sizes()) {
    o << "expected " << expected.scalar_type() << expected.sizes() << ", got "
      << actual.scalar_type() << actual.sizes();
    return o.str();
  }
  auto e = expected.to(torch::kFloat64), g = actual.to(torch::kFloat64);
  auto differ = (e != g) & ~(e.isnan() & g.isnan());
  o << differ.sum().item<int64_t>() << " of " << e.numel()
    << " elements differ, max abs difference "
    << (e - g).abs().nan_to_num(INFINITY).max().item<double>();
  return o.str();
}

// The first difference between two iterations' results, if any.
std::optional<std::string> compare(const Snapshot& expected, const Snapshot& actual,
                                   const std::vector<std::string>& names) {
  if (!bit_equal(expected.loss, actual.loss))
    return "loss: " + diff_str(expected.loss, actual.loss);
  // A second-order pass takes the buffer's gradient last, past the targets.
  const auto name = [&](size_t i) { return i < names.size() ? names[i] : std::string("buf"); };
  for (int pass = 0; pass < 2; ++pass) {
    const auto& e = pass ? expected.second_grads : expected.grads;
    const auto& a = pass ? actual.second_grads : actual.grads;
    const std::string which = pass ? " (second backward)" : "";
    if (e.size() != a.size()) return "number of gradients" + which + " differs";
    for (size_t i = 0; i < e.size(); ++i) {
      if (e[i].defined() != a[i].defined()) {
        return "grad of " + name(i) + which + ": " + (e[i].defined() ? "undefined" : "defined") +
               " where the reference's is not";
      }
      if (e[i].defined() && !bit_equal(e[i], a[i])) {
        return "grad of " + name(i) + which + ": " + diff_str(e[i], a[i]);
      }
    }
  }
  return std::nullopt;
}

struct CaseOutcome {
  enum Kind { Pass, Expected, Invalid, Fail } kind = Pass;
  std::string category;  // expected: the table's category; invalid: the reason; fail: the kind
  std::vector<std::string> detail;
};

const char* kind_name(CaseOutcome::Kind kind) {
  switch (kind) {
    case CaseOutcome::Pass: return "pass";
    case CaseOutcome::Expected: return "expected";
    case CaseOutcome::Invalid: return "invalid";
    case CaseOutcome::Fail: return "fail";
  }
  return "?";
}

std::string mechanism_name() {
  const char* env = std::getenv("SAC_DISPATCH");
  return env ? env : "auto";
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string one_line(std::string s, size_t max) {
  s = s.substr(0, s.find('\n'));
  for (char& c : s) {
    if (c == '\r' || c == '\t') c = ' ';
  }
  return s.size() > max ? s.substr(0, max) + "..." : s;
}

CaseOutcome run_case(uint64_t seed) {
  CaseOutcome out;
  const Program program = generate(seed);
  const RunResult reference = run(program, /*checkpointed=*/false);
  if (reference.threw) {
    out.kind = CaseOutcome::Invalid;
    out.category = one_line(reference.error, 100);
    return out;
  }
  const RunResult actual = run(program, /*checkpointed=*/true);
  auto fail = [&](const std::string& kind, const std::string& what) {
    out.kind = CaseOutcome::Fail;
    out.category = kind;
    out.detail.push_back("FAILURE seed=" + std::to_string(seed) + " mechanism=" + mechanism_name() +
                         " kind=" + kind);
    for (const auto& line : split_lines(first_lines(what, 40))) out.detail.push_back("  " + line);
    out.detail.push_back("  features: " + features(program));
    out.detail.push_back("  replay: " + replay_env() + " sac_fuzz --replay " +
                         std::to_string(seed));
    for (const auto& line : split_lines(program.listing())) out.detail.push_back("  | " + line);
  };
  for (size_t it = 0; it < actual.iterations.size(); ++it) {
    if (auto diff = compare(reference.iterations[it], actual.iterations[it], actual.target_names)) {
      fail("mismatch", "iteration " + std::to_string(it) + ": " + *diff);
      return out;
    }
  }
  if (actual.threw) {
    const std::string where = "iteration " + std::to_string(actual.error_iteration) + ": ";
    if (actual.error_type != RunResult::C10) {
      fail("non-c10-exception", where + actual.error);
      return out;
    }
    std::string matched;
    for (const auto& allowed : kAllowedErrors) {
      if (actual.error.find(allowed.substring) == std::string::npos) continue;
      if (allowed.applies && !allowed.applies(program)) {
        matched = allowed.category;
        continue;
      }
      out.kind = CaseOutcome::Expected;
      out.category = allowed.category;
      return out;
    }
    fail("unexpected-error",
         where + actual.error +
             (matched.empty() ? std::string()
                              : "\n(the message of expected limit '" + matched +
                                    "', but this program does not do what that limit is about)"));
    return out;
  }
  out.category = shapes_of_interest(program);
  return out;
}

class QuietWarnings : public c10::WarningHandler {
 public:
  explicit QuietWarnings(bool verbose) : verbose_(verbose) {}
  void process(const c10::Warning& warning) override {
    if (verbose_) std::cerr << "warning: " << warning.msg() << "\n";
  }

 private:
  bool verbose_;
};

void prepare_case_process(bool verbose) {
  at::set_num_threads(1);  // deterministic reductions; the machine is small
  static QuietWarnings warnings(verbose);
  c10::WarningUtils::set_warning_handler(&warnings);
  (void)save_op_names();
}

std::vector<uint64_t> parse_seeds(const std::string& csv) {
  std::vector<uint64_t> seeds;
  std::stringstream in(csv);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) seeds.push_back(std::stoull(item));
  }
  return seeds;
}

// Child: one result line per case, flushed, so the parent knows which case
// was running when a crash came.
int child_main(const std::vector<uint64_t>& seeds, bool verbose) {
  try {
    prepare_case_process(verbose);
    const std::string mechanism(sac::dispatch::to_string(sac::dispatch::mechanism()));
    std::cout << "@@M " << mechanism << std::endl;
  } catch (const std::exception& e) {
    // A bad SAC_DISPATCH, say: every case would fail the same way.
    std::cout << "@@FATAL " << one_line(e.what(), 300) << std::endl;
    return 3;
  }
  // Checks of the harness itself: a case that crashes or hangs on purpose.
  const char* crash_seed = std::getenv("SAC_FUZZ_TEST_CRASH_SEED");
  const char* hang_seed = std::getenv("SAC_FUZZ_TEST_HANG_SEED");
  // ... or crashes only after other cases ran in the same process.
  const char* sequence_crash_seed = std::getenv("SAC_FUZZ_TEST_SEQUENCE_CRASH_SEED");
  for (uint64_t seed : seeds) {
    if (crash_seed && std::stoull(crash_seed) == seed) std::abort();
    if (sequence_crash_seed && std::stoull(sequence_crash_seed) == seed && seed != seeds.front())
      std::abort();
    if (hang_seed && std::stoull(hang_seed) == seed) pause();
    const CaseOutcome outcome = run_case(seed);
    for (const auto& line : outcome.detail) std::cout << "@@D " << line << "\n";
    std::cout << "@@R " << seed << " " << kind_name(outcome.kind) << " " << outcome.category
              << std::endl;
  }
  return 0;
}

int replay_main(const std::vector<uint64_t>& seeds, bool verbose) {
  prepare_case_process(verbose);
  std::cout << "mechanism: " << sac::dispatch::to_string(sac::dispatch::mechanism()) << "\n";
  int passed = 0, failed = 0;
  for (uint64_t seed : seeds) {
    std::cout << generate(seed).listing() << "\n";
    const CaseOutcome outcome = run_case(seed);
    for (const auto& line : outcome.detail) {
      if (line.rfind("  | ", 0) != 0) std::cout << line << "\n";  // the listing is above
    }
    std::cout << "seed " << seed << ": " << kind_name(outcome.kind)
              << (outcome.category.empty() ? "" : " (" + outcome.category + ")") << "\n\n";
    passed += outcome.kind == CaseOutcome::Pass;
    failed += outcome.kind == CaseOutcome::Fail;
  }
  std::cout << passed << " passed, " << failed << " failed" << std::endl;
  return failed ? 1 : 0;
}

}  // namespace
