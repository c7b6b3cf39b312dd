#include <sac/lab/internal/knapsack.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <unordered_map>

namespace sac::detail {
namespace {

// Depth-first branch and bound over the items sorted by value per byte.
class Search {
 public:
  Search(const std::vector<Item>& items, int64_t capacity, size_t max_nodes)
      : items_(items), capacity_(capacity), max_nodes_(max_nodes) {
    by_density_.resize(items.size());
    std::iota(by_density_.begin(), by_density_.end(), 0);
    // Free items first, then by density; ties by index keep it stable.
    std::stable_sort(by_density_.begin(), by_density_.end(),
                     [&](size_t a, size_t b) { return density(items_[a]) > density(items_[b]); });
    // The whole items first, each in order of density.
    order_ = by_density_;
    std::stable_partition(order_.begin(), order_.end(), [&](size_t i) { return items_[i].whole; });
    wholes_ = static_cast<size_t>(
        std::count_if(items.begin(), items.end(), [](const Item& item) { return item.whole; }));
    position_.resize(items.size());
    for (size_t k = 0; k < order_.size(); ++k) {
      position_[order_[k]] = k;
    }
    int groups = 0;
    for (const Item& item : items) {
      groups = std::max(groups, item.group + 1);
    }
    whole_taken_.assign(groups, false);
    others_taken_.assign(groups, 0);
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

  // Whether `item` may join the items taken so far.
  bool allowed(const Item& item) const {
    if (item.group < 0) {
      return true;
    }
    return item.whole ? others_taken_[item.group] == 0 : !whole_taken_[item.group];
  }

  // The best value reachable from position `k` with `room` left, items
  // fractional and the groups ignored but for the whole items taken: an
  // upper bound on any completion.
  double bound(size_t k, int64_t room, double value) const {
    // Past the whole items, the rest of order_ is in order of density;
    // before, the undecided whole items are among the others.
    const std::vector<size_t>& order = k >= wholes_ ? order_ : by_density_;
    for (size_t j = k >= wholes_ ? k : 0; j < order.size(); ++j) {
      const size_t i = order[j];
      const Item& item = items_[i];
      if ((item.whole && position_[i] < k) || !allowed(item)) {
        continue;
      }
      if (item.weight <= room) {
        room -= item.weight;
        value += item.value;
      } else {
        return value + item.value * static_cast<double>(room) / static_cast<double>(item.weight);
      }
    }
    return value;
  }

  void take(const Item& item, bool taken) {
    if (item.group < 0) {
      return;
    }
    if (item.whole) {
      whole_taken_[item.group] = taken;
    } else {
      others_taken_[item.group] += taken ? 1 : -1;
    }
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
    if (!allowed(item)) {  // its group's whole item, or another of its group, is taken
      visit(k + 1, room, value);
      return;
    }
    // Dominated branches are cut. Other items of one weight come in order of
    // value (they are sorted by value per byte): taking one after leaving
    // out an earlier one of the same weight that could have been taken is
    // never better than taking that one instead (every whole item is decided
    // by now, so the swap stays allowed). The blocks of a model give many
    // items of equal weight. Whole items (groups differ) are not cut.
    int no_cut = 0;
    int& skipped = item.whole ? no_cut : skipped_of_weight_[item.weight];
    if (item.weight <= room && skipped == 0) {
      taken_[k] = true;
      take(item, true);
      visit(k + 1, room - item.weight, value + item.value);
      take(item, false);
      taken_[k] = false;
    }
    ++skipped;
    visit(k + 1, room, value);
    --skipped;
  }

  // By density while it fits (and its group allows it), or the single most
  // valuable item if better.
  Choice greedy_choice() {
    Choice by_density;
    int64_t room = capacity_;
    for (const size_t i : by_density_) {
      if (items_[i].weight <= room && allowed(items_[i])) {
        room -= items_[i].weight;
        take(items_[i], true);
        by_density.chosen.push_back(i);
        by_density.value += items_[i].value;
      }
    }
    for (const size_t i : by_density.chosen) {
      take(items_[i], false);
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
  std::vector<size_t> by_density_;  // every item, by value per byte
  std::vector<size_t> order_;       // the branching order: whole items, then the others
  std::vector<size_t> position_;    // per item: its position in order_
  size_t wholes_ = 0;
  std::vector<bool> whole_taken_;  // per group
  std::vector<int> others_taken_;  // per group
  std::vector<bool> taken_;        // by position in order_
  // Per weight, the items of that weight left out on the current path.
  std::unordered_map<int64_t, int> skipped_of_weight_;
  std::vector<size_t> best_;
  double best_value_ = 0;
  size_t nodes_ = 0;
};

}  // namespace

namespace {

// The exact choice among the items of no group or of a group not in
// `unchecked`, within what the whole items of `unchecked` leave; those
// whole items added. Indices into `items`.
Choice with_wholes(const std::vector<Item>& items, int64_t capacity,
                   const std::vector<bool>& unchecked, size_t max_nodes) {
  std::vector<Item> rest;
  std::vector<size_t> index;
  Choice out;
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& item = items[i];
    if (item.whole) {
      if (unchecked[item.group]) {
        out.chosen.push_back(i);
        out.weight += item.weight;
        out.value += item.value;
      }
    } else if (item.group < 0 || !unchecked[item.group]) {
      rest.push_back({item.weight, item.value});
      index.push_back(i);
    }
  }
  if (out.weight > capacity) {
    out.value = -1;  // does not fit
    return out;
  }
  const Choice others = Search(rest, capacity - out.weight, max_nodes).run();
  for (const size_t i : others.chosen) {
    out.chosen.push_back(index[i]);
  }
  std::sort(out.chosen.begin(), out.chosen.end());
  out.weight += others.weight;
  out.value += others.value;
  out.exact = others.exact;
  return out;
}

// The local search of Note [The knapsack] over which groups take their whole item.
Choice search_wholes(const std::vector<Item>& items, int64_t capacity, size_t max_nodes) {
  int groups = 0;
  for (const Item& item : items) {
    groups = std::max(groups, item.group + 1);
  }
  std::vector<bool> unchecked(groups, false);
  Choice best = with_wholes(items, capacity, unchecked, max_nodes);
  for (bool improved = true; improved;) {
    improved = false;
    int add = -1;
    Choice candidate_best = best;
    for (const Item& item : items) {
      if (!item.whole || unchecked[item.group]) {
        continue;
      }
      unchecked[item.group] = true;
      Choice candidate = with_wholes(items, capacity, unchecked, max_nodes);
      unchecked[item.group] = false;
      if (candidate.value > candidate_best.value) {
        candidate_best = std::move(candidate);
        add = item.group;
      }
    }
    if (add >= 0) {
      unchecked[add] = true;
      best = std::move(candidate_best);
      improved = true;
    }
  }
  // Every group unchecked, where that fits: the plain step, which no choice
  // of calls beats.
  std::fill(unchecked.begin(), unchecked.end(), true);
  Choice plain = with_wholes(items, capacity, unchecked, max_nodes);
  if (plain.value > best.value) {
    best = std::move(plain);
  }
  best.exact = false;
  best.upper_bound = Search(items, capacity, /*max_nodes=*/0).run().upper_bound;
  return best;
}

}  // namespace

Choice solve_knapsack(const std::vector<Item>& items, int64_t capacity, size_t max_nodes) {
  TORCH_CHECK(capacity >= 0, "sac: a byte budget must not be negative; got ", capacity, ".");
  size_t wholes = 0;
  for (const auto& item : items) {
    TORCH_CHECK(item.weight >= 0 && item.value >= 0,
                "sac: knapsack items need non-negative weight and value.");
    TORCH_CHECK(!item.whole || item.group >= 0, "sac: a whole knapsack item needs a group.");
    wholes += item.whole;
  }
  if (wholes > kExactWholes) {
    return search_wholes(items, capacity, max_nodes);
  }
  return Search(items, capacity, max_nodes).run();
}

}  // namespace sac::detail
