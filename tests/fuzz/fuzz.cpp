// sac_fuzz: a differential fuzzer for sac.
//
// Each case is a random program over aten ops (generated from a 64-bit seed),
// trained for a few iterations twice: once as plain autograd (the reference)
// and once with random contiguous step ranges wrapped in sac::checkpoint
// regions (nested, selective, with inner backward passes...). Every loss and
// gradient must be bit-identical on CPU; a difference, an unexpected
// exception or a crash is a failure.
//
//   sac_fuzz [--cases N] [--seed S] [--jobs J] [--replay SEED[,SEED...]] [--verbose]
//   env: SAC_DISPATCH (per_op | fallback | auto, inherited by the children),
//        SAC_FUZZ_REGIONS (checkpoint | guard | mixed: regions are
//        sac::checkpoint calls, sac::CheckpointRegion guards, or either, by
//        region; default checkpoint; guards need the fallback key),
//        SAC_FUZZ_CASES (overrides --cases), SAC_FUZZ_SECONDS (run until the
//        time is spent, for long runs), SAC_FUZZ_TIMEOUT (seconds without a
//        result before a child counts as hung; 120), SAC_FUZZ_SKIP (op
//        families not to generate, for triage; see skipped_families).
//   Checks of the harness itself: SAC_FUZZ_TEST_CRASH_SEED,
//   SAC_FUZZ_TEST_SEQUENCE_CRASH_SEED, SAC_FUZZ_TEST_HANG_SEED make a child
//   abort (always, or only after other cases) or hang at that case.
//
// Output: failures as they come (seed, kind, error or first differing
// tensor, a replay command, the program listing), then a summary; the last
// line is "N passed, M failed". Exit status 1 if any case failed.
//
// The parent never runs a case: a crash or a hang in sac must not take the
// tally with it. It re-executes itself (/proc/self/exe --child SEEDS) for
// chunks of cases and reads one result line per case; a chunk that dies is
// re-run one case per process to name the seed.
//
// --replay runs cases in this process with their program listing printed;
// several comma-separated seeds run in sequence in one process, which is how
// a crash that needs earlier cases (process state) is reproduced.

#include <sac/sac.h>
#include <sac/policy/presets.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

extern char** environ;

namespace {

// A custom op with state of its own, as a kernel that draws from its own
// generator: the scale of step `key` grows with each call of it in an
// iteration (reset by run()). A forward calls each step once, so the
// forward's values match the reference's; a recomputation's do not, which
// only DeterminismCheck::Values catches (the regions around it turn it on).
std::map<int64_t, int> drift_calls;
at::Tensor drift_kernel(const at::Tensor& x, int64_t key) {
  return at::full_like(x, 1.0 + 0.25 * drift_calls[key]++);
}
TORCH_LIBRARY(sac_fuzz, m) { m.def("drift(Tensor x, int key) -> Tensor"); }
TORCH_LIBRARY_IMPL(sac_fuzz, CPU, m) { m.impl("drift", drift_kernel); }

at::Tensor drift(const at::Tensor& x, int64_t key) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("sac_fuzz::drift", "")
                             .typed<at::Tensor(const at::Tensor&, int64_t)>();
  return op.call(x, key);
}

// Where the fuzzer's offload answers go: copies in memory of their own, as a
// host would hold them (a CPU tensor has nowhere else to go). Dense copies,
// a broadcast (stride 0) dimension copied once, back with the strides they
// left with, as host_memory() makes them. It takes every tensor: as
// host_memory() takes an accelerator's.
class HostCopies final : public sac::CopyTarget {
 public:
  bool accepts(const at::Tensor&) const override { return true; }
  at::Tensor copy_out(const at::Tensor& t) override {
    return sac::CopyTarget::without_broadcast(t)
        .clone(at::MemoryFormat::Contiguous)
        .expand(t.sizes());
  }
  at::Tensor copy_back(const at::Tensor& copy, const sac::CopyTarget::Origin& from) override {
    const at::Tensor source = sac::CopyTarget::without_broadcast(copy);
    at::Tensor back =
        at::empty_strided(source.sizes(), from.strides, source.options().device(from.device));
    return back.copy_(source).expand(copy.sizes());
  }
};

// The custom Function of Op::FunctionGrad: its forward re-enables grad, runs
// nested checkpoints on detached copies of its inputs, and keeps the graph;
// its backward differentiates that graph with autograd::grad. The reference
// runs the same without checkpoints. `variant`'s bits: 1 the outer
// checkpoint checks values, 2 the inner one saves mm and bmm, 4 the graph is
// kept by save_for_backward (packed by an enclosing region's hooks) instead
// of saved_data, 8 the inner function is checkpointed once more inside.
struct FunctionGrad : torch::autograd::Function<FunctionGrad> {
  static at::Tensor inner(const at::Tensor& a, const at::Tensor& b) {
    return at::tanh(a * b).matmul(b.transpose(-2, -1)).matmul(a) / b.size(-1);
  }
  // In one order: the order of the ops is the order autograd accumulates
  // gradients in (C++ leaves the order of `f * b + a.sin()`'s operands open).
  static at::Tensor outer(const at::Tensor& f, const at::Tensor& a, const at::Tensor& b) {
    const at::Tensor scaled = f * b;
    return scaled + a.sin();
  }

  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a,
                            const at::Tensor& b, int64_t variant, bool checkpointed) {
    at::AutoGradMode grad(true);
    const at::Tensor ad = a.detach().requires_grad_();
    const at::Tensor bd = b.detach().requires_grad_();
    at::Tensor y;
    if (!checkpointed) {
      y = outer(inner(ad, bd), ad, bd);
    } else {
      sac::CheckpointOptions around;
      if (variant & 1) around.determinism_check(sac::DeterminismCheck::Values);
      sac::CheckpointOptions inside;
      if (variant & 2) inside.policy(sac::Policy::save_ops({"aten::mm", "aten::bmm"}));
      const bool deeper = (variant & 8) != 0;
      y = sac::checkpoint(
          around,
          [inside, deeper](const at::Tensor& x, const at::Tensor& w) {
            const at::Tensor f = sac::checkpoint(
                inside,
                [deeper](const at::Tensor& u, const at::Tensor& v) {
                  return deeper ? sac::checkpoint(&FunctionGrad::inner, u, v) : inner(u, v);
                },
                x, w);
            return outer(f, x, w);
          },
          ad, bd);
    }
    if (variant & 4) {
      ctx->save_for_backward({y, ad, bd});
    } else {
      ctx->saved_data["y"] = y;
      ctx->saved_data["a"] = ad;
      ctx->saved_data["b"] = bd;
    }
    return y.detach();
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    at::Tensor y, a, b;
    if (ctx->saved_data.find("y") == ctx->saved_data.end()) {
      const auto saved = ctx->get_saved_variables();
      y = saved[0], a = saved[1], b = saved[2];
    } else {
      y = ctx->saved_data["y"].toTensor();
      a = ctx->saved_data["a"].toTensor();
      b = ctx->saved_data["b"].toTensor();
    }
    // retain_graph: a second backward of the loss runs this again.
    const auto g = torch::autograd::grad({y}, {a, b}, {grads[0]}, /*retain_graph=*/true);
    return {g[0], g[1], at::Tensor(), at::Tensor()};
  }
};

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

constexpr int kIterations = 3;
constexpr double kLearningRate = 0.01;
// A child that reports no result for this long is hung (SAC_FUZZ_TIMEOUT
// overrides it).
int child_timeout_s() {
  const char* env = std::getenv("SAC_FUZZ_TIMEOUT");
  return env ? std::atoi(env) : 120;
}
constexpr size_t kChunkSize = 100;
// Failures re-run alone to see whether they need earlier cases; beyond this
// many, a run full of failures would spend its time starting processes.
constexpr size_t kMaxRechecks = 50;

// Candidate op names for save_ops policies. Those save_ops rejects (composite,
// views, unknown in this LibTorch) are dropped when the process starts.
const char* const kSaveOpCandidates[] = {
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::_unsafe_view",
    "aten::exp",
    "aten::sin",
    "aten::tanh",
    "aten::sigmoid",
    "aten::_softmax",
    "aten::_log_softmax",
    "aten::native_layer_norm",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::gelu",
    "aten::native_dropout",
    "aten::mul.Tensor",
    "aten::add.Tensor",
    "aten::sum.dim_IntList",
    "aten::max.dim",
    "aten::sort",
    "aten::gather",
    "aten::index_select",
    "aten::_to_copy",
    "aten::clone",
    "aten::pow.Tensor_Scalar",
    "aten::relu",
    "aten::linear",  // composite: expected to be rejected
};

