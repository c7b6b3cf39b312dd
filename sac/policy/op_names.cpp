#include <sac/policy/internal/op_names.h>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <string>

namespace sac::detail {
namespace {

std::string display_name(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), size_t{0});
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// Every registered overload (with a schema) of `base` ("ns::name").
std::vector<c10::OperatorHandle> overloads_of(const std::string& base) {
  std::vector<c10::OperatorHandle> found;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    if (name.name == base) {
      if (auto op = dispatcher.findSchema(name)) {
        found.push_back(*op);
      }
    }
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.operator_name().overload_name < b.operator_name().overload_name;
  });
  return found;
}

[[noreturn]] void fail_unknown(std::string_view text) {
  C10_THROW_ERROR(Error,
                  c10::str("sac: no operator named '", text,
                           "' is registered. Closest registered names: ",
                           c10::Join(", ", closest_op_names(text, 5)),
                           ". Check the spelling, and that the library defining a custom op is "
                           "loaded before the policy is built."));
}

}  // namespace

std::vector<std::string> closest_op_names(std::string_view name, size_t count) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const auto& op : c10::Dispatcher::singleton().getAllOpNames()) {
    std::string candidate = display_name(op);
    scored.emplace_back(edit_distance(name, candidate), std::move(candidate));
  }
  count = std::min(count, scored.size());
  std::partial_sort(scored.begin(), scored.begin() + count, scored.end());
  std::vector<std::string> best;
  for (size_t i = 0; i < count; ++i) {
    best.push_back(std::move(scored[i].second));
  }
  return best;
}

std::vector<c10::OperatorHandle> resolve_op_name(std::string_view text) {
  const size_t separator = text.find("::");
  TORCH_CHECK(separator != std::string_view::npos && separator > 0 && separator + 2 < text.size(),
              "sac: '", text,
              "' is not an op name. Write namespace::name or "
              "namespace::name.overload, for example \"aten::mm\" or "
              "\"aten::add.Tensor\".");
  const size_t dot = text.find('.', separator + 2);
  const std::string base(text.substr(0, dot));
  auto& dispatcher = c10::Dispatcher::singleton();

  if (dot != std::string_view::npos) {
    const std::string overload(text.substr(dot + 1));
    if (overload == "*") {
      auto all = overloads_of(base);
      if (all.empty()) {
        fail_unknown(text);
      }
      return all;
    }
    const std::string overload_name = overload == "default" ? "" : overload;
    auto op = dispatcher.findSchema({base, overload_name});
    if (!op.has_value()) {
      fail_unknown(text);
    }
    return {*op};
  }

  if (auto op = dispatcher.findSchema({base, ""})) {
    return {*op};
  }
  auto overloads = overloads_of(base);
  if (overloads.empty()) {
    fail_unknown(text);
  }
  if (overloads.size() == 1) {
    return overloads;
  }
  std::vector<std::string> names;
  for (const auto& op : overloads) {
    names.push_back(display_name(op.operator_name()));
  }
  C10_THROW_ERROR(Error,
                  c10::str("sac: '", text,
                           "' names an op with several overloads and no default "
                           "one: ",
                           c10::Join(", ", names), ". Name the overload you mean (for example \"",
                           names.front(), "\"), or all of them with \"", base, ".*\"."));
}

}  // namespace sac::detail
