#include "harness/text.h"

#include <cmath>

namespace ckcheck {

std::optional<long long> parse_int(const std::string& text) {
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (!text.empty() && used == text.size()) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

std::optional<double> parse_double(const std::string& text) {
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

}  // namespace ckcheck