struct SaveOpNames {
  std::vector<std::string> accepted;
  std::vector<std::pair<std::string, std::string>> dropped;  // name, reason
};

const SaveOpNames& save_op_names() {
  static const SaveOpNames names = [] {
    SaveOpNames out;
    for (const char* name : kSaveOpCandidates) {
      try {
        (void)sac::Policy::save_ops({name});
        out.accepted.emplace_back(name);
      } catch (const c10::Error& e) {
        std::string reason = e.what_without_backtrace();
        reason = reason.substr(0, reason.find('\n'));
        out.dropped.emplace_back(name, reason);
      }
    }
    return out;
  }();
  return names;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t case_seed(uint64_t base, uint64_t index) {
  return splitmix64(base * 0x100000001B3ull + index);
}

// Stable across builds, unlike std::hash.
uint64_t fnv1a(const std::string& s, uint64_t salt) {
  uint64_t h = 1469598103934665603ull ^ salt;
  for (unsigned char c : s) {
    h = (h ^ c) * 1099511628211ull;
  }
  return h;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    s += (i ? "," : "") + std::to_string(shape[i]);
  }
  return s + "]";
}

std::string first_lines(const std::string& text, size_t max_lines) {
  std::string out;
  size_t lines = 0, pos = 0;
  while (pos < text.size() && lines < max_lines) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    out += (lines ? "\n" : "") + text.substr(pos, end - pos);
    pos = end + 1;
    ++lines;
  }
  if (pos < text.size()) out += "\n[... truncated]";
  return out;
}

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
      return {"buffer_overwrite", "buf written whole (copy_ of a constant), then a * buf.mean()"};
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
  std::vector<int> loss;         // value ids summed into the loss
  bool second_backward = false;  // backward twice, the first retaining the graph
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
      const char* v[] = {"h=a*2; h.add_(b)", "h=a*2; h.mul_(0.5)", "h=a+1; h.relu_()",
                         "h=a*1.5; h.narrow(-1,0,n).mul_(2)", "h=a.clone(); h.sigmoid_()"};
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
    case Op::BufferOverwrite:
      o << (s.ints[0] ? " [buf.view(-1).copy_(...)]" : " [buf.copy_(...)]");
      break;
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
  o << "program " << seed << ": B=" << B << " T=" << T << " W=" << W << " H=" << H << " R=" << R
    << (second_backward ? " second_backward(retain_graph)" : "") << guards[offload_guard] << "\n";
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

