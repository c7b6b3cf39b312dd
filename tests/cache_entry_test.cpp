// One call in the op cache (sac/cache/internal/cache_entry.h) on its own: its
// outputs' structure served back as it came, the bytes its slots hold, what
// it finds modified, where an output goes (offloaded, stashed), and what a
// late keep finds of the outputs it held weakly.
#include "support.h"

#include <sac/cache/internal/cache_entry.h>
#include <sac/cache/internal/cached_storages.h>
#include <sac/cache/internal/producers.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <memory>
#include <string>
#include <vector>

namespace cache_entry_test {

using sac::detail::CachedStorages;
using sac::detail::CacheEntry;

c10::OperatorHandle op_named(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

size_t bytes_of(const at::Tensor& t) { return t.storage().nbytes(); }

// Kept `outputs` of call 0 of aten::add in `entry`.
void keep(CacheEntry& entry, const std::vector<c10::IValue>& outputs, CachedStorages& storages,
          std::shared_ptr<sac::CopyTarget> offload_to = nullptr) {
  CacheEntry::Tensors tensors;
  entry.shape(outputs, tensors);
  entry.keep(tensors, std::move(offload_to), storages);
}

TEST(CacheEntry, ServesPlainOutputsAsDetachedAliases) {
  const at::Tensor a = torch::randn({3, 4}, torch::requires_grad());
  const at::Tensor out = a * 2;
  CachedStorages storages;
  CacheEntry entry(op_named("aten::mul", "Tensor"), 0);
  keep(entry, {out}, storages);
  EXPECT_TRUE(entry.plain);
  EXPECT_EQ(entry.state, CacheEntry::State::Kept);
  ASSERT_EQ(entry.slots.size(), 1u);
  EXPECT_EQ(storages.bytes(), bytes_of(out));

  // Not consumed: a new alias each time; consumed: the held one.
  for (bool consume : {false, true}) {
    const auto served = entry.outputs(consume);
    ASSERT_EQ(served.size(), 1u);
    const at::Tensor t = served[0].toTensor();
    EXPECT_TRUE(t.is_alias_of(out));
    EXPECT_FALSE(t.requires_grad());
    EXPECT_EQ(t._version(), out._version());  // the same counter
    EXPECT_TRUE(torch::equal(t, out));
  }
  entry.drop(storages);
  EXPECT_EQ(storages.bytes(), 0u);
  EXPECT_TRUE(entry.slots.empty());
  EXPECT_EQ(entry.state, CacheEntry::State::Kept);  // the cache sets the state
}

// Lists with undefined tensors, non-tensor values and an undefined output
// come back in the same structure, each defined tensor an alias of its own.
TEST(CacheEntry, ServesStructuredOutputsInTheirStructure) {
  const at::Tensor x = torch::randn({2});
  const at::Tensor y = torch::randn({5});
  const at::Tensor z = torch::randn({7});
  c10::List<at::Tensor> list({x, at::Tensor(), y});
  const std::vector<c10::IValue> outputs = {c10::IValue(list), c10::IValue(int64_t{3}),
                                            c10::IValue(at::Tensor()), c10::IValue(z)};
  CachedStorages storages;
  CacheEntry entry(op_named("aten::unbind", "int"), 4);
  CacheEntry::Tensors tensors;
  entry.shape(outputs, tensors);
  ASSERT_EQ(tensors.size(), 3u);
  EXPECT_TRUE(tensors[0].is_same(x));
  EXPECT_TRUE(tensors[1].is_same(y));
  EXPECT_TRUE(tensors[2].is_same(z));
  EXPECT_FALSE(entry.plain);
  EXPECT_EQ(entry.slots.size(), 3u);
  entry.keep(tensors, nullptr, storages);
  EXPECT_EQ(storages.bytes(), bytes_of(x) + bytes_of(y) + bytes_of(z));

  const auto served = entry.outputs(/*consume=*/true);
  ASSERT_EQ(served.size(), 4u);
  const auto served_list = served[0].toTensorList();
  ASSERT_EQ(served_list.size(), 3u);
  EXPECT_TRUE(served_list.get(0).is_alias_of(x));
  EXPECT_FALSE(served_list.get(1).defined());
  EXPECT_TRUE(served_list.get(2).is_alias_of(y));
  EXPECT_EQ(served[1].toInt(), 3);
  EXPECT_TRUE(served[2].isTensor());
  EXPECT_FALSE(served[2].toTensor().defined());
  EXPECT_TRUE(served[3].toTensor().is_alias_of(z));
  entry.drop(storages);
  EXPECT_EQ(storages.bytes(), 0u);
  EXPECT_TRUE(entry.structure.empty());
  EXPECT_TRUE(entry.defined.empty());
}

// Through the output's own counter, or through another tensor on its storage
// with a counter of its own (the storages watch that one).
TEST(CacheEntry, FindsTheFirstOutputModifiedAndHow) {
  const at::Tensor first = torch::randn({4});
  const at::Tensor second = torch::randn({4});
  CachedStorages storages;
  CacheEntry entry(op_named("aten::add", "Tensor"), 0);
  keep(entry, {first, second}, storages);
  EXPECT_FALSE(entry.first_modified(storages).has_value());

  second.add_(1);
  auto modified = entry.first_modified(storages);
  ASSERT_TRUE(modified.has_value());
  EXPECT_EQ(modified->first, 1u);
  EXPECT_EQ(modified->second, "version 0 when cached, 1 now");

  // variable_data() shares the storage, not the counter.
  at::Tensor other = first.variable_data();
  EXPECT_TRUE(storages.watch(other));
  other.mul_(2);
  EXPECT_EQ(first._version(), 0);
  modified = entry.first_modified(storages);
  ASSERT_TRUE(modified.has_value());
  EXPECT_EQ(modified->first, 0u);
  EXPECT_NE(modified->second.find("through another tensor on its storage"), std::string::npos);
  entry.drop(storages);
}

// Offloads the larger outputs to a target that holds copies apart.
class LargeOnes final : public sac::CopyTarget {
 public:
  bool accepts(const at::Tensor& t) const override { return t.numel() > 4; }
  at::Tensor copy_out(const at::Tensor& t) override {
    ++copies_out;
    return t.clone();
  }
  at::Tensor copy_back(const at::Tensor& copy, const Origin&) override {
    ++copies_back;
    return copy.clone();
  }
  int copies_out = 0;
  int copies_back = 0;
};

TEST(CacheEntry, OffloadsWhatTheTargetAcceptsAndCopiesItBack) {
  const at::Tensor small = torch::randn({2});
  const at::Tensor large = torch::randn({16});
  auto target = std::make_shared<LargeOnes>();
  CachedStorages storages;
  CacheEntry entry(op_named("aten::add", "Tensor"), 0);
  keep(entry, {small, large}, storages, target);
  EXPECT_EQ(target->copies_out, 1);
  EXPECT_TRUE(entry.offloaded());
  EXPECT_FALSE(entry.slots[0].offloaded());
  EXPECT_TRUE(entry.slots[1].offloaded());
  EXPECT_EQ(storages.bytes(), bytes_of(small));  // the large one left the device
  EXPECT_EQ(storages.bytes_off_device(), static_cast<int64_t>(bytes_of(large)));

  entry.start_copy_back();  // the default copy back starts nothing early
  const auto served = entry.outputs(/*consume=*/true);
  EXPECT_EQ(target->copies_back, 1);
  EXPECT_TRUE(served[0].toTensor().is_alias_of(small));
  EXPECT_FALSE(served[1].toTensor().is_alias_of(large));
  EXPECT_TRUE(torch::equal(served[1].toTensor(), large));
  entry.drop(storages);
  EXPECT_EQ(entry.target, nullptr);
  EXPECT_TRUE(storages.empty());
}

// A stash whose hooks keep a clone: the slot lets go of the output.
class Clones final : public sac::detail::TensorStash {
  struct Hooks final : torch::autograd::SavedVariableHooks {
    void call_pack_hook(const at::Tensor& t) override { kept = t.clone(); }
    at::Tensor call_unpack_hook() override { return kept; }
    at::Tensor kept;
  };

 public:
  std::unique_ptr<torch::autograd::SavedVariableHooks> hooks() override {
    ++stashed;
    return std::make_unique<Hooks>();
  }
  int stashed = 0;
};

TEST(CacheEntry, StashesWhatItHoldsOnTheDevice) {
  const at::Tensor out = torch::randn({8});
  CachedStorages storages;
  CacheEntry entry(op_named("aten::add", "Tensor"), 0);
  keep(entry, {out}, storages);
  Clones stash;
  entry.stash(stash, storages);
  entry.stash(stash, storages);  // once: the slot holds nothing any more
  EXPECT_EQ(stash.stashed, 1);
  EXPECT_EQ(storages.bytes(), 0u);
  EXPECT_FALSE(entry.slots[0].held.defined());
  const at::Tensor served = entry.outputs(/*consume=*/true)[0].toTensor();
  EXPECT_FALSE(served.is_alias_of(out));
  EXPECT_TRUE(torch::equal(served, out));
  // A change to the output is still seen while the stash holds its value.
  out.add_(1);
  EXPECT_TRUE(entry.first_modified(storages).has_value());
  entry.drop(storages);
}

// A recompute call's outputs held weakly, as a late keep finds them.
TEST(CacheEntry, HandsBackWhatItReturnedOrSaysWhyNot) {
  const auto add = op_named("aten::add", "Tensor");
  sac::detail::Producers producers;
  const auto returned = [&](CacheEntry& entry, std::vector<at::Tensor>& tensors) {
    return entry.returned(producers, tensors);
  };
  at::Tensor out = torch::randn({3});
  at::Tensor other = torch::randn({3});
  {
    CacheEntry entry(add, 0);
    CacheEntry::Tensors tensors;
    entry.shape({out, other}, tensors);
    entry.hold_weakly(tensors);
    tensors.clear();
    std::vector<at::Tensor> alive;
    EXPECT_FALSE(returned(entry, alive).has_value());
    ASSERT_EQ(alive.size(), 2u);
    EXPECT_TRUE(alive[0].is_same(out));
    EXPECT_TRUE(alive[1].is_same(other));

    other.add_(1);
    std::vector<at::Tensor> modified;
    const auto why = returned(entry, modified);
    ASSERT_TRUE(why.has_value());
    EXPECT_EQ(*why, "its output 1 was modified in place (version 0 when cached, 1 now)");
  }
  {
    CacheEntry entry(add, 1);
    CacheEntry::Tensors tensors;
    entry.shape({out, torch::randn({3})}, tensors);
    entry.hold_weakly(tensors);
    tensors.clear();  // the only reference to output 1
    std::vector<at::Tensor> alive;
    const auto why = returned(entry, alive);
    ASSERT_TRUE(why.has_value());
    EXPECT_NE(why->find("its output 1 was freed already"), std::string::npos);
  }
  {
    // Modified through an alias with a counter of its own that the
    // producers watch.
    CacheEntry entry(add, 2);
    CacheEntry::Tensors tensors;
    entry.shape({out}, tensors);
    entry.hold_weakly(tensors);
    producers.note(add, 2, {out});
    at::Tensor alias = out.variable_data();
    EXPECT_TRUE(producers.watch(alias));
    alias.add_(1);
    std::vector<at::Tensor> alive;
    const auto why = returned(entry, alive);
    ASSERT_TRUE(why.has_value());
    EXPECT_NE(why->find("its output 0 was modified in place through another tensor"),
              std::string::npos);
  }
}

}  // namespace cache_entry_test
