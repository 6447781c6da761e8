#include "harness/support/text.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <utility>
#include <vector>

#include "harness/support/errors.h"

namespace ckcheck {

namespace {

// [+-]digits, nothing else (no space, no 0x, no words).
bool integer_syntax(const std::string& t) {
  size_t i = t.size() > 0 && (t[0] == '+' || t[0] == '-') ? 1 : 0;
  if (i == t.size()) return false;
  for (; i < t.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(t[i]))) return false;
  }
  return true;
}

// [+-](digits[.digits]|.digits)([eE][+-]digits): a decimal number as people write one -- no space,
// no hexadecimal (0x1p-1), no inf or nan.
bool decimal_syntax(const std::string& t) {
  size_t i = t.size() > 0 && (t[0] == '+' || t[0] == '-') ? 1 : 0;
  size_t digits = 0;
  while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i, ++digits;
  if (i < t.size() && t[i] == '.') {
    ++i;
    while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
    size_t exponent = 0;
    while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i, ++exponent;
    if (exponent == 0) return false;
  }
  return i == t.size();
}

}  // namespace

std::optional<long long> parse_int(const std::string& text) {
  if (!integer_syntax(text)) return std::nullopt;
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (!text.empty() && used == text.size()) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

std::optional<double> parse_double(const std::string& text) {
  if (!decimal_syntax(text)) return std::nullopt;
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (!text.empty() && used == text.size() && std::isfinite(v)) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

std::string first_line(const std::string& message) {
  const auto cut = message.find('\n');
  return cut == std::string::npos ? message : message.substr(0, cut);
}

int64_t parse_bytes(const std::string& text) {
  // The number, then the unit: split where the digits end.
  size_t used = 0;
  while (used < text.size() && (std::isdigit(static_cast<unsigned char>(text[used])) || text[used] == '.')) ++used;
  const auto number = parse_double(text.substr(0, used));
  const double v = number ? *number : -1;
  if (!number) used = 0;
  std::string unit = used ? text.substr(used) : "";
  // A unit is required: a bare number means a fraction elsewhere (run --memory-budget 0.5), never bytes.
  const std::vector<std::pair<std::string, double>> units = {
      {"B", 1},          {"KiB", 1024.0},   {"MiB", 1048576.0}, {"GiB", 1073741824.0},
      {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
      {"K", 1024.0}, {"M", 1048576.0}, {"G", 1073741824.0}};
  for (const auto& [name, factor] : units) {
    if (!(used && unit == name && v >= 0 && std::isfinite(v))) continue;
    // 2^62 bytes (4 EiB) is beyond any machine; a larger number is a typing error, not a budget.
    if (v * factor > 4611686018427387904.0) {
      throw UsageError(fmt::format("memory size '{}' is beyond any machine (more than 4 EiB); write it as 8GiB, 512MiB or 1.5GB",
                                   text));
    }
    if (v * factor != std::floor(v * factor)) {
      throw UsageError(fmt::format("memory size '{}' is not a whole number of bytes; write it as 8GiB, 512MiB or 1.5GB",
                                   text));
    }
    return static_cast<int64_t>(v * factor);
  }
  throw UsageError(fmt::format("memory size '{}' not understood: give it with its unit, as 8GiB, 512MiB, 1.5GB or 4096B "
                               "(a bare number is no size)",
                               text));
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::abs(b) >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

}  // namespace ckcheck

namespace ckcheck {

namespace {

std::string render_fields(const std::string& text, const std::function<std::string(const std::string&)>& name_of) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    size_t end = i + 1;
    // "@name" after a space, a bracket or at the start: a value given by the user (a path with
    // user@host in it) is left alone.
    const bool starts = text[i] == '@' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '(');
    while (starts && end < text.size() && (std::islower(static_cast<unsigned char>(text[end])) ||
                                                   std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '_')) {
      ++end;
    }
    if (!starts || end == i + 1) {
      out += text[i];
      continue;
    }
    out += name_of(text.substr(i + 1, end - i - 1));
    i = end - 1;
  }
  return out;
}

}  // namespace

bool is_interruption(const std::exception& e) {
  if (dynamic_cast<const Interrupted*>(&e)) return true;
  const std::string m = e.what();
  for (size_t at = m.find("KeyboardInterrupt"); at != std::string::npos; at = m.find("KeyboardInterrupt", at + 1)) {
    const size_t end = at + std::string("KeyboardInterrupt").size();
    const bool starts = at == 0 || m[at - 1] == ' ' || m[at - 1] == '\n';
    if (starts && (end == m.size() || m[end] == ':' || m[end] == '\n')) return true;
  }
  return false;
}

void rethrow_stops(const std::exception& e) {
  if (is_interruption(e)) throw Interrupted();
  if (const auto* setup = dynamic_cast<const SetupError*>(&e)) throw *setup;
}

FieldError::FieldError(std::string field, std::string text)
    : UsageError(render_fields(text, [](const std::string& name) { return name; })),
      field_(std::move(field)),
      text_(std::move(text)) {}

std::string FieldError::render(const std::function<std::string(const std::string&)>& name_of) const {
  return render_fields(text_, name_of);
}

bool names_site(const std::string& text, const std::string& site) {
  if (site.empty()) return false;
  auto part = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; };
  for (size_t at = text.find(site); at != std::string::npos; at = text.find(site, at + 1)) {
    const size_t end = at + site.size();
    const bool before = at == 0 || !part(text[at - 1]);
    // A full stop ending a sentence is not a path's next part.
    const bool after = end == text.size() || !part(text[end]) ||
                       (text[end] == '.' && (end + 1 == text.size() || !part(text[end + 1])));
    if (before && after) return true;
  }
  return false;
}

std::string text_after(const std::string& text, const std::string& key, const char* ends) {
  const auto at = text.find(key);
  if (at == std::string::npos) return "";
  const auto begin = at + key.size();
  const auto end = text.find_first_of(ends, begin);
  return text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

std::string shell_quote(const std::string& arg) {
  if (arg.empty()) return "''";
  bool plain = true, control = false;
  for (char c : arg) {
    const auto u = static_cast<unsigned char>(c);
    plain = plain && (std::isalnum(u) || std::string("-_./:=,+@%").find(c) != std::string::npos);
    control = control || u < 0x20 || u == 0x7f;
  }
  if (plain) return arg;
  if (control) {
    // bash's $'...': every character as it is, control characters as escapes, on one line.
    std::string out = "$'";
    for (char c : arg) {
      const auto u = static_cast<unsigned char>(c);
      if (c == '\\' || c == '\'') {
        out += '\\';
        out += c;
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '\t') {
        out += "\\t";
      } else if (u < 0x20 || u == 0x7f) {
        out += fmt::format("\\x{:02x}", u);
      } else {
        out += c;
      }
    }
    return out + "'";
  }
  std::string out = "'";
  for (char c : arg) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string visible(const std::string& text) {
  std::string out;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += ' ';
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace ckcheck
