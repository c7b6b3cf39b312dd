// A fuzz program: its ops, values, steps, regions, policies and modules;
// its listing; and what it does (for the expected limits and the tallies).
#pragma once

#include "common.h"

namespace {

// ---- Programs -------------------------------------------------------------

enum class Op {
  // elementwise
  Add,
  Sub,
  Mul,
  DivConst,
  Sin,
  Exp,
  Tanh,
  Sigmoid,
  Relu,
  Gelu,
  Pow2,
  // reductions
  SumDim,
  MeanAll,
  MaxDim,
  Softmax,
  LogSoftmax,
  LayerNormF,
  // matmuls
  Mm,
  MmT,
  Matmul3,
  Bmm,
  Addmm,
  // views
  View,
  Reshape,
  TransposeMix,
  Narrow,
  Chunk,
  SelectUnsqueeze,
  Expand,
  // in-place
  FreshInplace,
  PoolInplace,
  // multi-output, random, index, cast
  Sort,
  Dropout,
  RandLikeMul,
  Argmax,
  IndexSelect,
  GatherFixed,
  GatherIdx,
  Cast64,
  // attention, modules, non-tensor values, inner backward, buffer
  Sdpa,
  LinearModule,
  LayerNormModule,
  BatchNormModule,
  ItemScale,
  InnerGrad,
  BufferMutate,
  BufferOverwrite,
  // a custom autograd Function whose backward differentiates a checkpointed
  // graph it built in its forward
  FunctionGrad,
  // data from the host, views of one memory read together
  HostConst,
  HostIndex,
  OverlapMul,
  // an op with state of its own
  Drift,
};

// Name and, for compound steps, what the step computes (a, b, c: its inputs).
std::pair<const char*, const char*> op_name(Op op) {
  switch (op) {
    case Op::Add: return {"add", ""};
    case Op::Sub: return {"sub", ""};
    case Op::Mul: return {"mul", ""};
    case Op::DivConst: return {"div", ""};
    case Op::Sin: return {"sin", ""};
    case Op::Exp: return {"exp_clamped", "exp(a.clamp(-3, 3))"};
    case Op::Tanh: return {"tanh", ""};
    case Op::Sigmoid: return {"sigmoid", ""};
    case Op::Relu: return {"relu", ""};
    case Op::Gelu: return {"gelu", ""};
    case Op::Pow2: return {"pow2", "a.pow(2)"};
    case Op::SumDim: return {"sum", ""};
    case Op::MeanAll: return {"mean", ""};
    case Op::MaxDim: return {"max", "a.max(-1, keepdim=true): values, indices"};
    case Op::Softmax: return {"softmax", ""};
    case Op::LogSoftmax: return {"log_softmax", ""};
    case Op::LayerNormF: return {"layer_norm", "layer_norm(a, {W}, weight=b, bias=c)"};
    case Op::Mm: return {"mm", ""};
    case Op::MmT: return {"mm_abt_c", "(a.mm(b.t()) / R).mm(c)"};
    case Op::Matmul3: return {"matmul", ""};
    case Op::Bmm:
      return {"bmm_attention", "bmm(softmax(bmm(a, b.transpose(1,2)) / sqrt(W), -1), c)"};
    case Op::Addmm: return {"addmm", ""};
    case Op::View: return {"view", ""};
    case Op::Reshape: return {"reshape", ""};
    case Op::TransposeMix:
      return {"transpose_copy", "a.transpose(0,1).clone(contiguous).transpose(0,1)"};
    case Op::Narrow: return {"narrow", "a.narrow(-1, start, length)"};
    case Op::Chunk: return {"chunk", "a.chunk(2, -1): two views of one base"};
    case Op::SelectUnsqueeze: return {"select_unsqueeze", "a.select(0, index).unsqueeze(0)"};
    case Op::Expand: return {"expand", ""};
    case Op::FreshInplace: return {"fresh_inplace", ""};
    case Op::PoolInplace: return {"inplace", ""};
    case Op::Sort: return {"sort", "sort(a, -1): values, indices"};
    case Op::Dropout: return {"dropout", "dropout(a, p, train=true)"};
    case Op::RandLikeMul: return {"rand_like_mul", "rand_like(a) * a"};
    case Op::Argmax: return {"argmax", "a.argmax(1)"};
    case Op::IndexSelect: return {"index_select", "a.index_select(0, b)"};
    case Op::GatherFixed: return {"gather_fixed", "gather(a, -1, index made at generation)"};
    case Op::GatherIdx: return {"gather", "gather(a, -1, b)"};
    case Op::Cast64: return {"cast64", ""};
    case Op::Sdpa:
      return {"sdpa", "q, k, v = a.matmul(b).split(W, -1); scaled_dot_product_attention"};
    case Op::LinearModule: return {"Linear", ""};
    case Op::LayerNormModule: return {"LayerNorm", ""};
    case Op::BatchNormModule:
      return {"BatchNorm", "BatchNorm1d in training: running statistics updated"};
    case Op::FunctionGrad:
      return {"function_grad",
              "Function(a, b): forward under grad on detached a, b: y = checkpoint(outer, "
              "checkpoint(inner, f, a, b) * b + sin(a)), f = tanh(a * b) @ b^T @ a / W; "
              "backward: autograd::grad(y, {a, b}, g). ints: outer values check, inner saves "
              "mm/bmm, saved by save_for_backward, f checkpointed twice deep"};
    case Op::ItemScale: return {"item_scale", "a * tanh(b.mean().item<double>())"};
    case Op::InnerGrad:
      return {"inner_grad", "autograd::grad(sum(sin(a) * b), a, create_graph=true)"};
    case Op::BufferMutate: return {"buffer_inplace", ""};
    case Op::BufferOverwrite:
      return {"buffer_overwrite", "buf written (whole, or a row of it), then a * buf.mean()"};
    case Op::HostConst: return {"host_const", "a * c, c made from host data in the step"};
    case Op::Drift: return {"drift", "a * drift(a): a custom op whose scale grows with each call"};
    case Op::HostIndex:
      return {"host_index", "a.index_select(0, torch::tensor(std::vector<int64_t>{...}))"};
    case Op::OverlapMul: return {"overlap_mul", "a.narrow(-1, start, n) * b, b a narrow view of a"};
  }
  return {"?", ""};
}

enum class Leaf { None, Input, Param, Buffer };

// One SSA value of the program. Shapes are static: the generator keeps every
// step well-formed, so a reference run that throws is a generator slip or an
// autograd rule (in-place on a saved tensor), counted as invalid.
struct Value {
  std::string name;
  bool is_index = false;  // int64 indices, every entry < bound
  int64_t bound = 0;
  std::vector<int64_t> shape;
  bool requires_grad = false;
  Leaf leaf = Leaf::None;
  bool contiguous = true;
  // Aliases a leaf: an in-place op on it would be an error (leaf requiring
  // grad) or a hidden buffer mutation.
  bool aliases_leaf = false;
  bool no_inplace = false;  // expanded (stride 0) views
  bool dead = false;        // modified in place: later steps use the new id
  int def = -1;             // defining step; -1 for leaves
  int storage = -1;         // the value whose storage this one uses (views, in-place results)
  int uses = 0;
  double init_scale = 1.0, init_offset = 0.0;  // leaves
};

struct Step {
  Op op;
  std::vector<int> in, out;
  std::vector<int64_t> ints;
  std::vector<double> reals;
  int module = -1;
};

struct ModuleSpec {
  bool layer_norm = false;  // else Linear(W, W), or:
  bool batch_norm = false;  // BatchNorm1d(W), in training
  bool bias = true;
};

struct PolicySpec {
  enum Kind { None, SaveOps, SaveAll, HashName, BoolHash, EveryOther } kind = None;
  std::vector<std::string> names;
  uint64_t salt = 0;
  // Regions with the same key share one Policy object in a run (a stateful
  // callback keeps counting across them).
  int key = -1;
  // Build a new Policy object at every call instead of once per run.
  bool fresh = false;
  // any_of({policy, shape_deciding_ops()}): sort and argmax kept, whatever
  // the policy says.
  bool keep_shape_deciding = false;
  bool stateless() const { return kind != EveryOther; }
};

struct Region {
  int begin = 0, end = 0;  // steps [begin, end)
  int parent = -1;
  PolicySpec policy;
  bool via_context_fn = false;
  bool offload = false;  // saved answers offloaded to a host copy target
  // Names (every value is tagged "v0".."v3", see Runner::step): 0 none;
  // 1 any_of(policy, save v0 and v2); 2 except(policy, save v1);
  // 3 any_of(policy, save v3 and offload v0).
  int names = 0;
  bool early_stop = true;
  bool no_determinism_check = false;
  bool value_check = false;  // DeterminismCheck::Values
  bool debug = false;
  int arg_style = 0;  // 0: vector; 1: Tensor + vector; 2: optional<Tensor> + vector
  bool capture_leaves = false;
  std::vector<int> ins, outs;
};

struct Program {
  uint64_t seed = 0;
  int64_t B = 0, T = 0, W = 0, H = 1, R = 0;
  std::vector<Value> values;
  std::vector<Step> steps;
  std::vector<Region> regions;  // a parent before its children
  std::vector<ModuleSpec> modules;
  std::vector<int> loss;  // value ids summed into the loss
  // How the loss is backwarded: once; twice, the first retaining the graph;
  // then again for a second loss (the loss squared); or twice in order
  // (first-order gradients with create_graph, then the gradient of the sum
  // of their squares, with respect to the buffer too where it has a graph).
  enum class Backward { Once, Twice, SecondLoss, SecondOrder } backward = Backward::Once;
  // The training loop around a single backward: gradients taken by
  // torch::autograd::grad and a step by hand; or left in .grad by
  // backward() and zeroed after the step (to None, or to zeros); or
  // accumulated over two micro-batches first; or stepped by Adam, whose
  // state the first step makes.
  enum class Loop { Grad, LeftInGrad, ZeroedGrad, Accumulate, Adam } loop = Loop::Grad;
  int buffer = -1;
  // The checkpointed run's forward inside a sac::OffloadGuard: 0 none; its
  // target takes 1 every tensor, 2 every tensor but the parameters (keep),
  // 3 nothing (min_bytes).
  int offload_guard = 0;
  std::map<std::pair<int, int>, int> region_at;  // (parent, begin) -> region

