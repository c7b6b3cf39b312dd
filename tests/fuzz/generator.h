// Programs from a seed.
#pragma once

#include "limits.h"
#include "ops.h"
#include "program.h"

namespace {

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
    if (coin(0.2)) {
      p_.backward = choice({Program::Backward::Twice, Program::Backward::SecondLoss,
                            Program::Backward::SecondOrder});
    } else if (coin(0.3)) {
      p_.loop = choice({Program::Loop::LeftInGrad, Program::Loop::ZeroedGrad,
                        Program::Loop::Accumulate, Program::Loop::Adam});
    }
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
        {"buffer", 5, &Generator::buffer},
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
    switch (uniform(0, 5)) {
      case 0: {
        const int a = canonical_value();
        reshape(a, shape(a) == s2() ? s3() : s2());
        break;
      }
      case 5: {
        // Two views of one base (the shape of splitting heads or a batch),
        // which a region may take as two arguments.
        const int a = pick(find([](const Value& v) {
          return !v.shape.empty() && v.shape.back() >= 2 && v.leaf != Leaf::Buffer;
        }));
        auto first = shape(a), second = shape(a);
        first.back() = (shape(a).back() + 1) / 2;
        second.back() = shape(a).back() - first.back();
        // Outputs of one multi-output view: autograd refuses in-place ops on
        // them, and on their base while they are used.
        Value one = view_of(a, first, false), other = view_of(a, second, false);
        one.no_inplace = other.no_inplace = true;
        p_.values[a].no_inplace = true;
        emit(Op::Chunk, {a}, {one, other});
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
      // 5-8: an in-place op that saves its output, on a view (a double
      // backward unpacks it twice); 9-12: a random op drawing in place (the
      // value check compares what it drew); 13: a catch of std::exception
      // around ops early stop may stop in.
      const int a = any_float(), variant = uniform(0, 13);
      std::vector<int> in{a};
      if (variant == 0) in.push_back(operand_for(a));
      bool grad = false;
      for (int id : in) grad |= val(id).requires_grad;
      const int out = emit(Op::FreshInplace, in, {fval(shape(a), grad, contig({a}))}, {variant});
      if (variant == 2 || variant == 4 || (variant >= 5 && variant <= 8)) {
        saves(out, {out});  // relu_, sigmoid_, exp_, tanh_
      }
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
    // Written whole, then read, in any region (FSDP's gathered parameters, a
    // scratch buffer): a guard region keeps none of its memory, the replay
    // makes it anew; a function region's rerun writes it again.
    // Whole (copy_, through a view, an out= op, with grad) or in part (a row):
    // the recomputation writes it again (Note [Rewritten by a recomputation]).
    // With grad or by an out= op, one or the other per program: an out= op
    // refuses a buffer that has a history (the next iteration's).
    const int a = any_float();
    if (buffer_with_grad_ < 0) buffer_with_grad_ = coin(0.3);
    const int64_t how = choice<int64_t>({0, 1, buffer_with_grad_ ? 3 : 2, 4});
    emit(Op::BufferOverwrite, {p_.buffer, a},
         {fval(shape(a), rg({a}) || how == 3, val(a).contiguous)}, {how});
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

  // Whether a recomputation that reruns `op` would change what the buffer
  // held when the forward read it. A buffer written whole before it is read
  // is not: a function's rerun writes it again before reading it (Note
  // [Overwritten before read]), a guard region's replay writes memory of its
  // own.
  static bool writes_buffer_again(Op op) { return op == Op::BufferMutate; }

  // Whether a region over steps [b, e) would, recomputed in the backward,
  // overwrite what later steps wrote to the buffer: a function's rerun
  // writes the buffer again, as PyTorch's checkpoint does (docs/limits.md),
  // and the next iteration would start from the rerun's buffer.
  bool rerun_overwrites_later_writes(int b, int e) const {
    if (regions_as() == RegionsAs::Guard) return false;
    bool overwrites = false;
    for (int i = b; i < e; ++i) overwrites |= p_.steps[i].op == Op::BufferOverwrite;
    for (size_t i = e; overwrites && i < p_.steps.size(); ++i) {
      if (p_.steps[i].op == Op::BufferMutate || p_.steps[i].op == Op::BufferOverwrite) return true;
    }
    return false;
  }

  // Up to `count` disjoint step ranges inside [lo, hi), never across a
  // buffer mutation a recomputation would apply again.
  void place_regions(int lo, int hi, int parent, int depth, int count) {
    std::vector<std::pair<int, int>> chosen;
    for (int attempt = 0; attempt < 20 && static_cast<int>(chosen.size()) < count; ++attempt) {
      const int b = uniform(lo, hi - 1), e = uniform(b + 1, hi);
      bool ok = true;
      for (int i = b; i < e && ok; ++i) ok = !writes_buffer_again(p_.steps[i].op);
      ok = ok && !rerun_overwrites_later_writes(b, e);
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
  std::set<int> saved_;        // storages autograd keeps for backward
  int buffer_with_grad_ = -1;  // whether BufferOverwrite writes with grad (-1: undecided)
};

Program generate(uint64_t seed) { return Generator(seed, save_op_names().accepted).generate(); }

}  // namespace
