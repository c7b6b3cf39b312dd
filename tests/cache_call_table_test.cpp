// The op cache's call table (sac/cache/internal/call_table.h) on its own: each
// op's calls numbered apart, the calls before an op's first entry only counted,
// and lookups in any order against a plain reference.
#include "support.h"

#include <sac/cache/internal/call_table.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <map>
#include <random>
#include <string>
#include <vector>

namespace cache_call_table_test {

using sac::detail::CallTable;
constexpr uint32_t kNoEntry = CallTable::kNoEntry;

c10::OperatorHandle op_named(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

void expect_found(const CallTable& table, const c10::OperatorHandle& op, size_t call,
                  uint32_t entry) {
  const CallTable::Found found = table.find(op, call);
  EXPECT_TRUE(found.known) << op.operator_name() << " call " << call;
  EXPECT_EQ(found.entry, entry) << op.operator_name() << " call " << call;
}

TEST(CallTable, NumbersEachOpsCallsOnTheirOwn) {
  const auto add = op_named("aten::add", "Tensor");
  const auto mul = op_named("aten::mul", "Tensor");
  CallTable table;
  EXPECT_TRUE(table.empty());
  table.append(add, 0);
  table.append(mul, 1);
  table.append(add, 2);
  EXPECT_EQ(table.calls_so_far(add), 2u);
  EXPECT_EQ(table.calls_so_far(mul), 1u);
  EXPECT_EQ(table.calls(), 3u);
  expect_found(table, add, 0, 0);
  expect_found(table, add, 1, 2);
  expect_found(table, mul, 0, 1);
  EXPECT_FALSE(table.find(add, 2).known);
  EXPECT_FALSE(table.find(op_named("aten::div", "Tensor"), 0).known);
  EXPECT_EQ(table.calls_so_far(op_named("aten::div", "Tensor")), 0u);
}

TEST(CallTable, CallsBeforeAnOpsFirstEntryAreOnlyCounted) {
  const auto add = op_named("aten::add", "Tensor");
  CallTable table;
  for (int i = 0; i < 3; ++i) {
    table.append(add, kNoEntry);
  }
  table.append(add, 5);
  table.append(add, kNoEntry);  // after the first entry: kept in its place
  table.append(add, 6);
  EXPECT_EQ(table.calls_so_far(add), 6u);
  for (size_t call = 0; call < 3; ++call) {
    expect_found(table, add, call, kNoEntry);
  }
  expect_found(table, add, 3, 5);
  expect_found(table, add, 4, kNoEntry);
  expect_found(table, add, 5, 6);
  EXPECT_FALSE(table.find(add, 6).known);
}

TEST(CallTable, ClearForgetsEveryCall) {
  const auto add = op_named("aten::add", "Tensor");
  CallTable table;
  table.append(add, 0);
  EXPECT_EQ(table.calls_so_far(add), 1u);  // the latest op remembered
  table.clear();
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(table.calls(), 0u);
  EXPECT_EQ(table.calls_so_far(add), 0u);
  EXPECT_FALSE(table.find(add, 0).known);
  table.append(add, 9);
  expect_found(table, add, 0, 9);
}

// Appends and lookups in random order over a few ops (the latest op found is
// remembered, so the order matters), each checked against a map of vectors.
TEST(CallTable, AgreesWithAPlainReference) {
  const std::vector<c10::OperatorHandle> ops = {
      op_named("aten::add", "Tensor"), op_named("aten::mul", "Tensor"), op_named("aten::mm", ""),
      op_named("aten::relu", ""), op_named("aten::view", "")};
  for (uint32_t seed = 0; seed < 20; ++seed) {
    std::mt19937 random(seed);
    CallTable table;
    std::map<std::string, std::vector<uint32_t>> reference;
    uint32_t next_entry = 0;
    size_t appended = 0;
    for (int step = 0; step < 2000; ++step) {
      const c10::OperatorHandle& op = ops[random() % ops.size()];
      std::vector<uint32_t>& calls = reference[c10::toString(op.operator_name())];
      switch (random() % 3) {
        case 0: {
          // Entries are rarer than recompute calls, as in a region.
          const uint32_t entry = random() % 4 == 0 ? next_entry++ : kNoEntry;
          table.append(op, entry);
          calls.push_back(entry);
          ++appended;
          break;
        }
        case 1: ASSERT_EQ(table.calls_so_far(op), calls.size()) << "seed " << seed; break;
        default: {
          const size_t call = random() % (calls.size() + 2);
          const CallTable::Found found = table.find(op, call);
          ASSERT_EQ(found.known, call < calls.size()) << "seed " << seed;
          if (found.known) {
            ASSERT_EQ(found.entry, calls[call]) << "seed " << seed << " call " << call;
          }
        }
      }
    }
    EXPECT_EQ(table.calls(), appended);
  }
}

}  // namespace cache_call_table_test