  std::string describe(const Step& s) const;
  std::string describe(const Region& r, int index) const;
  std::string listing() const;
};

std::string join_values(const Program& p, const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    s += (i ? "," : "") + p.values[ids[i]].name;
  }
  return s;
}

std::string Program::describe(const Step& s) const {
  std::ostringstream o;
  if (!s.out.empty()) {
    o << join_values(*this, s.out) << " = ";
  }
  o << op_name(s.op).first << "(" << join_values(*this, s.in);
  if (s.module >= 0) {
    o << (s.in.empty() ? "" : ", ") << "m" << s.module;
  }
  o << ")";
  auto flag = [&](const char* n, int64_t v) { o << " " << n << "=" << v; };
  switch (s.op) {
    case Op::DivConst: o << " c=" << s.reals[0]; break;
    case Op::Gelu: o << (s.ints[0] ? " approximate=tanh" : ""); break;
    case Op::SumDim:
      flag("dim", s.ints[0]);
      flag("keepdim", s.ints[1]);
      break;
    case Op::Softmax:
    case Op::LogSoftmax: flag("dim", s.ints[0]); break;
    case Op::View:
    case Op::Reshape:
    case Op::Expand:
      o << " to " << shape_str(s.ints) << (s.reals.empty() ? "" : " .contiguous()");
      break;
    case Op::Narrow:
      flag("start", s.ints[0]);
      flag("length", s.ints[1]);
      break;
    case Op::SelectUnsqueeze: flag("index", s.ints[0]); break;
    case Op::FreshInplace: {
      const char* v[] = {"h=a*2; h.add_(b)",
                         "h=a*2; h.mul_(0.5)",
                         "h=a+1; h.relu_()",
                         "h=a*1.5; h.narrow(-1,0,n).mul_(2)",
                         "h=a.clone(); h.sigmoid_()",
                         "h=a*2; h.select(0,0).relu_()",
                         "h=a*2; h.narrow(-1,0,n).sigmoid_()",
                         "h=a*0.5; h.select(0,0).exp_()",
                         "h=a*2; h.narrow(-1,0,n).tanh_()",
                         "h=a*empty_like(a).bernoulli_(0.5)",
                         "h=a*empty_like(a).uniform_()",
                         "h=a*empty_like(a).normal_()",
                         "h=a*empty_like(a).exponential_()",
                         "try {h=a.sin()*2} catch (std::exception&) {h=a.add(1).sin()}"};
      o << " [" << v[s.ints[0]] << "]";
      break;
    }
    case Op::PoolInplace: {
      const char* v[] = {"a.add_(b)", "a.mul_(0.5)", "a.relu_()", "a.narrow(-1,0,n).mul_(2)",
                         "a.tanh_()"};
      o << " [" << v[s.ints[0]] << "]";
      break;
    }
    case Op::Sort: flag("descending", s.ints[0]); break;
    case Op::Dropout: o << " p=" << s.reals[0]; break;
    case Op::Cast64:
      o << (s.ints[0] ? " [(a64*1.5+tanh(b64)).f32]" : " [(sin(a64)*b64).f32]");
      break;
    case Op::Sdpa:
      o << (s.ints[0] ? " 4-D heads=" + std::to_string(H) : std::string(" 3-D"))
        << (s.ints[1] ? " causal" : "") << (s.ints[2] ? " mask" : "")
        << " dropout_p=" << s.reals[0];
      break;
    case Op::BufferMutate: o << (s.ints[0] ? " [buf.mul_(0.9)]" : " [buf.add_(0.25)]"); break;
    case Op::BufferOverwrite: {
      const char* v[] = {"buf.copy_(a.detach().mean())", "buf.view(-1).copy_(a.detach().mean())",
                         "at::mul_out(buf, c, c), c = a.detach().mean()",
                         "buf.copy_(a.mean()) (with grad)",
                         "buf.select(0, 0).copy_(a.detach().mean()) (in part)"};
      o << " [" << v[s.ints[0]] << "]";
      break;
    }
    case Op::FunctionGrad:
      o << " [outer" << (s.ints[0] ? " values" : "") << ", inner"
        << (s.ints[1] ? " saves mm/bmm" : "") << (s.ints[3] ? ", f checkpointed again" : "")
        << (s.ints[2] ? ", save_for_backward]" : ", saved_data]");
      break;
    case Op::HostConst: {
      const char* v[] = {"c = torch::tensor(data)", "c = torch::tensor(data).mul_(0.5)",
                         "c = torch::from_blob(host memory the run owns)",
                         "c = torch::tensor(data); a = a + c; c[0] += 1 (host)",
                         "c = torch::empty(n); c[:half].fill_(0.25) (op); c[half:] = data (host)"};
      o << " [" << v[s.ints[0]] << "] data=";
      for (size_t i = 0; i < s.reals.size(); ++i) o << (i ? "," : "[") << s.reals[i];
      o << "]";
      break;
    }
    case Op::HostIndex: o << " index=" << shape_str(s.ints); break;
    case Op::OverlapMul: flag("start", s.ints[0]); break;
    default: break;
  }
  if (!s.out.empty()) {
    const Value& v = values[s.out[0]];
    o << "  " << (v.is_index ? "long" : "") << shape_str(v.shape)
      << (v.requires_grad ? "" : " no_grad");
  }
  if (*op_name(s.op).second) o << "  # " << op_name(s.op).second;
  return o.str();
}

