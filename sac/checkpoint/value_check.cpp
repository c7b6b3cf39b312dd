#include <sac/checkpoint/internal/value_check.h>

#include <sac/base/internal/storage_key.h>
#include <sac/checkpoint/internal/callback_stack.h>
#include <sac/dispatch/internal/boxed.h>
#include <sac/dispatch/internal/interceptor.h>
#include <sac/policy/internal/op_traits.h>

#include <ATen/Functions.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <c10/core/StorageImpl.h>

#include <atomic>
#include <cstring>
#include <iomanip>
#include <memory>
#include <sstream>

namespace sac::detail {
namespace {

std::atomic<bool> with_tensor_ops{false};

// xxHash64's round, in four lanes over 32-byte blocks: fast enough to run on
// every saved tensor, and every input bit reaches the sum.
class Hasher {
 public:
  void update(const char* data, size_t n) {
    while (n > 0) {
      const size_t take = std::min(n, sizeof(block_) - filled_);
      std::memcpy(reinterpret_cast<char*>(block_) + filled_, data, take);
      filled_ += take;
      data += take;
      n -= take;
      if (filled_ == sizeof(block_)) {
        for (int i = 0; i < 4; ++i) {
          lanes_[i] = round(lanes_[i], block_[i]);
        }
        filled_ = 0;
      }
    }
  }

  uint64_t digest() {
    std::memset(reinterpret_cast<char*>(block_) + filled_, 0, sizeof(block_) - filled_);
    uint64_t h = filled_;
    for (int i = 0; i < 4; ++i) {
      h = round(h ^ lanes_[i], block_[i]);
    }
    h ^= h >> 33;
    h *= 0xC2B2AE3D27D4EB4Full;
    h ^= h >> 29;
    return h;
  }

