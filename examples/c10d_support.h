// Multi-process training from C++ on LibTorch's own c10d: what the
// distributed examples and tests share.
//
//   * `Rendezvous`: rank, world size and master address from the variables
//     torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT),
//     and a TCPStore on them. examples/launch_ranks.sh sets them on one
//     machine; on several, set them as torchrun would.
//   * `Group`: a c10d ProcessGroup with a Gloo backend, registered by name so
//     that the functional collectives (_c10d_functional::*) find it. Its
//     backend counts the collectives it is asked to run: the count is what
//     went over the wire, whatever sac's cache believes.
//   * The functional collectives, called through the dispatcher, where sac's
//     modes see them, and autograd Functions around them: `AllGather` (FSDP's
//     unshard: backward reduce-scatters the gradient) and `SumOverRanks`
//     (all-reduce: backward all-reduces the gradient).
//   * `GradientAllReduce`: DDP's reducer in small: gradients averaged over
//     the ranks by bucketed all-reduces launched from autograd hooks while
//     backward still runs.
//
// Gloo on CPU only: ProcessGroupNCCL needs a CUDA build of LibTorch (the
// project pins the CPU wheel); the code paths here are the same with it.
//
// Building against ProcessGroupGloo.hpp needs Gloo's headers, which the
// torch wheel does not ship: Debian's libgloo-dev provides them
// (.ci/install). Only declarations are used; the Gloo code that runs is the
// one inside libtorch_cpu.
#pragma once

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace sac_examples::dist {

// ---- Rendezvous -----------------------------------------------------------

struct Rendezvous {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  std::string master_addr;
  int master_port = 0;
  c10::intrusive_ptr<c10d::Store> store;
};

inline std::string env_or_throw(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    throw std::invalid_argument(
        std::string(name) + " is not set: start the ranks with examples/launch_ranks.sh, or "
                            "set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT as torchrun does");
  }
  return value;
}

// Reads torchrun's variables and meets the other ranks at MASTER_ADDR:
// rank 0 serves the TCPStore. Waits at most `timeout` for all of them.
inline Rendezvous rendezvous_from_env(std::chrono::milliseconds timeout) {
  Rendezvous r;
  r.rank = std::stoi(env_or_throw("RANK"));
  r.world = std::stoi(env_or_throw("WORLD_SIZE"));
  const char* local = std::getenv("LOCAL_RANK");
  r.local_rank = local != nullptr ? std::stoi(local) : r.rank;
  r.master_addr = env_or_throw("MASTER_ADDR");
  r.master_port = std::stoi(env_or_throw("MASTER_PORT"));
  if (r.world < 1 || r.rank < 0 || r.rank >= r.world) {
    throw std::invalid_argument("RANK must be in [0, WORLD_SIZE); found RANK=" +
                                std::to_string(r.rank) + ", WORLD_SIZE=" + std::to_string(r.world));
  }
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(r.master_port);
  options.isServer = r.rank == 0;
  options.numWorkers = r.world;
  options.timeout = timeout;
  r.store = c10::make_intrusive<c10d::TCPStore>(r.master_addr, options);
  return r;
}

// ---- A counting Gloo backend ------------------------------------------------

// ProcessGroupGloo that counts the collectives it is asked to run. Only the
// outermost call counts: Gloo implements some collectives with others
// (all_gather_into_tensor runs allgather_coalesced).
class CountingGloo final : public c10d::ProcessGroupGloo {
 public:
  using ProcessGroupGloo::ProcessGroupGloo;

  int64_t issued() const { return issued_.load(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    return counted([&] { return ProcessGroupGloo::broadcast(tensors, opts); });
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    return counted([&] { return ProcessGroupGloo::allreduce(tensors, opts); });
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    return counted([&] { return ProcessGroupGloo::allreduce_coalesced(tensors, opts); });
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    return counted([&] { return ProcessGroupGloo::_allgather_base(output, input, opts); });
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    return counted([&] { return ProcessGroupGloo::allgather(outputs, inputs, opts); });
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    return counted([&] { return ProcessGroupGloo::allgather_coalesced(outputs, inputs, opts); });
  }
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    return counted(
        [&] { return ProcessGroupGloo::allgather_into_tensor_coalesced(outputs, inputs, opts); });
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    return counted([&] { return ProcessGroupGloo::_reduce_scatter_base(output, input, opts); });
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    return counted([&] { return ProcessGroupGloo::reduce_scatter(outputs, inputs, opts); });
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    return counted(
        [&] { return ProcessGroupGloo::reduce_scatter_tensor_coalesced(outputs, inputs, opts); });
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_counts,
                                               std::vector<int64_t>& input_counts,
                                               const c10d::AllToAllOptions& opts) override {
    return counted([&] {
      return ProcessGroupGloo::alltoall_base(output, input, output_counts, input_counts, opts);
    });
  }