std::string policy_str(const PolicySpec& p) {
  std::ostringstream o;
  switch (p.kind) {
    case PolicySpec::None: return "none (full recompute)";
    case PolicySpec::SaveOps: {
      o << "save_ops(";
      for (size_t i = 0; i < p.names.size(); ++i) o << (i ? "," : "") << p.names[i];
      o << ")";
      break;
    }
    case PolicySpec::SaveAll: o << "from_fn(save everything)"; break;
    case PolicySpec::HashName: o << "from_fn(hash of op name, salt " << p.salt << ")"; break;
    case PolicySpec::BoolHash: o << "from_fn(bool: hash of op name, salt " << p.salt << ")"; break;
    case PolicySpec::EveryOther: o << "from_fn(stateful: every other call)"; break;
  }
  o << (p.keep_shape_deciding ? " +shape_deciding_ops" : "") << " object=" << p.key
    << (p.fresh ? " fresh-per-call" : "");
  return o.str();
}

std::string Program::describe(const Region& r, int index) const {
  std::ostringstream o;
  const char* styles[] = {"vector", "Tensor+vector", "optional+vector"};
  o << "region r" << index << " [s" << r.begin << ",s" << r.end
    << ") policy=" << policy_str(r.policy);
  if (r.policy.kind != PolicySpec::None) {
    o << (r.via_context_fn ? " via=context_fn" : " via=.policy()")
      << (r.offload ? " offload_if" : "");
    const char* names[] = {"", " names=any_of(v0,v2)", " names=except(v1)",
                           " names=any_of(save v3, offload v0)"};
    o << names[r.names];
  }
  o << (r.early_stop ? "" : " early_stop=false")
    << (r.no_determinism_check ? " determinism_check=None" : "")
    << (r.value_check ? " determinism_check=Values" : "") << (r.debug ? " debug" : "")
    << " args=" << styles[r.arg_style] << (r.capture_leaves ? " leaves=captured" : " leaves=args")
    << " in(" << join_values(*this, r.ins) << ") out(" << join_values(*this, r.outs) << ")";
  return o.str();
}

