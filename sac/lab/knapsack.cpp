#include <sac/lab/internal/knapsack.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <unordered_map>

namespace sac::lab {
namespace {

// Depth-first branch and bound over the items sorted by value per byte.
class Search {
 public:
  Search(const std::vector<Item>& items, int64_t capacity, size_t max_nodes)
      : items_(items), capacity_(capacity), max_nodes_(max_nodes) {
    order_.resize(items.size());
    std::iota(order_.begin(), order_.end(), 0);
    // Free items first, then by density; ties by index keep it stable.
    std::stable_sort(order_.begin(), order_.end(),
                     [&](size_t a, size_t b) { return density(items_[a]) > density(items_[b]); });
    taken_.assign(items.size(), false);
  }

  Choice run() {
    Choice greedy = greedy_choice();
    best_value_ = greedy.value;
    best_ = greedy.chosen;
    const double root_bound = bound(0, capacity_, 0);
    visit(0, capacity_, 0);
    Choice out;
    out.chosen = best_;
    std::sort(out.chosen.begin(), out.chosen.end());
    for (const size_t i : out.chosen) {
      out.weight += items_[i].weight;
      out.value += items_[i].value;
    }
    out.exact = nodes_ <= max_nodes_;
    out.upper_bound = out.exact ? out.value : root_bound;
    return out;
  }

 private:
  static double density(const Item& item) {
    return item.weight == 0 ? std::numeric_limits<double>::infinity()
                            : item.value / static_cast<double>(item.weight);
  }

  // The best value reachable from position `k` with `room` left, items
  // fractional: an upper bound on any completion.
  double bound(size_t k, int64_t room, double value) const {
    for (; k < order_.size(); ++k) {
      const Item& item = items_[order_[k]];
      if (item.weight <= room) {
        room -= item.weight;
        value += item.value;
      } else {
        return value + item.value * static_cast<double>(room) / static_cast<double>(item.weight);
      }
    }
    return value;
  }

  void visit(size_t k, int64_t room, double value) {
    if (++nodes_ > max_nodes_) {
      return;
    }
    if (value > best_value_) {
      best_value_ = value;
      best_.clear();
      for (size_t i = 0; i < k; ++i) {
        if (taken_[i]) {
          best_.push_back(order_[i]);
        }
      }
    }
    if (k == order_.size() || bound(k, room, value) <= best_value_) {
      return;
    }
    const Item& item = items_[order_[k]];
    // Items of one weight come in order of value (they are sorted by value
    // per byte). Taking one after leaving out an earlier one of the same
    // weight is never better than taking that one instead: such branches
    // are cut. The blocks of a model give many items of equal weight.
    int& skipped = skipped_of_weight_[item.weight];
    if (item.weight <= room && skipped == 0) {
      taken_[k] = true;
      visit(k + 1, room - item.weight, value + item.value);
      taken_[k] = false;
    }
    ++skipped;
    visit(k + 1, room, value);
    --skipped;
  }

  // By density while it fits, or the single most valuable item if better.
  Choice greedy_choice() const {
    Choice by_density;
    int64_t room = capacity_;
    for (const size_t i : order_) {
      if (items_[i].weight <= room) {
        room -= items_[i].weight;
        by_density.chosen.push_back(i);
        by_density.value += items_[i].value;
      }
    }
    Choice single;
    for (size_t i = 0; i < items_.size(); ++i) {
      if (items_[i].weight <= capacity_ && items_[i].value > single.value) {
        single.chosen = {i};
        single.value = items_[i].value;
      }
    }
    return single.value > by_density.value ? single : by_density;
  }

  const std::vector<Item>& items_;
  int64_t capacity_;
  size_t max_nodes_;
  std::vector<size_t> order_;
  std::vector<bool> taken_;  // by position in order_
  // Per weight, the items of that weight left out on the current path.
  std::unordered_map<int64_t, int> skipped_of_weight_;
  std::vector<size_t> best_;
  double best_value_ = 0;
  size_t nodes_ = 0;
};

}  // namespace

Choice solve_knapsack(const std::vector<Item>& items, int64_t capacity, size_t max_nodes) {
  TORCH_CHECK(capacity >= 0, "sac: a byte budget must not be negative; got ", capacity, ".");
  for (const auto& item : items) {
    TORCH_CHECK(item.weight >= 0 && item.value >= 0,
                "sac: knapsack items need non-negative weight and value.");
  }
  return Search(items, capacity, max_nodes).run();
}

}  // namespace sac::lab