// Storages the region reads but did not make.
std::set<int> storages_read_by(const Program& p, const Region& r) {
  std::set<int> out;
  for (int i = r.begin; i < r.end; ++i) {
    for (int id : p.steps[i].in) {
      const Value& v = p.values[id];
      if (v.def < r.begin) out.insert(v.storage);
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
    if (intersects(storages_read_by(p, r), storages_modified_from(p, r.begin))) return true;
  }
  return false;
}

bool retains_graph(const Program& p) { return p.second_backward; }

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
// a region (issue 36: FSDP's gathered parameters).
std::string shapes_of_interest(const Program& p) {
  bool function_grad = false, batch_norm_values = false, overwritten = false;
  for (const auto& s : p.steps) function_grad |= s.op == Op::FunctionGrad;
  for (const auto& r : p.regions) {
    bool norm = false, grad = false;
    for (int i = r.begin; i < r.end; ++i) {
      norm |= p.steps[i].op == Op::BatchNormModule;
      grad |= p.steps[i].op == Op::InnerGrad;
      overwritten |= p.steps[i].op == Op::BufferOverwrite;
    }
    batch_norm_values |= r.value_check && norm && grad;
  }
  std::string out = function_grad ? "function-grad" : "";
  const auto add = [&](const char* shape) { out += std::string(out.empty() ? "" : ",") + shape; };
  if (batch_norm_values) add("batchnorm+values+inner-grad");
  if (overwritten) add("buffer-overwritten-in-region");
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
  if (p.second_backward) f.insert("retain_graph");
  if (p.offload_guard != 0) f.insert("offload-guard");
  std::string out;
  for (const auto& x : f) out += (out.empty() ? "" : " ") + x;
  return out;
}

// ---- Generation -------------------------------------------------------------

// Op families named in SAC_FUZZ_SKIP (comma-separated) are not generated: for
// triage, when failures of one known kind hide the others. The default is
// everything. It changes what a seed generates: a replay needs the same value.
const std::set<std::string>& skipped_families() {
  static const std::set<std::string> skipped = [] {
    std::set<std::string> out;
    std::stringstream in(std::getenv("SAC_FUZZ_SKIP") ? std::getenv("SAC_FUZZ_SKIP") : "");
    for (std::string item; std::getline(in, item, ',');) {
      if (!item.empty()) out.insert(item);
    }
    return out;
  }();
  return skipped;
}

// How regions are checkpointed (SAC_FUZZ_REGIONS).
enum class RegionsAs { Checkpoint, Guard, Mixed };
RegionsAs regions_as() {
  static const RegionsAs mode = [] {
    const char* env = std::getenv("SAC_FUZZ_REGIONS");
    const std::string value = env ? env : "checkpoint";
    if (value == "checkpoint") return RegionsAs::Checkpoint;
    if (value == "guard") return RegionsAs::Guard;
    if (value == "mixed") return RegionsAs::Mixed;
    std::cerr << "sac_fuzz: SAC_FUZZ_REGIONS=" << value << " is not checkpoint, guard or mixed\n";
    std::exit(2);
  }();
  return mode;
}

// The environment a replay needs.
std::string replay_env() {
  const char* dispatch = std::getenv("SAC_DISPATCH");
  const char* skip = std::getenv("SAC_FUZZ_SKIP");
  const char* regions = std::getenv("SAC_FUZZ_REGIONS");
  return std::string("SAC_DISPATCH=") + (dispatch ? dispatch : "auto") +
         (regions && *regions ? std::string(" SAC_FUZZ_REGIONS=") + regions : std::string()) +
         (skip && *skip ? std::string(" SAC_FUZZ_SKIP=") + skip : std::string());
}

class Generator {
 public:
  Generator(uint64_t seed, const std::vector<std::string>& save_names)
      : rng_(seed), names_(save_names) {
    p_.seed = seed;
  }

  Program generate() {
    p_.B = uniform(3, 8);
    p_.T = uniform(3, 8);
    p_.W = uniform(3, 8);
    p_.R = p_.B * p_.T;
    for (int64_t h : {4, 3, 2}) {
      if (p_.W % h == 0 && p_.W > h) {
        p_.H = h;
        break;
      }
    }
    const int inputs = uniform(1, 3);
    for (int i = 0; i < inputs; ++i) {
      leaf("x" + std::to_string(i), Leaf::Input, coin(0.5) ? s3() : s2(), 1.0, 0.0);
    }
    p_.buffer = leaf("buf", Leaf::Buffer, coin(0.5) ? s3() : s2(), 0.5, 0.0);

    const int steps = uniform(4, 22);
    while (static_cast<int>(p_.steps.size()) < steps) {
      family();
    }
    choose_loss();
    p_.second_backward = coin(0.15);
    p_.offload_guard = coin(0.3) ? uniform(1, 3) : 0;
    choose_regions();
    return std::move(p_);
  }

 private:
  // ---- randomness (by hand: the standard distributions differ between
  // standard libraries, and a seed must name the same program everywhere)
  int64_t uniform(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng_() % static_cast<uint64_t>(hi - lo + 1));
  }
  double real(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  }
  bool coin(double p) { return real(0, 1) < p; }
  template <class T>
  T choice(std::initializer_list<T> items) {
    return *(items.begin() + uniform(0, items.size() - 1));
  }

  // ---- values
  std::vector<int64_t> s2() const { return {p_.R, p_.W}; }
  std::vector<int64_t> s3() const { return {p_.B, p_.T, p_.W}; }
  const Value& val(int id) const { return p_.values[id]; }
  const std::vector<int64_t>& shape(int id) const { return p_.values[id].shape; }
  bool rg(std::initializer_list<int> ids) const {
    for (int id : ids) {
      if (p_.values[id].requires_grad) return true;
    }
    return false;
  }
  // Elementwise results keep their inputs' strides: contiguous only if they
  // are (view() of a non-contiguous tensor would fail).
  bool contig(std::initializer_list<int> ids) const {
    for (int id : ids) {
      if (!p_.values[id].contiguous) return false;
    }
    return true;
  }

  int leaf(const std::string& name, Leaf kind, std::vector<int64_t> shape, double scale,
           double offset) {
    Value v;
    v.name = name;
    v.leaf = kind;
    v.shape = std::move(shape);
    v.requires_grad = kind != Leaf::Buffer;
    v.aliases_leaf = true;
    v.init_scale = scale;
    v.init_offset = offset;
    v.storage = p_.values.size();
    p_.values.push_back(v);
    return p_.values.size() - 1;
  }

  static Value fval(std::vector<int64_t> shape, bool requires_grad, bool contiguous = true) {
    Value v;
    v.shape = std::move(shape);
    v.requires_grad = requires_grad;
    v.contiguous = contiguous;
    return v;
  }
  static Value ival(std::vector<int64_t> shape, int64_t bound) {
    Value v;
    v.is_index = true;
    v.shape = std::move(shape);
    v.bound = bound;
    return v;
  }
  // A view of `base`: it aliases what `base` aliases.
  Value view_of(int base, std::vector<int64_t> shape, bool contiguous) const {
    Value v = fval(std::move(shape), val(base).requires_grad, contiguous);
    v.aliases_leaf = val(base).aliases_leaf;
    v.no_inplace = val(base).no_inplace;
    v.storage = val(base).storage;
    return v;
  }

  int emit(Op op, std::vector<int> in, std::vector<Value> outs, std::vector<int64_t> ints = {},
           std::vector<double> reals = {}, int module = -1) {
    Step s{op, std::move(in), {}, std::move(ints), std::move(reals), module};
    for (int id : s.in) {
      p_.values[id].uses++;
    }
    for (auto& v : outs) {
      v.def = p_.steps.size();
      v.name = "v" + std::to_string(p_.values.size());
      if (v.storage < 0) v.storage = p_.values.size();
      p_.values.push_back(v);
      s.out.push_back(p_.values.size() - 1);
    }
    p_.steps.push_back(s);
    return s.out.empty() ? -1 : s.out[0];
  }

  // Live float values satisfying `pred`.
  std::vector<int> find(const std::function<bool(const Value&)>& pred) const {
    std::vector<int> out;
    for (size_t i = 0; i < p_.values.size(); ++i) {
      const Value& v = p_.values[i];
      if (!v.is_index && !v.dead && pred(v)) out.push_back(i);
    }
    return out;
  }
  // Recent values are preferred: programs become chains, not flat fans out
  // of the leaves.
  int pick(const std::vector<int>& ids) {
    if (ids.empty()) return -1;
    if (coin(0.5)) {
      const int64_t recent = std::min<int64_t>(3, ids.size());
      return ids[ids.size() - 1 - uniform(0, recent - 1)];
    }
    return ids[uniform(0, ids.size() - 1)];
  }
  int any_float() {
    return pick(find([](const Value&) { return true; }));
  }
  static bool broadcasts(const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
    if (from.size() > to.size()) return false;
    for (size_t i = 0; i < from.size(); ++i) {
      const int64_t f = from[from.size() - 1 - i], t = to[to.size() - 1 - i];
      if (f != t && f != 1) return false;
    }
    return true;
  }
  // An operand that broadcasts to `a`'s shape (the result keeps a's shape),
  // else `a` itself.
  int operand_for(int a) {
    const auto target = shape(a);
    int b = pick(find([&](const Value& v) { return broadcasts(v.shape, target); }));
    return b < 0 ? a : b;
  }
  int canonical_value() {
    return pick(find([&](const Value& v) { return v.shape == s2() || v.shape == s3(); }));
  }
  // A [R, W] value, reshaping a [B, T, W] one if there is none.
  int need2() {
    int a = pick(find([&](const Value& v) { return v.shape == s2(); }));
    return a >= 0 ? a : reshape(pick(find([&](const Value& v) { return v.shape == s3(); })), s2());
  }
  int need3() {
    int a = pick(find([&](const Value& v) { return v.shape == s3(); }));
    return a >= 0 ? a : reshape(pick(find([&](const Value& v) { return v.shape == s2(); })), s3());
  }
  int reshape(int a, std::vector<int64_t> to) {
    // view() only where it cannot fail; reshape() of a non-contiguous tensor
    // copies, so its result aliases nothing.
    const bool as_view = val(a).contiguous && coin(0.5);
    Value out =
        (as_view || val(a).contiguous) ? view_of(a, to, true) : fval(to, val(a).requires_grad);
    return emit(as_view ? Op::View : Op::Reshape, {a}, {out}, to);
  }
  int param(std::vector<int64_t> shape, double scale, double offset) {
    std::vector<int> same =
        find([&](const Value& v) { return v.leaf == Leaf::Param && v.shape == shape; });
    if (!same.empty() && coin(0.4)) return pick(same);
    return leaf("p" + std::to_string(params_++), Leaf::Param, std::move(shape), scale, offset);
  }
  int module(bool layer_norm, bool batch_norm = false) {
    std::vector<int> same;
    for (size_t m = 0; m < p_.modules.size(); ++m) {
      if (p_.modules[m].layer_norm == layer_norm && p_.modules[m].batch_norm == batch_norm) {
        same.push_back(m);
      }
    }
    if (!same.empty() && coin(0.4)) return same[uniform(0, same.size() - 1)];
    p_.modules.push_back({layer_norm, batch_norm, layer_norm || batch_norm || coin(0.8)});
    return p_.modules.size() - 1;
  }
  double inv_sqrt(int64_t n) const { return 1.0 / std::sqrt(static_cast<double>(n)); }

  // Autograd saves `ids` for the backward of the op that made `out` (when it
  // records one): modifying their storage in place later is an error in
  // plain autograd too, so in-place ops mostly pick other targets.
  int saves(int out, std::initializer_list<int> ids) {
    if (out >= 0 && val(out).requires_grad) {
      for (int id : ids) saved_.insert(val(id).storage);
    }
    return out;
  }
  bool is_saved(int id) const { return saved_.count(val(id).storage) > 0; }

  // ---- op families
 public:
  struct Family {
    const char* name;
    int weight;
    void (Generator::*gen)();
  };
  static const std::vector<Family>& families() {
    static const std::vector<Family> all = {
        {"elementwise", 22, &Generator::elementwise},
        {"reduction", 11, &Generator::reduction},
        {"matmul", 12, &Generator::matmul},
        {"view", 11, &Generator::view},
        {"inplace", 10, &Generator::inplace},
        {"multi_output", 3, &Generator::multi_output},
        {"random", 5, &Generator::random},
        {"index", 6, &Generator::index},
        {"cast", 3, &Generator::cast},
        {"attention", 4, &Generator::attention},
        {"modules", 7, &Generator::modules},
        {"scalar", 2, &Generator::scalar},
        {"inner_grad", 4, &Generator::inner_grad},
        {"buffer", 2, &Generator::buffer},
        {"host_data", 5, &Generator::host_data},
        {"overlap", 4, &Generator::overlap},
        {"drift", 2, &Generator::drift},
        {"function_grad", 3, &Generator::function_grad},
        {"batch_norm_grad", 2, &Generator::batch_norm_grad},
    };
    return all;
  }

 private:
  void family() {
    int total = 0;
    for (const auto& f : families()) total += weight(f);
    if (total == 0) return elementwise();
    int r = uniform(0, total - 1);
    for (const auto& f : families()) {
      if (r < weight(f)) {
        (this->*f.gen)();
        return;
      }
      r -= weight(f);
    }
  }
  static int weight(const Family& f) { return skipped_families().count(f.name) ? 0 : f.weight; }

  void elementwise() {
    const int a = any_float();
    const Op op = choice({Op::Add, Op::Sub, Op::Mul, Op::Add, Op::Mul, Op::DivConst, Op::Sin,
                          Op::Exp, Op::Tanh, Op::Sigmoid, Op::Relu, Op::Gelu, Op::Pow2});
    switch (op) {
      case Op::Add:
      case Op::Sub:
      case Op::Mul: {
        const int b = operand_for(a);
        const int out = emit(op, {a, b}, {fval(shape(a), rg({a, b}), contig({a, b}))});
        if (op == Op::Mul) saves(out, {a, b});
        break;
      }
      case Op::DivConst:
        emit(op, {a}, {fval(shape(a), rg({a}), contig({a}))}, {}, {choice({2.0, 3.0, 0.5, 7.0})});
        break;
      case Op::Gelu:
        saves(emit(op, {a}, {fval(shape(a), rg({a}), contig({a}))}, {coin(0.5)}), {a});
        break;
      default: {
        const int out = emit(op, {a}, {fval(shape(a), rg({a}), contig({a}))});
        if (op == Op::Sin || op == Op::Pow2 || op == Op::Exp)
          saves(out, {a});  // exp: clamp's input
        if (op == Op::Tanh || op == Op::Sigmoid || op == Op::Relu) saves(out, {out});
      }
    }
  }

  void reduction() {
    switch (uniform(0, 5)) {
      case 0: {
        const int a = pick(find([](const Value& v) { return !v.shape.empty(); }));
        const int64_t rank = shape(a).size(), dim = uniform(0, rank - 1);
        const bool keep = coin(0.5);
        auto out = shape(a);
        if (keep) out[dim] = 1;
        else out.erase(out.begin() + dim);
        emit(Op::SumDim, {a}, {fval(out, rg({a}))}, {dim, keep});
        break;
      }
      case 1: {
        const int a = any_float();
        emit(Op::MeanAll, {a}, {fval({}, rg({a}))});
        break;
      }
      case 2: max_dim(pick(find([](const Value& v) { return !v.shape.empty(); }))); break;
      case 3:
      case 4: {
        const int a = pick(find([](const Value& v) { return !v.shape.empty(); }));
        const int64_t dim = uniform(0, shape(a).size() - 1);
        const int out =
            emit(coin(0.5) ? Op::Softmax : Op::LogSoftmax, {a}, {fval(shape(a), rg({a}))}, {dim});
        saves(out, {out});
        break;
      }
      default: {
        const int64_t W = p_.W;
        const int a =
            pick(find([W](const Value& v) { return !v.shape.empty() && v.shape.back() == W; }));
        const int w = param({W}, 0.1, 1.0), b = param({W}, 0.1, 0.0);
        saves(emit(Op::LayerNormF, {a, w, b}, {fval(shape(a), true)}), {a});
      }
    }
  }
  // Values and indices of the max over the last dim (keepdim).
  int max_dim(int a) {
    auto out = shape(a);
    const int64_t bound = out.back();
    out.back() = 1;
    emit(Op::MaxDim, {a}, {fval(out, rg({a})), ival(out, bound)});
    return p_.values.size() - 1;  // the indices
  }

  void matmul() {
    const int64_t W = p_.W;
    switch (uniform(0, 4)) {
      case 0: {
        const int a = need2(), w = param({W, W}, inv_sqrt(W), 0.0);
        saves(emit(Op::Mm, {a, w}, {fval(s2(), true)}), {a});
        break;
      }
      case 1: {
        const int a = need2(), b = need2(), c = need2();
        saves(emit(Op::MmT, {a, b, c}, {fval(s2(), rg({a, b, c}))}), {a, b, c});
        break;
      }
      case 2: {
        const int a = need3(), w = param({W, W}, inv_sqrt(W), 0.0);
        saves(emit(Op::Matmul3, {a, w}, {fval(s3(), true)}), {a});
        break;
      }
      case 3: {
        const int a = need3(), b = need3(), c = need3();
        saves(emit(Op::Bmm, {a, b, c}, {fval(s3(), rg({a, b, c}))}), {a, b, c});
        break;
      }
      default: {
        const int bias = param({W}, 0.1, 0.0), a = need2(), w = param({W, W}, inv_sqrt(W), 0.0);
        saves(emit(Op::Addmm, {bias, a, w}, {fval(s2(), true)}), {a});
      }
    }
  }

  void view() {
    switch (uniform(0, 4)) {
      case 0: {
        const int a = canonical_value();
        reshape(a, shape(a) == s2() ? s3() : s2());
        break;
      }
      case 1: {
        // A view of a fresh copy: canonical shape, non-contiguous strides.
        const int a = canonical_value();
        emit(Op::TransposeMix, {a}, {fval(shape(a), rg({a}), /*contiguous=*/false)});
        break;
      }
      case 2: {
        const int a =
            pick(find([](const Value& v) { return !v.shape.empty() && v.shape.back() >= 2; }));
        const int64_t last = shape(a).back(), len = uniform(1, last - 1),
                      start = uniform(0, last - len);
        auto out = shape(a);
        out.back() = len;
        emit(Op::Narrow, {a}, {view_of(a, out, false)}, {start, len});
        break;
      }
      case 3: select_unsqueeze(canonical_value()); break;
      default: {
        // Broadcast a smaller value up to a canonical shape; without
        // .contiguous() the result has stride-0 dims (never written to).
        const auto target = coin(0.5) ? s2() : s3();
        int b = pick(
            find([&](const Value& v) { return v.shape != target && broadcasts(v.shape, target); }));
        if (b < 0) {
          b = select_unsqueeze(need2());
        }
        const bool contiguous = coin(0.5);
        Value out = view_of(b, target, false);
        if (contiguous) {
          out = fval(target, rg({b}));
        } else {
          out.no_inplace = true;
        }
        emit(Op::Expand, {b}, {out}, target,
             contiguous ? std::vector<double>{1.0} : std::vector<double>{});
      }
    }
  }
  int select_unsqueeze(int a) {
    auto out = shape(a);
    const int64_t index = uniform(0, out[0] - 1);
    out[0] = 1;
    return emit(Op::SelectUnsqueeze, {a}, {view_of(a, out, false)}, {index});
  }

  void inplace() {
    // In-place ops on intermediates that autograd may need are errors in
    // plain autograd too (the reference then throws and the case is
    // invalid), so half of them work on a fresh intermediate made in the
    // same step.
    const bool careful = coin(0.9);
    std::vector<int> targets = find([&](const Value& v) {
      return v.leaf == Leaf::None && !v.aliases_leaf && !v.no_inplace &&
             !(careful && saved_.count(v.storage));
    });
    if (targets.empty() || coin(0.5)) {
      const int a = any_float(), variant = uniform(0, 4);
      std::vector<int> in{a};
      if (variant == 0) in.push_back(operand_for(a));
      bool grad = false;
      for (int id : in) grad |= val(id).requires_grad;
      const int out = emit(Op::FreshInplace, in, {fval(shape(a), grad, contig({a}))}, {variant});
      if (variant == 2 || variant == 4) saves(out, {out});  // relu_, sigmoid_
      return;
    }
    const int a = pick(targets), variant = uniform(0, 4);
    std::vector<int> in{a};
    if (variant == 0) in.push_back(operand_for(a));
    Value out = val(a);
    out.uses = 0;
    for (int id : in) out.requires_grad |= val(id).requires_grad;
    const int id = emit(Op::PoolInplace, in, {out}, {variant});
    if (variant == 2 || variant == 4) saves(id, {id});  // relu_, tanh_
    p_.values[a].dead = true;
  }

  void multi_output() {
    const int a = pick(find([](const Value& v) { return !v.shape.empty(); }));
    emit(Op::Sort, {a}, {fval(shape(a), rg({a})), ival(shape(a), shape(a).back())}, {coin(0.5)});
  }

  void random() {
    const int a = any_float();
    if (coin(0.5)) {
      emit(Op::Dropout, {a}, {fval(shape(a), rg({a}), contig({a}))}, {}, {choice({0.2, 0.5})});
    } else {
      saves(emit(Op::RandLikeMul, {a}, {fval(shape(a), rg({a}), contig({a}))}), {a});
    }
  }

  int index_value(const std::function<bool(const Value&)>& pred) {
    std::vector<int> ids;
    for (size_t i = 0; i < p_.values.size(); ++i) {
      if (p_.values[i].is_index && pred(p_.values[i])) ids.push_back(i);
    }
    return pick(ids);
  }

  void index() {
    switch (uniform(0, 3)) {
      case 0: {
        const int a = need2();
        emit(Op::Argmax, {a}, {ival({p_.R}, p_.W)});
        break;
      }
      case 1: {
        // Rows picked by an argmax: a non-tensor result steering the graph.
        const int64_t R = p_.R;
        int idx = index_value([R](const Value& v) { return v.shape.size() == 1 && v.bound <= R; });
        if (idx < 0 || coin(0.3)) {
          idx = emit(Op::Argmax, {need2()}, {ival({p_.R}, p_.W)});
        }
        const int c = need2();
        emit(Op::IndexSelect, {c, idx}, {fval({val(idx).shape[0], p_.W}, rg({c}))});
        break;
      }
      case 2: {
        const int c = canonical_value();
        int64_t numel = 1;
        for (int64_t d : shape(c)) numel *= d;
        std::vector<int64_t> data(numel);
        for (auto& x : data) x = uniform(0, p_.W - 1);
        emit(Op::GatherFixed, {c}, {fval(shape(c), rg({c}))}, data);
        break;
      }
      default: {
        int c = -1, idx = index_value([](const Value&v) { return !v.shape.empty(); });
        if (idx >= 0) {
          const Value iv = val(idx);
          c = pick(find([&](const Value& v) {
            return v.shape.size() == iv.shape.size() && !v.shape.empty() &&
                   v.shape.back() >= iv.bound &&
                   std::equal(iv.shape.begin(), iv.shape.end() - 1, v.shape.begin());
          }));
        }
        if (c < 0) {
          c = canonical_value();
          idx = max_dim(pick(find([&](const Value& v) { return v.shape == shape(c); })));
        }
        emit(Op::GatherIdx, {c, idx}, {fval(val(idx).shape, rg({c}))});
      }
    }
  }

  void cast() {
    const int a = any_float(), b = operand_for(a);
    emit(Op::Cast64, {a, b}, {fval(shape(a), rg({a, b}), contig({a, b}))}, {coin(0.5)});
  }

  void attention() {
    // q, k, v: one projection split in three, as a transformer does.
    const int a = need3(), w = param({p_.W, 3 * p_.W}, inv_sqrt(p_.W), 0.0);
    const bool four_d = coin(0.6), causal = coin(0.4), mask = !causal && coin(0.3);
    std::vector<double> reals{coin(0.2) ? 0.3 : 0.0};
    if (mask) {
      for (int64_t i = 0; i < p_.T * p_.T; ++i) reals.push_back(real(-1.0, 0.0));
    }
    const int out = emit(Op::Sdpa, {a, w}, {fval(s3(), true, /*contiguous=*/four_d)},
                         {four_d, causal, mask}, reals);
    saves(out, {a, out});
  }

  void modules() {
    if (coin(0.2)) {
      // Statistics over the R rows of a [R, W] value (R >= 9).
      const int a = need2();
      saves(emit(Op::BatchNormModule, {a}, {fval(shape(a), true)}, {}, {}, module(false, true)),
            {a});
    } else if (coin(0.5)) {
      // On 3-D input LibTorch's Linear runs mm, _unsafe_view, then adds the
      // bias in place; on 2-D input one addmm.
      const int a = coin(0.5) ? need3() : need2();
      saves(emit(Op::LinearModule, {a}, {fval(shape(a), true)}, {}, {}, module(false)), {a});
    } else {
      const int64_t W = p_.W;
      const int a =
          pick(find([W](const Value& v) { return !v.shape.empty() && v.shape.back() == W; }));
      saves(emit(Op::LayerNormModule, {a}, {fval(shape(a), true)}, {}, {}, module(true)), {a});
    }
  }

  void scalar() {
    const int a = any_float(), b = any_float();
    emit(Op::ItemScale, {a, b}, {fval(shape(a), rg({a}), contig({a}))});
  }

  void drift() {
    const int a = any_float();
    emit(Op::Drift, {a}, {fval(shape(a), rg({a}), contig({a}))});
  }

  // BatchNorm in training, then a backward through it inside the forward:
  // next to each other, so that one region often holds both.
  void batch_norm_grad() {
    const int a = need2();
    const int h = saves(
        emit(Op::BatchNormModule, {a}, {fval(shape(a), true)}, {}, {}, module(false, true)), {a});
    const int c = operand_for(h);
    saves(emit(Op::InnerGrad, {h, c}, {fval(shape(h), true, contig({h, c}))}), {h, c});
  }

  void function_grad() {
    const int a = pick(find([](const Value& v) {
      return v.requires_grad && (v.shape.size() == 2 || v.shape.size() == 3);
    }));
    if (a < 0) return elementwise();
    int b = pick(find([&](const Value& v) { return v.shape == shape(a); }));
    if (b < 0) b = a;
    saves(emit(Op::FunctionGrad, {a, b}, {fval(shape(a), true)},
               {coin(0.5), coin(0.5), coin(0.5), coin(0.3)}),
          {a, b});
  }

  void inner_grad() {
    const int a = pick(find([](const Value& v) { return v.requires_grad; }));
    if (a < 0) return elementwise();
    const int c = operand_for(a);
    saves(emit(Op::InnerGrad, {a, c}, {fval(shape(a), true, contig({a, c}))}), {a, c});
  }

  void buffer() {
    // Outside regions only (see choose_regions): a region's recomputation
    // would apply it again.
    if (is_saved(p_.buffer) && coin(0.8)) return elementwise();
    if (coin(0.5)) {
      emit(Op::BufferMutate, {p_.buffer}, {}, {coin(0.5)});
      return;
    }
    // Written whole, then read: inside a guard region the buffer's memory is
    // not kept, the replay makes it anew (FSDP's gathered parameters).
    const int a = any_float();
    emit(Op::BufferOverwrite, {p_.buffer, a}, {fval(shape(a), rg({a}), val(a).contiguous)},
         {coin(0.5)});
  }

  void host_data() {
    const int a = pick(find([](const Value& v) { return !v.shape.empty(); }));
    const auto& sh = shape(a);
    if (coin(0.35)) {
      // Rows picked by an index made from host data: autograd saves it.
      std::vector<int64_t> index(uniform(1, sh[0] + 1));
      for (auto& i : index) i = uniform(0, sh[0] - 1);
      auto out = sh;
      out[0] = index.size();
      emit(Op::HostIndex, {a}, {fval(out, rg({a}))}, index);
      return;
    }
    std::vector<double> data(sh.back());
    for (auto& d : data) d = std::round(real(-2, 2) * 8) / 8;
    saves(emit(Op::HostConst, {a}, {fval(sh, rg({a}))}, {uniform(0, 4)}, data), {a});
  }

  void overlap() {
    // A narrow view read with the value it views: where both were made before
    // a region, two outside tensors on one memory.
    std::vector<int> views;
    for (size_t i = 0; i < p_.values.size(); ++i) {
      const Value& v = p_.values[i];
      if (v.def >= 0 && p_.steps[v.def].op == Op::Narrow && !v.dead &&
          !val(p_.steps[v.def].in[0]).dead) {
        views.push_back(i);
      }
    }
    if (views.empty()) return view();
    const int v = pick(views);
    const int base = p_.steps[val(v).def].in[0];
    const int64_t n = shape(v).back(), start = uniform(0, shape(base).back() - n);
    saves(emit(Op::OverlapMul, {base, v}, {fval(shape(v), rg({base, v}))}, {start}), {base, v});
  }

  // ---- loss and regions
  void choose_loss() {
    bool grad = false;
    for (size_t i = 0; i < p_.values.size(); ++i) {
      const Value& v = p_.values[i];
      if (v.leaf == Leaf::None && !v.is_index && !v.dead && v.uses == 0) {
        p_.loss.push_back(i);
        grad |= v.requires_grad;
      }
    }
    // A value used elsewhere too, now and then: its gradient then has
    // several contributions.
    if (coin(0.3)) {
      const int extra = pick(find([](const Value& v) { return v.leaf == Leaf::None; }));
      if (extra >= 0 && std::find(p_.loss.begin(), p_.loss.end(), extra) == p_.loss.end()) {
        p_.loss.push_back(extra);
        grad |= val(extra).requires_grad;
      }
    }
    if (!grad) p_.loss.push_back(0);  // x0: the loss must need a backward
  }

  PolicySpec policy_for_region() {
    // Share the Policy object of an earlier region now and then.
    std::vector<int> with_policy;
    for (size_t r = 0; r < p_.regions.size(); ++r) {
      const PolicySpec& other = p_.regions[r].policy;
      if (other.kind != PolicySpec::None && !other.fresh) with_policy.push_back(r);
    }
    if (!with_policy.empty() && coin(0.2)) {
      return p_.regions[with_policy[uniform(0, with_policy.size() - 1)]].policy;
    }
    PolicySpec s;
    const int r = uniform(0, 99);
    s.kind = r < 30   ? PolicySpec::None
             : r < 62 ? PolicySpec::SaveOps
             : r < 72 ? PolicySpec::SaveAll
             : r < 84 ? PolicySpec::HashName
             : r < 90 ? PolicySpec::BoolHash
                      : PolicySpec::EveryOther;
    if (s.kind == PolicySpec::None) return s;
    s.key = next_policy_key_++;
    s.salt = rng_();
    s.fresh = coin(0.25);
    s.keep_shape_deciding = coin(0.2);
    if (s.kind == PolicySpec::SaveOps) {
      for (const auto& name : names_) {
        if (coin(0.35)) s.names.push_back(name);
      }
      if (s.names.empty()) s.names.push_back(names_[uniform(0, names_.size() - 1)]);
    }
    return s;
  }

  void add_region(int begin, int end, int parent, int depth) {
    Region r;
    r.begin = begin;
    r.end = end;
    r.parent = parent;
    r.policy = policy_for_region();
    if (r.policy.kind != PolicySpec::None) {
      r.via_context_fn = coin(0.25);
      r.offload = coin(0.3);
      r.names = coin(0.3) ? uniform(1, 3) : 0;
    }
    r.early_stop = !coin(0.25);
    r.no_determinism_check = coin(0.1);
    r.value_check = !r.no_determinism_check && coin(0.3);
    for (int i = begin; i < end; ++i) {
      if (p_.steps[i].op == Op::Drift) {  // only the value check sees it (see drift())
        r.no_determinism_check = false;
        r.value_check = true;
      }
    }
    r.debug = coin(0.05);
    r.arg_style = uniform(0, 2);
    r.capture_leaves = coin(0.5);
    p_.regions.push_back(r);
    const int index = p_.regions.size() - 1;
    if (depth < 2 && coin(0.3)) {
      place_regions(begin, end, index, depth + 1, uniform(1, 2));
    }
  }

  // Whether a recomputation that reruns `op` would write the buffer again:
  // a guard region replays a buffer written whole into memory of its own.
  static bool writes_buffer_again(Op op) {
    return op == Op::BufferMutate ||
           (op == Op::BufferOverwrite && regions_as() != RegionsAs::Guard);
  }

  // Up to `count` disjoint step ranges inside [lo, hi), never across a
  // buffer mutation a recomputation would apply again.
  void place_regions(int lo, int hi, int parent, int depth, int count) {
    std::vector<std::pair<int, int>> chosen;
    for (int attempt = 0; attempt < 20 && static_cast<int>(chosen.size()) < count; ++attempt) {
      const int b = uniform(lo, hi - 1), e = uniform(b + 1, hi);
      bool ok = true;
      for (int i = b; i < e && ok; ++i) ok = !writes_buffer_again(p_.steps[i].op);
      for (const auto& [cb, ce] : chosen) ok = ok && (e <= cb || b >= ce);
      if (ok) chosen.emplace_back(b, e);
    }
    std::sort(chosen.begin(), chosen.end());
    for (const auto& [b, e] : chosen) add_region(b, e, parent, depth);
  }

  void choose_regions() {
    const int n = p_.steps.size();
    place_regions(0, n, -1, 0, choice({0, 1, 1, 2, 2, 3}));
    // What each region takes and gives back: the values its steps read but
    // did not make, and the values it made that later steps or the loss read.
    for (size_t r = 0; r < p_.regions.size(); ++r) {
      Region& R = p_.regions[r];
      std::set<int> made, taken;
      for (int i = R.begin; i < R.end; ++i) {
        for (int id : p_.steps[i].in) {
          const bool is_leaf = p_.values[id].leaf != Leaf::None;
          if (!made.count(id) && !taken.count(id) && !(is_leaf && R.capture_leaves)) {
            taken.insert(id);
            R.ins.push_back(id);
          }
        }
        for (int id : p_.steps[i].out) made.insert(id);
      }
      for (int id : made) {
        bool needed = std::find(p_.loss.begin(), p_.loss.end(), id) != p_.loss.end();
        for (int i = R.end; i < n && !needed; ++i) {
          const auto& in = p_.steps[i].in;
          needed = std::find(in.begin(), in.end(), id) != in.end();
        }
        if (needed) R.outs.push_back(id);
      }
      p_.region_at[{R.parent, R.begin}] = r;
    }
  }

  std::mt19937_64 rng_;
  const std::vector<std::string>& names_;
  Program p_;
  int params_ = 0;
  int next_policy_key_ = 0;
  std::set<int> saved_;  // storages autograd keeps for backward
};