std::string Program::listing() const {
  std::ostringstream o;
  const char* guards[] = {"", " OffloadGuard(takes all)", " OffloadGuard(keeps params)",
                          " OffloadGuard(takes nothing)"};
  const char* backward_names[] = {"", " second_backward(retain_graph)",
                                  " second_loss(retain_graph)", " second_order(create_graph)"};
  const char* loop_names[] = {"", " loop(backward(), grads set to none)",
                              " loop(backward(), grads zeroed)",
                              " loop(two micro-batches accumulated)", " loop(Adam)"};
  o << "program " << seed << ": B=" << B << " T=" << T << " W=" << W << " H=" << H << " R=" << R
    << backward_names[static_cast<int>(backward)] << loop_names[static_cast<int>(loop)]
    << guards[offload_guard] << "\n";
  o << "leaves:";
  for (const auto& v : values) {
    if (v.leaf == Leaf::None) continue;
    o << " " << v.name << shape_str(v.shape)
      << (v.leaf == Leaf::Input   ? "input"
          : v.leaf == Leaf::Param ? "param"
                                  : "buffer");
  }
  o << "\n";
  for (size_t m = 0; m < modules.size(); ++m) {
    o << "module m" << m << ": "
      << (modules[m].layer_norm   ? "LayerNorm(" + std::to_string(W) + ")"
          : modules[m].batch_norm ? "BatchNorm1d(" + std::to_string(W) + ")"
                                  : "Linear(" + std::to_string(W) + "," + std::to_string(W) +
                                        (modules[m].bias ? ")" : ", bias=false)"))
      << "\n";
  }
  std::vector<int> open;  // region stack
  for (size_t i = 0; i < steps.size(); ++i) {
    for (size_t r = 0; r < regions.size(); ++r) {
      if (regions[r].begin == static_cast<int>(i)) {
        o << std::string(2 + 2 * open.size(), ' ') << describe(regions[r], r) << " {\n";
        open.push_back(r);
      }
    }
    o << std::string(2 + 2 * open.size(), ' ') << "s" << i << ": " << describe(steps[i]) << "\n";
    while (!open.empty() && regions[open.back()].end == static_cast<int>(i) + 1) {
      open.pop_back();
      o << std::string(2 + 2 * open.size(), ' ') << "}\n";
    }
  }
  o << "loss =";
  for (size_t k = 0; k < loss.size(); ++k) {
    o << (k ? " +" : "") << " sum(" << values[loss[k]].name << ")*" << (k + 1);
  }
  return o.str();
}

