// One table of options per subcommand. A row names the flag, its help, the field it sets, the
// check of its text and the key under which the report's config records it; registration and
// --help, the reproduce line, the report's config and the tests' helpers all read the rows, so an
// option is written once.
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "harness/support/text.h"

namespace ckcheck::cli {

/// The name a front end with keyword arguments gives a flag: its words joined by '_'
/// (--input-requires-grad: input_requires_grad).
inline std::string keyword_of_flag(const std::string& flag) {
  std::string name = flag.substr(flag.find_first_not_of('-'));
  for (auto& c : name) c = c == '-' ? '_' : c;
  return name;
}

template <class Options>
class OptionRow {
 public:
  template <class T>
  using Get = std::function<T&(Options&)>;
  using Field = std::variant<Get<bool>, Get<double>, Get<int>, Get<int64_t>, Get<uint64_t>, Get<std::string>,
                             Get<std::vector<std::string>>>;

  /// A row whose field is a member of the options ...
  template <class T>
  OptionRow(std::string flag, std::string help, T Options::*member)
      : flag_(std::move(flag)), help_(std::move(help)), field_(Get<T>([member](Options& o) -> T& { return o.*member; })) {}
  /// ... or a member of one of their members (&RunOptions::config, &RunConfig::lr).
  template <class Part, class T>
  OptionRow(std::string flag, std::string help, Part Options::*part, T Part::*member)
      : flag_(std::move(flag)),
        help_(std::move(help)),
        field_(Get<T>([part, member](Options& o) -> T& { return (o.*part).*member; })) {}

  /// The check of the option's text, run before it is converted.
  OptionRow&& check(CLI::Validator v) && { check_ = std::move(v); return std::move(*this); }
  /// The report's config records the option's value under this key (without it, the config
  /// records what the option makes: a policy's text, a resolved device).
  OptionRow&& config(std::string key) && { config_key_ = std::move(key); return std::move(*this); }
  /// The name library errors use for what the row sets (FieldError); by default the config key,
  /// else the flag's words joined by '_' (--input-shape: input_shape).
  OptionRow&& field(std::string name) && { field_name_ = std::move(name); return std::move(*this); }
  /// The reproduce line gives the option even at its default (the run depends on it visibly).
  OptionRow&& always() && { always_ = true; return std::move(*this); }
  /// The option must be given.
  OptionRow&& required() && { required_ = true; return std::move(*this); }
  /// Shown under this group in --help.
  OptionRow&& group(std::string name) && { group_ = std::move(name); return std::move(*this); }
  /// Taken by a sibling subcommand too (diagnose takes the run rows marked so).
  OptionRow&& shared() && { shared_ = true; return std::move(*this); }

  const std::string& flag() const { return flag_; }
  const std::string& config_key() const { return config_key_; }
  const std::string& group_name() const { return group_; }
  std::string field_name() const {
    if (!field_name_.empty()) return field_name_;
    if (!config_key_.empty()) return config_key_;
    return keyword();
  }
  bool is_shared() const { return shared_; }
  /// The name a front end with keyword arguments gives the row: the flag's words joined by '_'
  /// (--input-requires-grad: input_requires_grad).
  std::string keyword() const { return keyword_of_flag(flag_); }

  /// Calls f(field) with the field the row sets in `o`, as its own type: how a front end that
  /// takes typed values (the Python binding) sets an option without a command line.
  template <class F>
  void visit_field(Options& o, F&& f) const {
    std::visit([&](const auto& get) { f(get(o)); }, field_);
  }
  /// The row's check of a value written as text: "" when it passes, else what is wrong.
  std::string check_text(std::string text) const { return check_ ? (*check_)(text) : std::string(); }

