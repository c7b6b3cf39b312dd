// The op cache's books on storages, on their own: CachedStorages (bytes held
// on the device, each storage once; every version counter seen on a storage;
// the first op that wrote it) and Producers (which call returned a storage,
// while late decisions may still keep it).
#include "support.h"

#include <sac/base/internal/storage_key.h>
#include <sac/cache/internal/cached_storages.h>
#include <sac/cache/internal/producers.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <vector>

namespace cache_storages_test {

using sac::detail::CachedStorages;
using sac::detail::Producers;
using sac::detail::storage_key;

c10::OperatorHandle op_named(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

TEST(CachedStorages, CountsEachStorageOnceWhileASlotHoldsIt) {
  const at::Tensor base = torch::randn({16});
  const at::Tensor view = base.narrow(0, 4, 8);
  const at::Tensor other = torch::randn({4});
  const size_t bytes = base.storage().nbytes();
  CachedStorages storages;
  EXPECT_EQ(storages.hold(base), storage_key(base));
  EXPECT_EQ(storages.hold(view), storage_key(base));  // the same storage: counted once
  EXPECT_EQ(storages.bytes(), bytes);
  storages.hold(other);
  EXPECT_EQ(storages.bytes(), bytes + other.storage().nbytes());

  // One of two slots leaves the device (offloaded, stashed): still held.
  storages.unhold(storage_key(base));
  EXPECT_EQ(storages.bytes(), bytes + other.storage().nbytes());
  EXPECT_EQ(storages.bytes_off_device(), 0);
  // The other too: the storage is off the device, its slots still known.
  storages.unhold(storage_key(base));
  EXPECT_EQ(storages.bytes(), other.storage().nbytes());
  EXPECT_EQ(storages.bytes_off_device(), static_cast<int64_t>(bytes));

  storages.release(storage_key(base), /*held=*/false);
  storages.release(storage_key(base), /*held=*/false);
  storages.release(storage_key(other), /*held=*/true);
  EXPECT_EQ(storages.bytes(), 0u);
  EXPECT_EQ(storages.bytes_off_device(), 0);
  EXPECT_TRUE(storages.empty());
  EXPECT_EQ(storages.hold(at::Tensor()), nullptr);  // no storage: nothing counted
}

// A tensor on a known storage with a counter of its own (what
// aten::_unsafe_view returns): a change through it is a change to the storage.
TEST(CachedStorages, SeesAChangeThroughAnyCounterKnownOnAStorage) {
  const at::Tensor held = torch::randn({8});
  const at::Tensor alias = held.variable_data();  // same storage, own counter
  const at::Tensor stranger = torch::randn({8});
  CachedStorages storages;
  const c10::StorageImpl* key = storages.hold(held);
  EXPECT_FALSE(storages.watch(stranger));  // not on a known storage
  EXPECT_TRUE(storages.watch(alias));
  EXPECT_FALSE(storages.modified(key));
  alias.add_(1);
  EXPECT_TRUE(storages.modified(key));
  EXPECT_EQ(held._version(), 0);

  // The first op noted as writing it is the storage's writer; a tensor on
  // another storage is not noted.
  const auto add_ = op_named("aten::add_", "Tensor");
  const auto mul_ = op_named("aten::mul_", "Tensor");
  EXPECT_FALSE(storages.writer(key).has_value());
  storages.note_write(stranger, &add_.operator_name());
  EXPECT_FALSE(storages.writer(key).has_value());
  storages.note_write(alias, &add_.operator_name());
  storages.note_write(held, &mul_.operator_name());
  ASSERT_TRUE(storages.writer(key).has_value());
  EXPECT_EQ(*storages.writer(key), add_.operator_name());

  storages.clear();
  EXPECT_TRUE(storages.empty());
  EXPECT_EQ(storages.bytes(), 0u);
}

TEST(CachedStorages, TakesOverCountersSeenBeforeTheStorageWasHeld) {
  const at::Tensor out = torch::randn({8});
  const at::Tensor alias = out.variable_data();
  std::vector<sac::detail::VersionWatch> seen = {sac::detail::VersionWatch(alias)};
  CachedStorages storages;
  const c10::StorageImpl* key = storages.hold(out);
  storages.watch(key, seen);
  alias.mul_(2);
  EXPECT_TRUE(storages.modified(key));
}

TEST(Producers, KnowsWhichCallReturnedAStorage) {
  const auto mm = op_named("aten::mm", "");
  const auto add = op_named("aten::add", "Tensor");
  const at::Tensor first = torch::randn({2, 2});
  const at::Tensor second = torch::randn({3});
  Producers producers;
  EXPECT_TRUE(producers.empty());
  producers.note(mm, 4, {first});
  producers.note(add, 0, {second, at::Tensor()});    // undefined outputs are skipped
  ASSERT_TRUE(producers.of(first.t()).has_value());  // a view: the same storage
  EXPECT_EQ(producers.of(first)->op, mm);
  EXPECT_EQ(producers.of(first)->index, 4u);
  EXPECT_EQ(producers.of(second)->op, add);
  EXPECT_FALSE(producers.of(torch::randn({2})).has_value());

  // A later call that returns the same storage (an in-place op's output)
  // is its producer from then on.
  producers.note(add, 1, {first});
  EXPECT_EQ(producers.of(first)->index, 1u);

  producers.forget(storage_key(first));
  EXPECT_FALSE(producers.of(first).has_value());
  producers.clear();
  EXPECT_TRUE(producers.empty());
}

TEST(Producers, WatchesAliasesUntilTheCacheTakesThemOver) {
  const auto mul = op_named("aten::mul", "Tensor");
  const at::Tensor out = torch::randn({4});
  const at::Tensor alias = out.variable_data();
  Producers producers;
  producers.note(mul, 0, {out});
  EXPECT_FALSE(producers.watch(torch::randn({4})));
  EXPECT_TRUE(producers.watch(alias));
  EXPECT_FALSE(producers.aliases_modified(storage_key(out)));
  alias.add_(1);
  EXPECT_TRUE(producers.aliases_modified(storage_key(out)));
  const auto taken = producers.take_aliases(storage_key(out));
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_TRUE(taken[0].changed());
  EXPECT_FALSE(producers.aliases_modified(storage_key(out)));  // handed over
  EXPECT_TRUE(producers.take_aliases(storage_key(torch::randn({1}))).empty());
}

}  // namespace cache_storages_test