// ---- What a program does, for the expected limits' `applies` --------------

std::set<int> storages_made_in(const Program& p, const Region& r) {
  std::set<int> out;
  for (const auto& v : p.values) {
    if (v.def >= r.begin && v.def < r.end) out.insert(v.storage);
  }
  return out;
}

// Storages the region reads but did not make, each with the first step
// whose modification of it comes after the region read it (a write of the
// region's own later on included). A buffer the region writes whole before
// reading it (BufferOverwrite) holds what the region wrote: its reads from
// then on are of the region's own values (Note [Overwritten before read]).
// Written in part (a row), the rest is read from outside, after the write.
std::map<int, int> storages_read_by(const Program& p, const Region& r) {
  std::map<int, int> out;
  std::set<int> overwritten;
  const auto read = [&](int storage, int modified_from) {
    if (!overwritten.count(storage) && !out.count(storage)) out[storage] = modified_from;
  };
  for (int i = r.begin; i < r.end; ++i) {
    const Step& s = p.steps[i];
    // A BufferOverwrite reads its other inputs before it writes the buffer.
    for (size_t k = s.op == Op::BufferOverwrite ? 1 : 0; k < s.in.size(); ++k) {
      const Value& v = p.values[s.in[k]];
      if (v.def < r.begin) read(v.storage, i);
    }
    if (s.op == Op::BufferOverwrite) {
      const Value& buffer = p.values[s.in[0]];
      if (buffer.def >= r.begin) continue;
      if (s.ints[0] != 4 && !out.count(buffer.storage)) overwritten.insert(buffer.storage);
      else read(buffer.storage, i + 1);
    }
  }
  return out;
}

