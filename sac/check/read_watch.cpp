#include <sac/check/internal/read_watch.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace sac::detail {
namespace {

// Regions note and forget on the threads that run and free them.
struct Written {
  std::mutex mutex;
  std::unordered_map<const void*, size_t> counts;
  std::atomic<size_t> size{0};  // read without the lock: usually 0
};

Written& written() {
  static Written* const instance = new Written();  // used until exit
  return *instance;
}

bool written_by_region(const void* counter) {
  Written& all = written();
  if (counter == nullptr || all.size.load(std::memory_order_acquire) == 0) {
    return false;
  }
  const std::lock_guard<std::mutex> lock(all.mutex);
  return all.counts.count(counter) > 0;
}

}  // namespace

void note_written_by_region(const void* counter) {
  Written& all = written();
  const std::lock_guard<std::mutex> lock(all.mutex);
  ++all.counts[counter];
  all.size.store(all.counts.size(), std::memory_order_release);
}

void forget_written_by_region(const void* counter) {
  Written& all = written();
  const std::lock_guard<std::mutex> lock(all.mutex);
  const auto it = all.counts.find(counter);
  TORCH_INTERNAL_ASSERT(it != all.counts.end(), "sac: a written tensor was forgotten twice");
  if (--it->second == 0) {
    all.counts.erase(it);
  }
  all.size.store(all.counts.size(), std::memory_order_release);
}

ReadWatch::ReadWatch(const at::Tensor& t) : version_(t) {
  if (!t.has_storage() || !written_by_region(version_.identity())) {
    return;
  }
  ValueChecksum checksum = ValueChecksum::of_storage(t.storage());
  if (!checksum.empty()) {  // no bytes to read (meta): by version alone
    bytes_.emplace(Bytes{t.storage().getWeakStorageImpl(), std::move(checksum)});
  }
}

bool ReadWatch::changed() const {
  if (!version_.changed()) {
    return false;
  }
  if (!bytes_.has_value()) {
    return true;
  }
  c10::intrusive_ptr<c10::StorageImpl> storage = bytes_->storage.lock();
  return !storage ||
         !ValueChecksum::of_storage(c10::Storage(std::move(storage))).matches(bytes_->checksum);
}

void ReadWatch::rebase() {
  version_.rebase();
  if (bytes_.has_value()) {
    if (c10::intrusive_ptr<c10::StorageImpl> storage = bytes_->storage.lock()) {
      bytes_->checksum = ValueChecksum::of_storage(c10::Storage(std::move(storage)));
    }
  }
}

}  // namespace sac::detail