 private:
  template <typename Call>
  c10::intrusive_ptr<c10d::Work> counted(Call call) {
    if (depth_ == 0) {
      ++issued_;
    }
    ++depth_;
    struct Leave {
      ~Leave() { --depth_; }
    } leave;
    return call();
  }

  // One per thread, shared by every collective (not one per instantiation
  // of counted).
  inline static thread_local int depth_ = 0;
  std::atomic<int64_t> issued_{0};
};

// ---- Groups -----------------------------------------------------------------

// A process group over all ranks, registered under `name` for the functional
// collectives. Collectives that fail to complete within `timeout` throw
// (a rank that died makes the others fail, not hang).
struct Group {
  std::string name;
  int rank = 0;
  int world = 1;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  c10::intrusive_ptr<CountingGloo> gloo;

  int64_t issued() const { return gloo->issued(); }
};

inline Group make_group(const Rendezvous& r, const std::string& name,
                        std::chrono::milliseconds timeout) {
  // Each group rendezvouses under its own key prefix in the one store.
  auto store = c10::make_intrusive<c10d::PrefixStore>(name, r.store);
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(r.master_addr));
  Group g{name, r.rank, r.world, c10::make_intrusive<c10d::ProcessGroup>(store, r.rank, r.world),
          c10::make_intrusive<CountingGloo>(store, r.rank, r.world, options)};
  g.pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, g.gloo);
  g.pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  c10d::register_process_group(name, g.pg);
  return g;
}

// ---- Functional collectives, through the dispatcher -------------------------
//
// Each returns at once with the collective in flight; wait_tensor(result)
// waits for it. Issue them with grad mode off (the autograd Functions below
// do): Gloo's workers run under the caller's grad mode, and its all-gather
// copies into views that autograd then refuses to write.

inline c10::OperatorHandle functional_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

// Calls a functional collective boxed: their schemas change between releases
// (torch 2.15 made all_reduce's reduce_op and group_name `Any`, where 2.13
// and 2.14 have `str` and `Any`), and a boxed call takes the same IValues
// under either, where a typed call fails at run time on a signature that is
// not the schema's.
template <typename... Args>
at::Tensor call_functional(const c10::OperatorHandle& op, Args&&... args) {
  torch::jit::Stack stack{c10::IValue(std::forward<Args>(args))...};
  op.callBoxed(stack);
  return stack.back().toTensor();
}

inline at::Tensor all_reduce(const at::Tensor& input, const std::string& reduce_op,
                             const std::string& group) {
  static const auto op = functional_op("_c10d_functional::all_reduce");
  return call_functional(op, input, reduce_op, group);
}

inline at::Tensor all_gather_into_tensor(const at::Tensor& input, int64_t group_size,
                                         const std::string& group) {
  static const auto op = functional_op("_c10d_functional::all_gather_into_tensor");
  return call_functional(op, input, group_size, group);
}

inline at::Tensor reduce_scatter_tensor(const at::Tensor& input, const std::string& reduce_op,
                                        int64_t group_size, const std::string& group) {
  static const auto op = functional_op("_c10d_functional::reduce_scatter_tensor");
  return call_functional(op, input, reduce_op, group_size, group);
}

inline at::Tensor wait_tensor(const at::Tensor& tensor) {
  static const auto op = functional_op("_c10d_functional::wait_tensor");
  return call_functional(op, tensor);
}

// ---- Autograd Functions -----------------------------------------------------

// The FSDP unshard: the ranks' 1-D shards concatenated, in rank order, on
// every rank (through `group`). Backward reduce-scatters the gradient through
// `grad_group` and averages it over the ranks, which is what data-parallel
// training does with the gradient of a replicated parameter.
struct AllGather : torch::autograd::Function<AllGather> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& shard,
                            const Group* group, const Group* grad_group) {
    ctx->saved_data["grad_group"] = grad_group->name;
    ctx->saved_data["world"] = static_cast<int64_t>(grad_group->world);
    return wait_tensor(all_gather_into_tensor(shard.contiguous(), group->world, group->name));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const int64_t world = ctx->saved_data["world"].toInt();
    auto sum = wait_tensor(reduce_scatter_tensor(grads[0].contiguous(), "sum", world,
                                                 ctx->saved_data["grad_group"].toStringRef()));
    return {sum.div_(static_cast<double>(world)), at::Tensor(), at::Tensor()};
  }
};