// Storages modified in place by the steps from `first` on.
std::set<int> storages_modified_from(const Program& p, int first) {
  std::set<int> out;
  for (size_t i = first; i < p.steps.size(); ++i) {
    const Step& s = p.steps[i];
    if (s.op == Op::PoolInplace || s.op == Op::BufferMutate || s.op == Op::BufferOverwrite) {
      out.insert(p.values[s.in[0]].storage);
    }
  }
  return out;
}

bool intersects(const std::set<int>& a, const std::set<int>& b) {
  for (int x : a) {
    if (b.count(x)) return true;
  }
  return false;
}

bool modifies_region_output_later(const Program& p) {
  for (const auto& r : p.regions) {
    if (intersects(storages_made_in(p, r), storages_modified_from(p, r.end))) return true;
  }
  return false;
}

bool modifies_region_read_later(const Program& p) {
  for (const auto& r : p.regions) {
    for (const auto& [storage, from] : storages_read_by(p, r)) {
      if (storages_modified_from(p, from).count(storage)) return true;
    }
  }
  return false;
}

bool retains_graph(const Program& p) { return p.backward != Program::Backward::Once; }

bool under_offload_guard(const Program& p) { return p.offload_guard != 0; }

bool drifts_in_region(const Program& p) {
  for (const auto& r : p.regions) {
    for (int i = r.begin; i < r.end; ++i) {
      if (p.steps[i].op == Op::Drift) return true;
    }
  }
  return false;
}

