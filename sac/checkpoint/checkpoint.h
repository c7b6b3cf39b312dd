// sac::checkpoint: non-reentrant activation checkpointing, optionally
// selective.
#pragma once

#include <sac/base/error.h>
#include <sac/checkpoint/options.h>
#include <sac/checkpoint/scope.h>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace sac {

// Runs `fn(args...)` without keeping what autograd saves inside it: each
// saved tensor is recomputed, by running `fn` again, when the backward pass
// first needs one. With `options.policy(...)`, the outputs of the op calls the
// policy saves are kept instead and served to the recomputation.
//
// `fn` may return anything (a Tensor, a tuple, a vector of Tensors, ...). It is
// copied and kept until the graph is freed, as are `args`, except tensors:
// at::Tensor, std::optional<at::Tensor> and std::vector<at::Tensor> arguments
// are saved the way autograd saves inputs, and modifying one in place before
// backward is an error. Keep objects that must not be copied (modules) in
// `fn`'s captures, or pass std::ref. `fn` is called again in backward, after
// the caller has returned: what it captures by reference must outlive the
// backward (a lambda `[&]` over the locals of a custom Function's forward
// reads freed memory then; pass them as arguments instead).
//
// Under no_grad, `fn(args...)` just runs. Errors in recomputation are
// sac::CheckpointError (a c10::Error).
template <class Fn, class... Args>
auto checkpoint(const CheckpointOptions& options, Fn&& fn, Args&&... args);

// Full recomputation with default options.
template <class Fn, class... Args,
          std::enable_if_t<!std::is_same_v<std::decay_t<Fn>, CheckpointOptions>, int> = 0>
auto checkpoint(Fn&& fn, Args&&... args) {
  return checkpoint(detail::scoped_options(), std::forward<Fn>(fn), std::forward<Args>(args)...);
}

// ---- Implementation ---------------------------------------------------------

namespace detail {

// Whether a region with `options` runs plainly, not checkpointed: under
// no_grad, where its plan leaves it unchecked (Policy::checkpoints), and
// while sac::measure_step_phases measures the plain step.
bool runs_plainly(const CheckpointOptions& options);

// Runs the checkpointed function on recomputed inputs (the tensor inputs in
// the order they were collected), discarding its result.
using RecomputeFn = std::function<void(const std::vector<at::Tensor>& inputs)>;

// One region's forward: sets up the frame, saves the inputs, and
// keeps the forward hooks and context active until destroyed.
class RegionForward {
 public:
  RegionForward(const CheckpointOptions& options, const std::vector<at::Tensor>& inputs,
                RecomputeFn recompute);
  ~RegionForward();
  // The function returned normally.
  void forward_completed();

 private:
  struct Active;
  std::unique_ptr<Active> active_;
};

// How an argument of the checkpointed function is kept for recomputation.
// Non-tensor arguments are copied.
template <class T>
struct ArgCodec {
  static_assert(!std::is_same_v<T, at::TensorList> && !std::is_same_v<T, c10::ArrayRef<int64_t>>,
                "sac::checkpoint: an ArrayRef argument would dangle by the time "
                "the function is recomputed; pass a std::vector instead.");
  using Captured = T;
  static void collect(const T&, std::vector<at::Tensor>&) {}
  static Captured capture(const T& value) { return value; }
  static const T& restore(const Captured& captured, const std::vector<at::Tensor>&, size_t&) {
    return captured;
  }
};

struct NoTensor {};

template <>
struct ArgCodec<at::Tensor> {
  using Captured = NoTensor;
  static void collect(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
  static Captured capture(const at::Tensor&) { return {}; }
  static at::Tensor restore(const Captured&, const std::vector<at::Tensor>& in, size_t& next) {
    return in[next++];
  }
};

template <>
struct ArgCodec<std::optional<at::Tensor>> {
  using Captured = NoTensor;
  static void collect(const std::optional<at::Tensor>& t, std::vector<at::Tensor>& out) {
    out.push_back(t.has_value() ? *t : at::Tensor());
  }
  static Captured capture(const std::optional<at::Tensor>&) { return {}; }
  static std::optional<at::Tensor> restore(const Captured&, const std::vector<at::Tensor>& in,
                                           size_t& next) {
    const at::Tensor& t = in[next++];
    return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
  }
};

template <>
struct ArgCodec<std::vector<at::Tensor>> {
  using Captured = size_t;
  static void collect(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out) {
    out.insert(out.end(), ts.begin(), ts.end());
  }
  static Captured capture(const std::vector<at::Tensor>& ts) { return ts.size(); }
  static std::vector<at::Tensor> restore(const Captured& count, const std::vector<at::Tensor>& in,
                                         size_t& next) {
    std::vector<at::Tensor> out(in.begin() + next, in.begin() + next + count);
    next += count;
    return out;
  }
};

template <class Fn, class... Args>
RecomputeFn make_recompute(Fn fn, const Args&... args) {
  return [fn = std::move(fn), captured = std::make_tuple(ArgCodec<Args>::capture(args)...)](
             const std::vector<at::Tensor>& inputs) mutable {
    std::apply(
        [&](const auto&... each) {
          size_t next = 0;
          // Braced initialization evaluates left to right, as the inputs
          // were collected.
          std::tuple<decltype(ArgCodec<Args>::restore(each, inputs, next))...> restored{
              ArgCodec<Args>::restore(each, inputs, next)...};
          std::apply(fn, restored);
        },
        captured);
  };
}

}  // namespace detail

template <class Fn, class... Args>
auto checkpoint(const CheckpointOptions& options, Fn&& fn, Args&&... args) {
  using Result = std::invoke_result_t<std::decay_t<Fn>&, Args&&...>;
  static_assert(!std::is_void_v<Result>,
                "sac::checkpoint: the checkpointed function must return its "
                "outputs (a Tensor, a tuple or a vector of Tensors)");
  if (detail::runs_plainly(options)) {
    return std::invoke(fn, std::forward<Args>(args)...);
  }
  std::vector<at::Tensor> inputs;
  (detail::ArgCodec<std::decay_t<Args>>::collect(args, inputs), ...);
  detail::RegionForward forward(options, inputs,
                                detail::make_recompute<std::decay_t<Fn>, std::decay_t<Args>...>(
                                    std::decay_t<Fn>(fn), args...));
  Result result = std::invoke(fn, std::forward<Args>(args)...);
  forward.forward_completed();
  return result;
}

}  // namespace sac
