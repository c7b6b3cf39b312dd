#include <sac/lab/internal/choices.h>

#include <utility>

namespace sac::detail {

LeftOut left_out(const OpCallProfile& call, const std::optional<OffloadCost>& offload) {
  if (offload.has_value() && call.device.type() != c10::kCPU) {
    const double trip = static_cast<double>(call.output_bytes) / offload->bytes_per_second;
    if (trip < call.recompute_seconds()) {
      return {trip, true};
    }
  }
  return {call.recompute_seconds(), false};
}

std::vector<CallChoice> choices_of(const RegionProfile& profile, size_t index,
                                   const std::optional<OffloadCost>& offload) {
  const auto& calls = profile.calls();
  std::vector<size_t> root(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    root[i] = i;
  }
  auto find = [&](size_t i) {
    while (root[i] != i) {
      i = root[i] = root[root[i]];
    }
    return i;
  };
  for (size_t i = 0; i < calls.size(); ++i) {
    for (const size_t j : calls[i].shares_storage_with) {
      root[find(i)] = find(j);
    }
  }
  std::vector<CallChoice> by_root(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    CallChoice& c = by_root[find(i)];
    c.bytes += calls[i].output_bytes;
    if (calls[i].keepable()) {
      c.calls.push_back(&calls[i]);
    }
  }
  std::vector<CallChoice> choices;
  for (CallChoice& c : by_root) {
    if (c.calls.empty()) {
      continue;
    }
    c.profile = index;
    if (c.calls.size() == 1) {
      c.left = left_out(*c.calls.front(), offload);
    } else {  // offload moves one call's outputs; a shared storage is recomputed
      for (const OpCallProfile* call : c.calls) {
        c.left.seconds += call->recompute_seconds();
      }
    }
    choices.push_back(std::move(c));
  }
  return choices;
}

}  // namespace sac::detail
