#include "reports/sections.h"

#include <fmt/format.h>

namespace ckcheck {

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::vector<std::string> console_sections(const Report& r) { return {}; }
std::vector<std::string> markdown_sections(const Report& r) { return {}; }
std::string html_sections(const Report& r) { return ""; }

}  // namespace ckcheck
