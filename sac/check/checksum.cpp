#include <sac/check/internal/checksum.h>

#include <sac/dispatch/internal/interceptor.h>

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <unordered_map>

namespace sac::detail {
namespace {

std::atomic<bool> with_tensor_ops{false};

// xxHash64's round, in four lanes over 32-byte blocks: fast enough to run on
// every saved tensor, and every input bit reaches the sum.
class Hasher {
 public:
  void update(const char* data, size_t n) {
    if (filled_ == 0) {
      // Whole blocks straight from the data: each lane's word loaded in
      // place (a memcpy of 8 bytes is one load), no staging copy.
      for (; n >= sizeof(block_); data += sizeof(block_), n -= sizeof(block_)) {
        for (int i = 0; i < 4; ++i) {
          uint64_t word;
          std::memcpy(&word, data + 8 * i, 8);
          lanes_[i] = round(lanes_[i], word);
        }
      }
    }
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

// While alive, the ops the check runs itself are seen by no sac mode,
// observer or op log, no profiler or RecordFunction callback, and autograd.
struct Unseen {
  detail::IsolationGuard isolate;
  at::NoGradGuard no_grad;
  at::DisableRecordFunctionGuard unrecorded;
};

// A contiguous copy made by an op that nothing sees.
at::Tensor hidden_contiguous(const at::Tensor& t) {
  const Unseen unseen;
  return t.contiguous();
}

// Hashes a strided CPU tensor's elements in order: contiguous memory in one
// piece, the innermost dimension's runs where its stride is 1 and they are
// long. Others (a transposed weight, as addmm saves it) are copied
// contiguous first: element by element they hashed at a tenth of the speed.
uint64_t hash_cpu(const at::Tensor& t) {
  Hasher hasher;
  const size_t element = t.element_size();
  const int64_t dims = t.dim();
  if (t.is_contiguous() || dims == 0) {
    hasher.update(static_cast<const char*>(t.const_data_ptr()), t.numel() * element);
    return hasher.digest();
  }
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  if (strides[dims - 1] != 1 || sizes[dims - 1] * element < 256) {
    const at::Tensor copy = hidden_contiguous(t);
    hasher.update(static_cast<const char*>(copy.const_data_ptr()), copy.numel() * element);
    return hasher.digest();
  }
  const auto* base = static_cast<const char*>(t.const_data_ptr());
  std::vector<int64_t> index(dims, 0);
  while (true) {
    int64_t offset = 0;
    for (int64_t d = 0; d < dims; ++d) {
      offset += index[d] * strides[d];
    }
    hasher.update(base + offset * element, sizes[dims - 1] * element);
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
  const Unseen unseen;
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

ValueChecksum ValueChecksum::of_storage(const c10::Storage& storage) {
  ValueChecksum sum;
  const size_t bytes = storage.nbytes();
  if (storage.device().is_meta() || (bytes > 0 && storage.data() == nullptr)) {
    return sum;
  }
  sum.empty_ = false;
  if (storage.device().is_cpu() && !with_tensor_ops) {
    Hasher hasher;
    hasher.update(static_cast<const char*>(storage.data()), bytes);
    sum.host_ = hasher.digest();
    return sum;
  }
  const Unseen unseen;
  at::Tensor all = at::empty({0}, at::TensorOptions().dtype(at::kByte).device(storage.device()));
  all.set_(storage, /*storage_offset=*/0, {static_cast<int64_t>(bytes)}, {1});
  sum.device_ = hash_with_ops(all);
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
  const Unseen unseen;
  return at::equal(device_, other.device_);
}

std::optional<size_t> ValueChecksum::first_mismatch(
    const std::vector<std::pair<const ValueChecksum*, const ValueChecksum*>>& pairs) {
  std::vector<bool> differs(pairs.size(), false);
  // By device: the positions of the pairs compared there.
  std::unordered_map<c10::Device, std::vector<size_t>> on_device;
  for (size_t i = 0; i < pairs.size(); ++i) {
    const ValueChecksum& a = *pairs[i].first;
    const ValueChecksum& b = *pairs[i].second;
    if (a.on_device() && b.on_device() && a.device_.device() == b.device_.device()) {
      on_device[a.device_.device()].push_back(i);
    } else {
      differs[i] = !a.matches(b);  // on the host: no synchronization
    }
  }
  const Unseen unseen;
  for (const auto& [device, positions] : on_device) {
    std::vector<at::Tensor> forward, recomputed;
    for (const size_t i : positions) {
      forward.push_back(pairs[i].first->device_);
      recomputed.push_back(pairs[i].second->device_);
    }
    const at::Tensor unequal = at::stack(forward).ne(at::stack(recomputed)).any(1).cpu();
    const bool* flags = unequal.const_data_ptr<bool>();
    for (size_t k = 0; k < positions.size(); ++k) {
      differs[positions[k]] = flags[k];
    }
  }
  for (size_t i = 0; i < differs.size(); ++i) {
    if (differs[i]) {
      return i;
    }
  }
  return std::nullopt;
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
  const Unseen unseen;
  const at::Tensor host = device_.cpu();
  out << std::setw(16) << static_cast<uint64_t>(host[0].item<int64_t>()) << ":" << std::setw(16)
      << static_cast<uint64_t>(host[1].item<int64_t>());
  return out.str();
}

}  // namespace sac::detail