Program generate(uint64_t seed) { return Generator(seed, save_op_names().accepted).generate(); }

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
          default:
            h = in(0).clone();
            h.sigmoid_();
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
        if (s.ints[0]) in(0).view({-1}).copy_(value);
        else in(0).copy_(value);
        set(0, in(1) * in(0).mean());
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

RunResult run(const Program& p, bool checkpointed) {
  RunResult result;
  Instance inst(p);
  result.target_names = inst.target_names;
  Runner runner(p, inst, checkpointed);
  for (int it = 0; it < kIterations; ++it) {
    try {
      // Identical in both runs, so random ops draw the same numbers.
      torch::manual_seed(p.seed + it);
      drift_calls.clear();
      Snapshot snap;
      {
        at::Tensor loss = runner.forward();
        snap.loss = loss.detach().clone();
        snap.grads =
            torch::autograd::grad({loss}, inst.targets, {}, /*retain_graph=*/p.second_backward,
                                  /*create_graph=*/false, /*allow_unused=*/true);
        if (p.second_backward) {
          snap.second_grads =
              torch::autograd::grad({loss}, inst.targets, {}, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
        }
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
  for (int pass = 0; pass < 2; ++pass) {
    const auto& e = pass ? expected.second_grads : expected.grads;
    const auto& a = pass ? actual.second_grads : actual.grads;
    const std::string which = pass ? " (second backward)" : "";
    if (e.size() != a.size()) return "number of gradients" + which + " differs";
    for (size_t i = 0; i < e.size(); ++i) {
      if (e[i].defined() != a[i].defined()) {
        return "grad of " + names[i] + which + ": " + (e[i].defined() ? "undefined" : "defined") +
               " where the reference's is not";
      }
      if (e[i].defined() && !bit_equal(e[i], a[i])) {
        return "grad of " + names[i] + which + ": " + diff_str(e[i], a[i]);
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

// ---- Parent -----------------------------------------------------------------

struct Job {
  std::vector<uint64_t> seeds;
  enum class Kind {
    Chunk,           // a run of cases
    Alone,           // one case of a chunk that died, in a process of its own
    CrashedInChunk,  // the case a chunk was running when it died, alone
    Recheck,         // a case that failed in a chunk, again alone
  } kind = Kind::Chunk;
  // CrashedInChunk, Recheck: what the chunk saw.
  std::vector<uint64_t> before;  // the chunk's cases run before this one
  std::string how;               // how the chunk's child died
  std::string stderr_tail;
  std::string category;
  std::vector<std::string> detail;
};

struct Child {
  pid_t pid = -1;
  int out_fd = -1, err_fd = -1;
  Job job;
  std::string out_buf, err_tail;
  std::vector<std::string> details;
  std::set<uint64_t> finished;
  std::chrono::steady_clock::time_point last_progress;
  bool timed_out = false;
};

struct Tally {
  size_t cases = 0, passed = 0, expected = 0, invalid = 0, failed = 0;
  std::map<std::string, size_t> passed_by, expected_by, invalid_by, failed_by;
  std::vector<uint64_t> failing_seeds;
  std::string mechanism;
};

std::string describe_status(int status, bool timed_out) {
  if (timed_out) {
    return "timeout: no result for " + std::to_string(child_timeout_s()) + " s (hang), killed";
  }
  if (WIFSIGNALED(status)) {
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  return "ended abnormally";
}

// Generating a program runs no op: the parent may do it for a crash report.
void append_listing(uint64_t seed, std::vector<std::string>& detail) {
  const Program program = generate(seed);
  detail.push_back("  features: " + features(program));
  for (const auto& l : split_lines(program.listing())) detail.push_back("  | " + l);
}

class Parent {
 public:
  Parent(uint64_t base_seed, std::optional<size_t> cases, std::optional<double> seconds, int jobs,
         bool verbose)
      : base_seed_(base_seed), cases_(cases), seconds_(seconds), jobs_(jobs), verbose_(verbose) {
    char path[4096];
    const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
    exe_display_ = n > 0 ? std::string(path, n) : "sac_fuzz";
    if (cases_) {
      chunk_ = std::max<size_t>(1, std::min<size_t>(kChunkSize, (*cases_ + jobs_ - 1) / jobs_));
    }
  }

  int run() {
    signal(SIGPIPE, SIG_IGN);
    const auto start = std::chrono::steady_clock::now();
    deadline_ = seconds_ ? start + std::chrono::milliseconds(static_cast<int64_t>(*seconds_ * 1000))
                         : std::chrono::steady_clock::time_point::max();
    std::cout << "sac_fuzz: " << replay_env() << ", seed " << base_seed_ << ", "
              << (seconds_ ? std::to_string(*seconds_) + " s" : std::to_string(*cases_) + " cases")
              << ", " << jobs_ << " jobs, " << exe_display_ << std::endl;
    const auto& names = save_op_names();
    for (const auto& [name, reason] : names.dropped) {
      std::cout << "save_ops candidate dropped: " << name << ": " << one_line(reason, 160) << "\n";
    }
    std::cout << std::flush;

    while (true) {
      while (static_cast<int>(children_.size()) < jobs_) {
        std::optional<Job> job = next_job();
        if (!job) break;
        spawn(std::move(*job));
      }
      if (children_.empty()) break;
      pump();
    }

    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << "\n== summary ==\n";
    std::cout << "mechanism: " << (t_.mechanism.empty() ? mechanism_name() : t_.mechanism) << "\n";
    std::cout << "cases: " << t_.cases << " in " << elapsed << " s ("
              << (t_.cases ? 1000.0 * elapsed / t_.cases : 0.0) << " s per 1000 cases, " << jobs_
              << " jobs)\n";
    std::cout << "passed (bit-identical): " << t_.passed << "\n";
    for (const auto& [k, n] : t_.passed_by) std::cout << "  " << k << ": " << n << "\n";
    std::cout << "expected limits: " << t_.expected << "\n";
    for (const auto& [k, n] : t_.expected_by) std::cout << "  " << k << ": " << n << "\n";
    std::cout << "invalid (the reference threw): " << t_.invalid << "\n";
    std::vector<std::pair<size_t, std::string>> reasons;
    for (const auto& [k, n] : t_.invalid_by) reasons.emplace_back(n, k);
    std::sort(reasons.rbegin(), reasons.rend());
    for (size_t i = 0; i < reasons.size() && i < (verbose_ ? reasons.size() : 6); ++i) {
      std::cout << "  " << reasons[i].first << "x " << reasons[i].second << "\n";
    }
    std::cout << "failed: " << t_.failed << "\n";
    for (const auto& [k, n] : t_.failed_by) std::cout << "  " << k << ": " << n << "\n";
    if (!t_.failing_seeds.empty()) {
      std::cout << "failing seeds:";
      for (uint64_t s : t_.failing_seeds) std::cout << " " << s;
      std::cout << "\n";
    }
    std::cout << t_.passed << " passed, " << t_.failed << " failed" << std::endl;
    return t_.failed ? 1 : 0;
  }

 private:
  std::optional<Job> next_job() {
    if (!retries_.empty()) {
      Job job = std::move(retries_.front());
      retries_.pop_front();
      return job;
    }
    const bool more =
        seconds_ ? std::chrono::steady_clock::now() < deadline_ : next_index_ < *cases_;
    if (!more) return std::nullopt;
    Job job;
    const size_t n = seconds_ ? kChunkSize : std::min(chunk_, *cases_ - next_index_);
    for (size_t i = 0; i < n; ++i) job.seeds.push_back(case_seed(base_seed_, next_index_++));
    return job;
  }

  void spawn(Job job) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      perror("sac_fuzz: pipe");
      std::exit(2);
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
    std::string csv;
    for (uint64_t s : job.seeds) csv += (csv.empty() ? "" : ",") + std::to_string(s);
    std::vector<std::string> args{exe_display_, "--child", csv};
    if (verbose_) args.push_back("--verbose");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    Child child;
    const int rc =
        posix_spawn(&child.pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    close(err[1]);
    if (rc != 0) {
      std::cerr << "sac_fuzz: posix_spawn failed: " << strerror(rc) << "\n";
      std::exit(2);
    }
    child.out_fd = out[0];
    child.err_fd = err[0];
    child.job = std::move(job);
    child.last_progress = std::chrono::steady_clock::now();
    children_.push_back(std::move(child));
  }

  // Reads what the children wrote, reaps the ones that are done, kills hung ones.
  void pump() {
    std::vector<pollfd> fds;
    for (const auto& c : children_) {
      if (c.out_fd >= 0) fds.push_back({c.out_fd, POLLIN, 0});
      if (c.err_fd >= 0) fds.push_back({c.err_fd, POLLIN, 0});
    }
    if (!fds.empty()) poll(fds.data(), fds.size(), 1000);
    char buf[65536];
    for (auto& c : children_) {
      for (int* fd : {&c.out_fd, &c.err_fd}) {
        if (*fd < 0) continue;
        pollfd p{*fd, POLLIN, 0};
        if (poll(&p, 1, 0) <= 0) continue;
        const ssize_t n = read(*fd, buf, sizeof(buf));
        if (n <= 0) {
          close(*fd);
          *fd = -1;
          continue;
        }
        if (fd == &c.out_fd) {
          c.out_buf.append(buf, n);
          size_t nl;
          while ((nl = c.out_buf.find('\n')) != std::string::npos) {
            line(c, c.out_buf.substr(0, nl));
            c.out_buf.erase(0, nl + 1);
          }
        } else {
          c.err_tail.append(buf, n);
          if (c.err_tail.size() > 8192) c.err_tail.erase(0, c.err_tail.size() - 8192);
          if (verbose_) std::cerr.write(buf, n);
        }
      }
      const auto idle = std::chrono::steady_clock::now() - c.last_progress;
      if (!c.timed_out && idle > std::chrono::seconds(child_timeout_s())) {
        c.timed_out = true;
        kill(c.pid, SIGKILL);
      }
    }
    for (auto it = children_.begin(); it != children_.end();) {
      if (it->out_fd < 0 && it->err_fd < 0) {
        int status = 0;
        waitpid(it->pid, &status, 0);
        finish(*it, status);
        it = children_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void line(Child& c, const std::string& text) {
    if (text.rfind("@@D ", 0) == 0) {
      c.details.push_back(text.substr(4));
    } else if (text.rfind("@@M ", 0) == 0) {
      t_.mechanism = text.substr(4);
    } else if (text.rfind("@@FATAL ", 0) == 0) {
      std::cout << "sac_fuzz: a child cannot run cases: " << text.substr(8) << std::endl;
      for (const auto& other : children_) kill(other.pid, SIGKILL);
      std::exit(2);
    } else if (text.rfind("@@R ", 0) == 0) {
      std::istringstream in(text.substr(4));
      uint64_t seed = 0;
      std::string kind, category;
      in >> seed >> kind;
      std::getline(in, category);
      if (!category.empty() && category[0] == ' ') category.erase(0, 1);
      c.finished.insert(seed);
      c.last_progress = std::chrono::steady_clock::now();
      result(c.job, seed, kind, category, c.details);
      c.details.clear();
    } else if (verbose_) {
      std::cout << "[child " << c.pid << "] " << text << "\n";
    }
  }

  // The replay of `job`'s case with the chunk's cases before it, in one process.
  static std::string sequence_replay(const Job& job, uint64_t seed) {
    std::string seeds;
    for (uint64_t s : job.before) seeds += std::to_string(s) + ",";
    return "  " + replay_env() + " sac_fuzz --replay " + seeds + std::to_string(seed);
  }

  void result(const Job& job, uint64_t seed, const std::string& kind, const std::string& category,
              const std::vector<std::string>& details) {
    const std::string alone = kind + (category.empty() ? "" : " (" + category + ")");
    if (job.kind == Job::Kind::CrashedInChunk) {
      // The case a chunk died in does not crash alone: the crash needs what
      // the cases before it left in the process.
      std::vector<std::string> detail{"FAILURE seed=" + std::to_string(seed) + " mechanism=" +
                                          mechanism_name() + " kind=crash-in-sequence",
                                      "  the child running this case in a chunk " + job.how +
                                          "; alone, the case's outcome is: " + alone,
                                      "  so it depends on the cases run before it in the same "
                                      "process; replay them in one process:",
                                      sequence_replay(job, seed), "  child stderr (tail):"};
      for (const auto& l : split_lines(first_lines(job.stderr_tail, 25)))
        detail.push_back("    " + l);
      for (const auto& l : details) detail.push_back(l);
      if (details.empty()) append_listing(seed, detail);
      record(seed, CaseOutcome::Fail, "crash-in-sequence", detail);
      return;
    }
    if (job.kind == Job::Kind::Recheck) {
      std::vector<std::string> detail = job.detail;
      if (kind == "fail") {
        detail.insert(detail.begin() + 1, "  reproduces alone in a fresh process");
        record(seed, CaseOutcome::Fail, job.category, detail);
      } else {
        detail.insert(detail.begin() + 1,
                      "  does NOT reproduce alone (alone: " + alone +
                          "): it depends on the cases run before it in the same "
                          "process; replay them in one process:");
        detail.insert(detail.begin() + 2, sequence_replay(job, seed));
        record(seed, CaseOutcome::Fail, job.category + " (in sequence only)", detail);
      }
      return;
    }
    const CaseOutcome::Kind k = kind == "pass"       ? CaseOutcome::Pass
                                : kind == "expected" ? CaseOutcome::Expected
                                : kind == "invalid"  ? CaseOutcome::Invalid
                                                     : CaseOutcome::Fail;
    if (k == CaseOutcome::Fail && job.kind == Job::Kind::Chunk && rechecks_ < kMaxRechecks) {
      // A failure may need what earlier cases left in the process (a policy
      // registered kernels, say): run it again alone to tell.
      ++rechecks_;
      Job recheck;
      recheck.seeds = {seed};
      recheck.kind = Job::Kind::Recheck;
      recheck.before = cases_before(job, seed);
      recheck.category = category;
      recheck.detail = details;
      retries_.push_back(std::move(recheck));
      return;
    }
    record(seed, k, category, details);
  }

  static std::vector<uint64_t> cases_before(const Job& job, uint64_t seed) {
    std::vector<uint64_t> before;
    for (uint64_t s : job.seeds) {
      if (s == seed) break;
      before.push_back(s);
    }
    return before;
  }

  void record(uint64_t seed, CaseOutcome::Kind kind, const std::string& category,
              const std::vector<std::string>& detail) {
    ++t_.cases;
    switch (kind) {
      case CaseOutcome::Pass:
        ++t_.passed;
        if (!category.empty()) ++t_.passed_by[category];
        break;
      case CaseOutcome::Expected:
        ++t_.expected;
        ++t_.expected_by[category];
        break;
      case CaseOutcome::Invalid:
        ++t_.invalid;
        ++t_.invalid_by[category];
        break;
      case CaseOutcome::Fail:
        ++t_.failed;
        ++t_.failed_by[category];
        t_.failing_seeds.push_back(seed);
        for (const auto& l : detail) std::cout << l << "\n";
        std::cout << std::endl;
        break;
    }
    if (verbose_)
      std::cout << "case " << seed << ": " << kind_name(kind) << " " << category << std::endl;
  }

  void finish(Child& c, int status) {
    const bool clean = !c.timed_out && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    std::vector<uint64_t> unfinished;
    for (uint64_t s : c.job.seeds) {
      if (!c.finished.count(s)) unfinished.push_back(s);
    }
    if (clean && unfinished.empty()) return;
    const std::string how = describe_status(status, c.timed_out);
    if (unfinished.empty()) {
      std::cout << "sac_fuzz: a child " << how << " after its last case\n"
                << first_lines(c.err_tail, 25) << "\n";
      return;
    }
    const uint64_t first = unfinished.front();
    if (c.job.kind != Job::Kind::Chunk) {
      // Alone in its process: this case crashes (or hangs) by itself.
      const std::string kind = c.timed_out ? "timeout" : "crash";
      std::vector<std::string> detail{"FAILURE seed=" + std::to_string(first) +
                                          " mechanism=" + mechanism_name() + " kind=" + kind,
                                      "  the child running this case alone " + how};
      if (c.job.kind == Job::Kind::CrashedInChunk) {
        detail.push_back("  (first seen in a chunk whose child " + c.job.how + ")");
      } else if (c.job.kind == Job::Kind::Recheck) {
        detail.push_back("  (in its chunk it failed without crashing: " + c.job.category + ")");
      }
      detail.push_back("  replay: " + replay_env() + " sac_fuzz --replay " + std::to_string(first));
      detail.push_back("  child stderr (tail):");
      for (const auto& l : split_lines(first_lines(c.err_tail, 25))) detail.push_back("    " + l);
      if (c.job.kind == Job::Kind::Recheck) {
        detail.insert(detail.end(), c.job.detail.begin(), c.job.detail.end());
      } else {
        append_listing(first, detail);
      }
      for (const auto& l : c.details) detail.push_back(l);
      record(first, CaseOutcome::Fail, kind, detail);
      return;
    }
    // Name the crashing case: the one that was running first, alone, with
    // what ran before it remembered; the rest of the chunk one per process.
    Job crashed;
    crashed.seeds = {first};
    crashed.kind = Job::Kind::CrashedInChunk;
    crashed.before = cases_before(c.job, first);
    crashed.how = how;
    crashed.stderr_tail = c.err_tail;
    retries_.push_back(std::move(crashed));
    for (size_t i = 1; i < unfinished.size(); ++i) {
      Job alone;
      alone.seeds = {unfinished[i]};
      alone.kind = Job::Kind::Alone;
      retries_.push_back(std::move(alone));
    }
  }

  uint64_t base_seed_;
  std::optional<size_t> cases_;
  std::optional<double> seconds_;
  int jobs_;
  bool verbose_;
  std::string exe_display_;
  size_t chunk_ = kChunkSize;
  size_t next_index_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  std::deque<Job> retries_;
  size_t rechecks_ = 0;
  std::vector<Child> children_;
  Tally t_;
};

[[noreturn]] void usage(const std::string& problem) {
  std::cerr
      << "sac_fuzz: " << problem << "\n"
      << "usage: sac_fuzz [--cases N] [--seed S] [--jobs J] [--replay SEED[,SEED...]] [--verbose]\n"
      << "env: SAC_FUZZ_CASES, SAC_FUZZ_SECONDS, SAC_DISPATCH=per_op|fallback|auto\n";
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  size_t cases = 500;
  uint64_t seed = 1;
  int jobs = std::max(1u, std::thread::hardware_concurrency());
  bool verbose = false;
  std::optional<std::string> replay, child;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) usage(arg + " needs a value");
        return argv[++i];
      };
      if (arg == "--cases") cases = std::stoull(value());
      else if (arg == "--seed") seed = std::stoull(value());
      else if (arg == "--jobs") jobs = std::max(1, std::stoi(value()));
      else if (arg == "--replay") replay = value();
      else if (arg == "--child") child = value();
      else if (arg == "--verbose") verbose = true;
      else usage("unknown argument " + arg);
    }
  } catch (const std::logic_error&) {
    usage("bad number");
  }
  if (child) return child_main(parse_seeds(*child), verbose);
  if (replay) {
    try {
      return replay_main(parse_seeds(*replay), verbose);
    } catch (const std::exception& e) {  // a bad SAC_DISPATCH, say
      std::cerr << "sac_fuzz: " << e.what() << "\n";
      return 2;
    }
  }

  std::optional<double> seconds;
  if (const char* env = std::getenv("SAC_FUZZ_CASES")) cases = std::stoull(env);
  if (const char* env = std::getenv("SAC_FUZZ_SECONDS")) seconds = std::stod(env);
  return Parent(seed, seconds ? std::nullopt : std::optional<size_t>(cases), seconds, jobs, verbose)
      .run();
}
