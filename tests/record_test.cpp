// The record floor on its own: how tensors are traced to the calls that
// made them, and that replay computes the same values.
#include "support.h"

#include <sac/dispatch/internal/interceptor.h>
#include <sac/record/internal/recorder.h>
#include <sac/record/internal/replay.h>

namespace record_test {

using sac::detail::Instruction;
using sac::detail::Recorder;
using sac::detail::Recording;

// Records what `f` runs (marking the tensors it returns, in order), then
// replays the recording and returns the marked values of the replay.
struct Recorded {
  Recording recording;
  std::vector<at::Tensor> forward;   // what f returned
  std::vector<at::Tensor> replayed;  // the marks' values in replay

  size_t count(Instruction::Kind kind) const {
    size_t n = 0;
    for (const auto& instruction : recording.instructions) {
      n += instruction.kind == kind;
    }
    return n;
  }
};

template <class F>
Recorded record_and_replay(F&& f) {
  Recorded r;
  std::vector<torch::autograd::SavedVariable> kept;
  {
    Recorder recorder(r.recording, /*region_interceptor=*/nullptr, [](const at::Tensor& t) {
      return torch::autograd::SavedVariable(t, /*is_output=*/false);
    });
    sac::detail::ObserverGuard observe(&recorder);
    r.forward = f();
    for (const auto& t : r.forward) {
      recorder.mark(t);
    }
    recorder.finish();
  }
  std::vector<at::Tensor> outside(r.recording.outside.size());
  for (size_t i = 0; i < outside.size(); ++i) {
    if (!r.recording.outside[i].snapshot.has_value()) {
      outside[i] = r.recording.outside[i].saved.unpack();
    }
  }
  sac::detail::replay(r.recording, std::move(outside),
                      [&](size_t, const at::Tensor& t) { r.replayed.push_back(t); });
  return r;
}

bool record_available() {
  sac_test::expect_configured_mechanism();
  return sac::detail::observers_see_every_op();
}

#define REQUIRE_RECORD()                                              \
  if (!record_available()) {                                          \
    std::string why;                                                  \
    EXPECT_FALSE(sac::detail::observers_see_every_op(&why));          \
    EXPECT_NE(why.find("never see views"), std::string::npos) << why; \
    return;                                                           \
  }

TEST(Record, ViewsAndInPlaceOpsAreCallsOnValues) {
  REQUIRE_RECORD();
  torch::NoGradGuard no_grad;
  auto x = torch::randn({4, 6});
  auto r = record_and_replay([&] {
    auto h = x * 2;
    h.view({6, 4}).narrow(0, 1, 2).add_(1);  // writes h through a view
    return std::vector<at::Tensor>{h, h.t().sin()};
  });
  EXPECT_EQ(r.count(Instruction::Kind::Outside), 1u) << r.recording.str();  // x
  EXPECT_EQ(r.count(Instruction::Kind::Alias), 0u) << r.recording.str();
  sac_test::expect_bit_identical(r.forward, r.replayed);
}

// Tensor::variable_data() (what .data does) returns a tensor no op returned:
// it is traced by its memory, as an alias of the value there.
TEST(Record, DataIsAnAliasOfTheValueItShares) {
  REQUIRE_RECORD();
  auto x = torch::randn({5}, torch::requires_grad());
  auto r = record_and_replay([&] {
    auto h = x.exp();
    auto d = h.variable_data();
    return std::vector<at::Tensor>{(d * 3).cos() + h.detach()};
  });
  EXPECT_EQ(r.count(Instruction::Kind::Alias), 1u) << r.recording.str();
  sac_test::expect_bit_identical({r.forward[0].detach()}, r.replayed);
}

// torch::tensor(std::vector) copies its data into at::empty's memory outside
// the dispatcher: copied when an op first reads it.
TEST(Record, MemoryFilledOutsideTheDispatcherIsCopied) {
  REQUIRE_RECORD();
  torch::NoGradGuard no_grad;
  auto x = torch::randn({4, 3});
  auto r = record_and_replay([&] {
    auto index = torch::tensor(std::vector<int64_t>{3, 1});
    return std::vector<at::Tensor>{x.index_select(0, index) + 1};
  });
  EXPECT_EQ(r.recording.snapshots.size(), 1u) << r.recording.str();
  sac_test::expect_bit_identical(r.forward, r.replayed);
}

// Memory the tensor does not own (torch::from_blob) is copied when first
// seen: by backward it may be gone.
TEST(Record, BorrowedMemoryIsCopied) {
  REQUIRE_RECORD();
  torch::NoGradGuard no_grad;
  auto x = torch::randn({4});
  auto r = record_and_replay([&] {
    std::vector<float> data{1, 2, 3, 4};
    auto borrowed = torch::from_blob(data.data(), {4});
    return std::vector<at::Tensor>{x * borrowed.clone()};  // data dies here
  });
  EXPECT_EQ(r.recording.snapshots.size(), 1u) << r.recording.str();
  sac_test::expect_bit_identical(r.forward, r.replayed);
}

// Outside memory the recording writes is copied first; replay writes a
// copy and leaves the live tensor alone.
TEST(Record, OutsideMemoryWrittenIsCopiedNotWrittenAgain) {
  REQUIRE_RECORD();
  torch::NoGradGuard no_grad;
  auto buffer = torch::zeros({3});
  auto r = record_and_replay([&] {
    buffer.add_(1);
    auto view = buffer.narrow(0, 1, 2);
    view.mul_(5);
    return std::vector<at::Tensor>{buffer * 2};
  });
  EXPECT_EQ(r.recording.snapshots.size(), 1u) << r.recording.str();
  sac_test::expect_bit_identical({torch::tensor({1.f, 5.f, 5.f})}, {buffer});
  sac_test::expect_bit_identical(r.forward, r.replayed);
}

// Calls that make no tensor and write none are recorded but not replayed.
TEST(Record, ItemIsNotReplayed) {
  REQUIRE_RECORD();
  torch::NoGradGuard no_grad;
  auto x = torch::randn({8});
  auto r = record_and_replay([&] {
    auto h = x.sin();
    return std::vector<at::Tensor>{h.sum().item<double>() > 0 ? h.exp() : h.cos()};
  });
  size_t not_replayed = 0;
  for (const auto& call : r.recording.calls) {
    not_replayed += !call.replayed;
  }
  EXPECT_EQ(not_replayed, 1u) << r.recording.str();  // aten::_local_scalar_dense
  sac_test::expect_bit_identical(r.forward, r.replayed);
}

// A Storage is not a value the recording can follow: refused, naming the op.
TEST(Record, OpsWithAStorageArgumentAreRefused) {
  REQUIRE_RECORD();
  torch::NoGradGuard no_grad;
  auto source = torch::randn({4});
  const auto message = sac_test::error_of([&] {
    record_and_replay([&] {
      auto t = torch::empty({0});
      t.set_(source.storage());
      return std::vector<at::Tensor>{t};
    });
  });
  EXPECT_NE(message.find("aten::set_"), std::string::npos) << message;
  EXPECT_NE(message.find("Storage"), std::string::npos) << message;
}

}  // namespace record_test