// The sum over the ranks of each rank's `input` (through `group`). Backward:
// every rank's input contributed to every rank's output, so its gradient is
// the sum over the ranks of the output's gradients (through `grad_group`).
struct SumOverRanks : torch::autograd::Function<SumOverRanks> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const Group* group, const Group* grad_group) {
    ctx->saved_data["grad_group"] = grad_group->name;
    return wait_tensor(all_reduce(input.contiguous(), "sum", group->name));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {wait_tensor(all_reduce(grads[0].contiguous(), "sum",
                                   ctx->saved_data["grad_group"].toStringRef())),
            at::Tensor(), at::Tensor()};
  }
};

// ---- Data-parallel gradients --------------------------------------------------

// Averages the gradients of `params` over the ranks of `group`, as DDP does:
// the parameters are packed, in reverse order (roughly the order backward
// produces their gradients), into buckets of about `bucket_bytes`; a hook on
// each parameter copies its gradient into its bucket, and the bucket's
// all-reduce starts as soon as its last gradient arrives, while backward goes
// on. `finish()` waits for them and writes the averages into `.grad()`.
// The hooks stay on the parameters: the object must outlive every backward
// through them.
class GradientAllReduce {
 public:
  GradientAllReduce(std::vector<at::Tensor> params, const Group& group, int64_t bucket_bytes)
      : params_(std::move(params)), group_(group) {
    Bucket* bucket = nullptr;
    int64_t bytes = 0;
    for (size_t i = params_.size(); i-- > 0;) {
      const at::Tensor& p = params_[i];
      if (bucket == nullptr || bytes >= bucket_bytes) {
        buckets_.emplace_back();
        bucket = &buckets_.back();
        bytes = 0;
      }
      slots_.push_back({buckets_.size() - 1, bucket->numel, i});
      bucket->numel += p.numel();
      ++bucket->params;
      bytes += static_cast<int64_t>(p.nbytes());
    }
    for (auto& b : buckets_) {
      b.flat = torch::zeros({b.numel}, params_.front().options().requires_grad(false));
    }
    for (const Slot& slot : slots_) {
      params_[slot.param].register_hook(
          [this, slot](const at::Tensor& grad) { arrived(slot, grad); });
    }
  }

  // Waits for every bucket's all-reduce and sets each parameter's gradient to
  // the average over the ranks. Buckets whose parameters got no gradient in
  // this backward are all-reduced here, so every rank issues the same ones.
  void finish() {
    for (auto& b : buckets_) {
      if (!b.work) {
        launch(b);
      }
    }
    for (auto& b : buckets_) {
      b.work->wait();
      b.flat.div_(static_cast<double>(group_.world));
    }
    for (const Slot& slot : slots_) {
      at::Tensor& p = params_[slot.param];
      const auto avg = buckets_[slot.bucket].flat.narrow(0, slot.offset, p.numel()).view_as(p);
      if (p.grad().defined()) {
        p.mutable_grad().copy_(avg);
      } else {
        p.mutable_grad() = avg.clone();
      }
    }
    for (auto& b : buckets_) {
      b.work.reset();
      b.arrived = 0;
      b.flat.zero_();
    }
  }

  int64_t buckets() const { return static_cast<int64_t>(buckets_.size()); }

 private:
  struct Bucket {
    at::Tensor flat;
    int64_t numel = 0;
    int64_t params = 0;
    int64_t arrived = 0;
    c10::intrusive_ptr<c10d::Work> work;
  };
  struct Slot {
    size_t bucket;
    int64_t offset;
    size_t param;
  };

  void arrived(const Slot& slot, const at::Tensor& grad) {
    Bucket& b = buckets_[slot.bucket];
    b.flat.narrow(0, slot.offset, grad.numel()).copy_(grad.reshape({-1}));
    if (++b.arrived == b.params) {
      launch(b);
    }
  }

  void launch(Bucket& b) {
    std::vector<at::Tensor> tensors = {b.flat};
    b.work = group_.pg->allreduce(tensors);
  }

  std::vector<at::Tensor> params_;
  const Group& group_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;
};

}  // namespace sac_examples::dist