  /// Registers the option on `app` (or on its group there), bound to `o`.
  CLI::Option* add(CLI::App& app, Options& o) const {
    return std::visit(
        [&](const auto& get) {
          auto& value = get(o);
          using T = std::decay_t<decltype(value)>;
          CLI::Option* opt = nullptr;
          if constexpr (std::is_same_v<T, bool>) {
            opt = app.add_flag(flag_, value, help_);
          } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
            opt = app.add_option(flag_, value, help_)->delimiter(',');
          } else {
            opt = app.add_option(flag_, value, help_)->capture_default_str();
          }
          if (check_) opt->check(*check_);
          if (required_) opt->required();
          return opt;
        },
        field_);
  }

  /// " --flag value" as the reproduce line gives it; "" when the option has its default value.
  std::string reproduce(const Options& o) const {
    static const Options defaults{};
    return std::visit(
        [&](const auto& get) -> std::string {
          const auto& value = get(const_cast<Options&>(o));
          using T = std::decay_t<decltype(value)>;
          if (!always_ && value == get(const_cast<Options&>(defaults))) return "";
          if constexpr (std::is_same_v<T, bool>) {
            return value ? " " + flag_ : "";
          } else if constexpr (std::is_same_v<T, std::string>) {
            return " " + flag_ + " " + shell_quote(value);
          } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
            return " " + flag_ + " " + shell_quote(fmt::format("{}", fmt::join(value, ",")));
          } else {
            return fmt::format(" {} {}", flag_, value);
          }
        },
        field_);
  }

  /// The option's value as the report's config records it.
  nlohmann::json value(const Options& o) const {
    return std::visit([&](const auto& get) { return nlohmann::json(get(const_cast<Options&>(o))); }, field_);
  }

 private:
  std::string flag_;
  std::string help_;
  Field field_;
  std::optional<CLI::Validator> check_;
  std::string config_key_;
  std::string field_name_;
  std::string group_;
  bool always_ = false;
  bool required_ = false;
  bool shared_ = false;
};

template <class Options>
using OptionTable = std::vector<OptionRow<Options>>;

/// Registers the rows `keep` accepts (all by default), each in its --help group; returns each
/// registered row with its option, in table order.
template <class Options>
std::vector<std::pair<const OptionRow<Options>*, CLI::Option*>> add_options(
    CLI::App& app, Options& o, const OptionTable<Options>& table,
    const std::function<bool(const OptionRow<Options>&)>& keep = nullptr) {
  std::vector<std::pair<const OptionRow<Options>*, CLI::Option*>> added;
  std::map<std::string, CLI::App*> groups;
  for (const auto& row : table) {
    if (keep && !keep(row)) continue;
    CLI::App* target = &app;
    if (!row.group_name().empty()) {
      auto& group = groups[row.group_name()];
      if (!group) group = app.add_option_group(row.group_name());
      target = group;
    }
    added.emplace_back(&row, row.add(*target, o));
  }
  return added;
}

/// The reproduce line's part for the rows `keep` accepts, in table order.
template <class Options>
std::string reproduce_options(const Options& o, const OptionTable<Options>& table,
                              const std::function<bool(const OptionRow<Options>&)>& keep = nullptr) {
  std::string s;
  for (const auto& row : table) {
    if (!keep || keep(row)) s += row.reproduce(o);
  }
  return s;
}

/// The report's config entries of the rows that carry a config key.
template <class Options>
nlohmann::json config_options(const Options& o, const OptionTable<Options>& table,
                              const std::function<bool(const OptionRow<Options>&)>& keep = nullptr) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& row : table) {
    if (!row.config_key().empty() && (!keep || keep(row))) j[row.config_key()] = row.value(o);
  }
  return j;
}

/// The row whose keyword() is `keyword`, or null.
template <class Options>
const OptionRow<Options>* row_of_keyword(const OptionTable<Options>& table, const std::string& keyword) {
  for (const auto& row : table) {
    if (row.keyword() == keyword) return &row;
  }
  return nullptr;
}

/// The flag of the row that sets `field` (OptionRow::field_name), or "" when none does: how the
/// CLI names a field a library error names.
template <class Options>
std::string flag_of(const OptionTable<Options>& table, const std::string& field) {
  for (const auto& row : table) {
    if (row.field_name() == field) return row.flag();
  }
  return "";
}

}  // namespace ckcheck::cli
