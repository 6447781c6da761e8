// The words of an enum, in one table per enum: printed with name_in, parsed with parse_in, so that
// an enum value is compared as a value everywhere and as a word only where it is read or written.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <utility>

namespace ckcheck {

template <typename E>
using EnumName = std::pair<E, const char*>;

/// The word of `value` in `table` ("" when the table has none).
template <typename E, size_t N>
const char* name_in(const EnumName<E> (&table)[N], E value) {
  for (const auto& [e, name] : table) {
    if (e == value) return name;
  }
  return "";
}

/// The value whose word is `text`, if any.
template <typename E, size_t N>
std::optional<E> parse_in(const EnumName<E> (&table)[N], std::string_view text) {
  for (const auto& [e, name] : table) {
    if (text == name) return e;
  }
  return std::nullopt;
}

}  // namespace ckcheck