bool has_inner_grad(const Program& p) {
  for (const auto& s : p.steps) {
    // FunctionGrad's backward runs one: a selective region that saved its
    // arguments is then backwarded a second time.
    if (s.op == Op::InnerGrad || s.op == Op::FunctionGrad) return true;
  }
  return false;
}

// The shapes of program issues asked the fuzzer for, tallied over passed
// cases: a custom Function whose backward differentiates its nested
// checkpoints; BatchNorm in training and a backward inside the forward of
// one region under the value check (issue 35); a buffer written whole inside
// a region (issue 36: FSDP's gathered parameters; issue 44: in function
// regions too); issue 44's in-place op on a view that saves its output
// before a double backward (an inner grad after the region), random ops
// drawing in place under the value check, a catch of std::exception. Issue
// 58's: a buffer written (whole, by an out= op, or in part) in a region
// nested at depth 2 or 3, a second loss or a second-order gradient through
// regions, views of one chunk taken by a region.
std::string shapes_of_interest(const Program& p) {
  bool function_grad = false, batch_norm_values = false, overwritten = false;
  bool view_double = false, random_values = false, caught = false;
  bool inner_grad_after = false, chunk_in = false;
  int written_depth = 0;
  for (const auto& s : p.steps) function_grad |= s.op == Op::FunctionGrad;
  for (const auto& r : p.regions) {
    bool norm = false, grad = false;
    int depth = 1;
    for (int parent = r.parent; parent >= 0; parent = p.regions[parent].parent) ++depth;
    for (int id : r.ins) {
      const int def = p.values[id].def;
      chunk_in |= def >= 0 && p.steps[def].op == Op::Chunk;
    }
    for (int i = r.begin; i < r.end; ++i) {
      norm |= p.steps[i].op == Op::BatchNormModule;
      grad |= p.steps[i].op == Op::InnerGrad;
      overwritten |= p.steps[i].op == Op::BufferOverwrite;
      if (p.steps[i].op == Op::BufferOverwrite) written_depth = std::max(written_depth, depth);
      const Step& s = p.steps[i];
      const int v = s.op == Op::FreshInplace ? s.ints[0] : -1;
      inner_grad_after = false;
      for (size_t j = r.end; j < p.steps.size(); ++j)
        inner_grad_after |= p.steps[j].op == Op::InnerGrad;
      view_double |= v >= 5 && v <= 8 && (inner_grad_after || retains_graph(p));
      random_values |= v >= 9 && v <= 12 && r.value_check;
      caught |= v == 13;
    }
    batch_norm_values |= r.value_check && norm && grad;
  }
  std::string out = function_grad ? "function-grad" : "";
  const auto add = [&](const char* shape) { out += std::string(out.empty() ? "" : ",") + shape; };
  if (batch_norm_values) add("batchnorm+values+inner-grad");
  if (overwritten) add("buffer-overwritten-in-region");
  if (view_double) add("view-inplace-then-grad");
  if (random_values) add("random-inplace+values");
  if (caught) add("catch-in-region");
  if (written_depth >= 2)
    add(written_depth == 2 ? "buffer-written-at-depth-2" : "buffer-written-at-depth-3");
  if (!p.regions.empty() && p.backward == Program::Backward::SecondLoss) add("second-loss");
  if (!p.regions.empty() && p.backward == Program::Backward::SecondOrder) add("second-order");
  if (chunk_in) add("chunk-into-region");
  if (!p.regions.empty() && p.loop == Program::Loop::Accumulate) add("micro-batches");
  if (!p.regions.empty() && p.loop == Program::Loop::Adam) add("optimizer-state");
  if (!p.regions.empty() &&
      (p.loop == Program::Loop::LeftInGrad || p.loop == Program::Loop::ZeroedGrad)) {
    add("grads-left");
  }
  return out;
}

