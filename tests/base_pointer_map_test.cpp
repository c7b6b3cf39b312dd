// The per-op tables' containers against the standard ones: PointerMap
// (open addressing by address, erasing by backward shift) and StableVector
// (segments that double, elements that never move).
#include <sac/base/internal/pointer_map.h>
#include <sac/base/internal/stable_vector.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

// Addresses as the tables meet them: aligned, close together, in runs.
const void* address(size_t i) { return reinterpret_cast<const void*>(0x10000 + 0x90 * i); }

template <class V>
void expect_same(sac::detail::PointerMap<V>& map, const std::map<const void*, V>& reference,
                 size_t keys) {
  ASSERT_EQ(map.size(), reference.size());
  for (size_t i = 0; i < keys; ++i) {
    const auto it = reference.find(address(i));
    V* found = map.find(address(i));
    if (it == reference.end()) {
      EXPECT_EQ(found, nullptr) << "key " << i;
    } else {
      ASSERT_NE(found, nullptr) << "key " << i;
      EXPECT_EQ(*found, it->second) << "key " << i;
    }
  }
  size_t visited = 0;
  map.for_each([&](const void* key, const V& value) {
    ++visited;
    EXPECT_EQ(reference.at(key), value);
  });
  EXPECT_EQ(visited, reference.size());
}

// Random inserts and erases, for a value kept in the table (size_t) and one
// kept apart (std::string): every key found with its value, no other.
template <class V, class Make>
void random_edits(Make make) {
  constexpr size_t kKeys = 3000;
  std::mt19937 random(7);
  sac::detail::PointerMap<V> map;
  std::map<const void*, V> reference;
  for (int round = 0; round < 20000; ++round) {
    const size_t i = random() % kKeys;
    if (random() % 3 == 0) {
      map.erase(address(i));
      reference.erase(address(i));
    } else {
      const V value = make(round);
      map[address(i)] = value;
      reference[address(i)] = value;
    }
    if (round % 2500 == 0) {
      expect_same(map, reference, kKeys);
    }
  }
  expect_same(map, reference, kKeys);
  for (size_t i = 0; i < kKeys; i += 2) {
    map.erase(address(i));
    reference.erase(address(i));
  }
  expect_same(map, reference, kKeys);
  map.clear();
  reference.clear();
  expect_same(map, reference, kKeys);
  map[address(5)] = make(5);
  reference[address(5)] = make(5);
  expect_same(map, reference, kKeys);
}

TEST(PointerMap, MatchesStdMapThroughInsertsAndErases) {
  random_edits<size_t>([](int round) { return static_cast<size_t>(round); });
  random_edits<std::string>([](int round) { return "value " + std::to_string(round); });
}

TEST(PointerMap, ValuesKeptApartDoNotMoveWhenTheTableGrows) {
  sac::detail::PointerMap<std::string> map;
  std::string* first = &map[address(0)];
  *first = "first";
  for (size_t i = 1; i < 1000; ++i) {
    map[address(i)] = std::to_string(i);
  }
  EXPECT_EQ(map.find(address(0)), first);
  EXPECT_EQ(*first, "first");
}

TEST(StableVector, ElementsStayPutAndKeepTheirOrder) {
  sac::detail::StableVector<std::unique_ptr<int>> vector;
  std::vector<std::unique_ptr<int>*> where;
  for (int i = 0; i < 5000; ++i) {
    where.push_back(&vector.emplace_back(std::make_unique<int>(i)));
  }
  ASSERT_EQ(vector.size(), 5000u);
  int expected = 0;
  for (const auto& element : vector) {
    EXPECT_EQ(*element, expected);
    ++expected;
  }
  for (int i = 0; i < 5000; ++i) {
    EXPECT_EQ(&vector[i], where[i]);
    EXPECT_EQ(*vector[i], i);
  }
  vector.clear();
  EXPECT_TRUE(vector.empty());
  EXPECT_EQ(*vector.emplace_back(std::make_unique<int>(9)), 9);
}

}  // namespace