 private:
  static uint64_t round(uint64_t lane, uint64_t word) {
    lane += word * 0xC2B2AE3D27D4EB4Full;
    lane = (lane << 31) | (lane >> 33);
    return lane * 0x9E3779B185EBCA87ull;
  }
  uint64_t lanes_[4] = {1, 2, 3, 4};
  uint64_t block_[4] = {};
  size_t filled_ = 0;
};

// Hashes a strided CPU tensor's elements in order, the innermost dimension's
// runs in one piece where its stride is 1.
uint64_t hash_cpu(const at::Tensor& t) {
  Hasher hasher;
  const auto* base = static_cast<const char*>(t.const_data_ptr());
  const size_t element = t.element_size();
  const int64_t dims = t.dim();
  if (t.is_contiguous() || dims == 0) {
    hasher.update(base, t.numel() * element);
    return hasher.digest();
  }
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  const bool run = strides[dims - 1] == 1;
  std::vector<int64_t> index(dims, 0);
  while (true) {
    int64_t offset = 0;
    for (int64_t d = 0; d < dims; ++d) {
      offset += index[d] * strides[d];
    }
    if (run) {
      hasher.update(base + offset * element, sizes[dims - 1] * element);
    } else {
      for (int64_t i = 0; i < sizes[dims - 1]; ++i) {
        hasher.update(base + (offset + i * strides[dims - 1]) * element, element);
      }
    }
    int64_t d = dims - 2;
    while (d >= 0 && ++index[d] == sizes[d]) {
      index[d--] = 0;
    }
    if (d < 0) {
      return hasher.digest();
    }
  }
}

// On the tensor's device: its bits as integers, each mixed with its position
// (a multiply-xorshift, wrapping in int64), summed under two different
// mixes: integer sums, so the order of a parallel reduction does not matter.
// No sac mode, observer, op log or profiler sees these ops.
at::Tensor mixed(const at::Tensor& v, int64_t multiplier) {
  at::Tensor h = at::bitwise_xor(v, at::bitwise_right_shift(v, 31)).mul_(multiplier);
  return at::bitwise_xor(h, at::bitwise_right_shift(h, 29));
}

at::Tensor hash_with_ops(const at::Tensor& t) {
  dispatch::IsolationGuard isolate;
  at::NoGradGuard no_grad;
  at::DisableRecordFunctionGuard unrecorded;
  at::Tensor flat = (t.is_complex() ? at::view_as_real(t) : t).contiguous().view({-1});
  if (flat.scalar_type() == at::kBool) {
    flat = flat.view(at::kByte);
  }
  const int64_t bytes = flat.numel() * static_cast<int64_t>(flat.element_size());
  const c10::ScalarType as = bytes % 8 == 0   ? at::kLong
                             : bytes % 4 == 0 ? at::kInt
                             : bytes % 2 == 0 ? at::kShort
                                              : at::kByte;
  const at::Tensor bits = flat.view(as).to(at::kLong);
  const at::Tensor placed =
      at::arange(bits.numel(), bits.options()).mul_(int64_t{0x9E3779B97F4A7C15 >> 1}).add_(bits);
  return at::stack({mixed(placed, int64_t{0x2545F4914F6CDD1D}).sum(),
                    mixed(placed, int64_t{0x5851F42D4C957F2D}).sum()});
}

}  // namespace

void checksum_with_tensor_ops_for_testing(bool on) { with_tensor_ops = on; }

ValueChecksum ValueChecksum::of(const at::Tensor& t) {
  ValueChecksum sum;
  if (!t.defined() || t.layout() != at::kStrided || t.is_meta() || !t.has_storage()) {
    return sum;
  }
  sum.empty_ = false;
  if (t.device().is_cpu() && !with_tensor_ops) {
    sum.host_ = hash_cpu(t);
  } else {
    sum.device_ = hash_with_ops(t);
  }
  return sum;
}

bool ValueChecksum::matches(const ValueChecksum& other) const {
  if (empty_ || other.empty_) {
    return true;
  }
  if (device_.defined() != other.device_.defined()) {
    return false;
  }
  if (!device_.defined()) {
    return host_ == other.host_;
  }
  if (device_.device() != other.device_.device()) {
    return false;
  }
  dispatch::IsolationGuard isolate;
  at::DisableRecordFunctionGuard unrecorded;
  return at::equal(device_, other.device_);
}

std::string ValueChecksum::str() const {
  if (empty_) {
    return "none";
  }
  std::ostringstream out;
  out << std::hex << std::setfill('0');
  if (!device_.defined()) {
    out << std::setw(16) << host_;
    return out.str();
  }
  dispatch::IsolationGuard isolate;
  at::DisableRecordFunctionGuard unrecorded;
  const at::Tensor host = device_.cpu();
  out << std::setw(16) << static_cast<uint64_t>(host[0].item<int64_t>()) << ":" << std::setw(16)
      << static_cast<uint64_t>(host[1].item<int64_t>());
  return out.str();
}

namespace {

std::unique_ptr<at::ObserverContext> on_origin_start(const at::RecordFunction& fn);
void on_origin_end(const at::RecordFunction& fn, at::ObserverContext*);

thread_local CallbackStack<OpOrigins*> tls_origins(
    at::RecordFunctionCallback(&on_origin_start, &on_origin_end)
        .needsOutputs(true)
        .scopes({at::RecordScope::FUNCTION}));

std::unique_ptr<at::ObserverContext> on_origin_start(const at::RecordFunction& fn) {
  for (OpOrigins* origins : tls_origins.items()) {
    origins->note_running(fn.name());
  }
  return nullptr;
}

void on_origin_end(const at::RecordFunction& fn, at::ObserverContext*) {
  for (OpOrigins* origins : tls_origins.items()) {
    origins->note_outputs(fn.name(), fn.operator_name(), fn.outputs());
  }
}

}  // namespace

void OpOrigins::note_running(const char* op) { running_.emplace_back(op); }

void OpOrigins::note_outputs(const char* op, const std::optional<c10::OperatorName>& name,
                             const std::vector<c10::IValue>& outputs) {
  if (!running_.empty()) {
    running_.pop_back();
  }
  auto [it, first] = ops_.try_emplace(op);
  Op& seen = it->second;
  if (first) {
    const auto handle =
        name.has_value() ? c10::Dispatcher::singleton().findOp(*name) : std::nullopt;
    seen.view = handle.has_value() && handle->hasSchema() && policy::is_view(*handle);
  }
  const size_t call = seen.calls++;
  if (seen.view) {
    return;  // its storage keeps the origin it had (none: a view of an outside tensor)
  }
  for (const c10::IValue& output : outputs) {
    dispatch::for_each_tensor(output, [&](const at::Tensor& t) {
      if (const c10::StorageImpl* storage = storage_key(t)) {
        by_storage_[storage] = {op, call};
      }
    });
  }
}

SavedOrigin OpOrigins::of(const at::Tensor& saved) const {
  SavedOrigin origin;
  const auto it = by_storage_.find(storage_key(saved));
  if (it != by_storage_.end()) {
    origin.made = it->second;
  }
  if (!running_.empty()) {
    origin.saver = running_.back();
  }
  return origin;
}

std::string SavedOrigin::describe() const {
  std::string out =
      made.has_value()
          ? "made by " + made->op + " (its call " + std::to_string(made->call) + " in the region)"
          : "not made in the region (an input, a parameter, a buffer or a constant)";
  return saver.empty() ? out : out + ", saved for backward by " + saver;
}

OriginScope::OriginScope(OpOrigins& origins) { tls_origins.push(&origins); }

OriginScope::~OriginScope() { tls_origins.pop(); }

}  // namespace sac::detail