// Traits that tell failures apart, for grouping them.
std::string features(const Program& p) {
  std::set<std::string> f;
  auto inside = [&](int step) {
    for (const auto& r : p.regions) {
      if (step >= r.begin && step < r.end) return true;
    }
    return false;
  };
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const Step& s = p.steps[i];
    if (s.op == Op::InnerGrad) f.insert(inside(i) ? "grad-in-region" : "grad-outside-regions");
    if (s.op == Op::LinearModule && p.values[s.in[0]].shape.size() == 3 && inside(i))
      f.insert("linear-3d-in-region");
    if (s.op == Op::Dropout || s.op == Op::RandLikeMul || (s.op == Op::Sdpa && s.reals[0] > 0)) {
      f.insert(inside(i) ? "random-in-region" : "random-outside-regions");
    }
    if (s.op == Op::FreshInplace && inside(i)) {
      const int v = s.ints[0];
      if (v >= 5 && v <= 8) f.insert("view-inplace-in-region");
      if (v >= 9 && v <= 12) f.insert("random-inplace-in-region");
      if (v == 13) f.insert("catch-in-region");
    }
    if (s.op == Op::ItemScale && inside(i)) f.insert("item-in-region");
    if ((s.op == Op::HostConst || s.op == Op::HostIndex) && inside(i))
      f.insert("host-data-in-region");
    if (s.op == Op::OverlapMul) f.insert("overlapping-views");
    if (s.op == Op::Drift && inside(i)) f.insert("drift-in-region");
    if (s.op == Op::FunctionGrad) f.insert(inside(i) ? "function-grad-in-region" : "function-grad");
    if (s.op == Op::BatchNormModule && inside(i)) f.insert("batchnorm-in-region");
  }
  for (const auto& r : p.regions) {
    if (r.parent >= 0) f.insert("nested");
    if (!r.early_stop) f.insert("early_stop=false");
    if (r.value_check) f.insert("value-check");
    if (r.offload) f.insert("offload");
    if (r.names != 0) f.insert("names");
    if (r.via_context_fn) f.insert("context_fn");
    if (r.policy.kind == PolicySpec::EveryOther) f.insert("stateful-policy");
    if (r.policy.keep_shape_deciding) f.insert("shape-deciding-kept");
    if (r.policy.kind == PolicySpec::None) f.insert("full-recompute");
    else f.insert("selective");
    for (int i = r.begin; i < r.end; ++i) {
      const Step& s = p.steps[i];
      if (s.op == Op::PoolInplace && p.values[s.in[0]].def < r.begin)
        f.insert("inplace-on-region-input");
    }
  }
  for (size_t a = 0; a < p.regions.size(); ++a) {
    for (size_t b = a + 1; b < p.regions.size(); ++b) {
      if (p.regions[a].policy.kind != PolicySpec::None &&
          p.regions[a].policy.key == p.regions[b].policy.key && !p.regions[a].policy.fresh) {
        f.insert("shared-policy");
      }
    }
  }
  if (modifies_region_output_later(p)) f.insert("region-output-modified-later");
  if (modifies_region_read_later(p)) f.insert("region-read-modified-later");
  if (p.backward == Program::Backward::Twice) f.insert("retain_graph");
  if (p.backward == Program::Backward::SecondLoss) f.insert("second-loss");
  if (p.backward == Program::Backward::SecondOrder) f.insert("second-order");
  if (p.loop != Program::Loop::Grad) f.insert("training-loop");
  if (p.offload_guard != 0) f.insert("offload-guard");
  std::string out;
  for (const auto& x : f) out += (out.empty() ? "" : " ") + x;
  return out;
}

}  // namespace
