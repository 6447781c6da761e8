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

namespace {

std::string str(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return "";
  return j[key].is_string() ? j[key].get<std::string>() : j[key].dump();
}

std::string op_cell(const nlohmann::json& v) {
  if (v.is_null()) return "(none)";
  return fmt::format("{}{} {} {}{}", std::string(2 * std::min(v.value("depth", 0), 6), ' '), str(v, "name"),
                     str(v, "dtypes"), str(v, "shapes"),
                     str(v, "autocast").empty() || str(v, "autocast") == "off" ? "" : " @" + str(v, "autocast"));
}

std::string nan_text(const nlohmann::json& n) {
  if (n.is_null()) return "none";
  return fmt::format("{} at {} ({}{})", str(n, "op"), str(n, "site").empty() ? "(outside any site)" : str(n, "site"),
                     str(n, "phase"), str(n, "node").empty() ? "" : ", in " + str(n, "node"));
}

// The diagnosis as lines of text (console and, fenced, Markdown).
std::vector<std::string> diagnosis_lines(const nlohmann::json& d) {
  std::vector<std::string> out;
  out.push_back("diagnosis: " + str(d, "summary"));
  if (!d["sites"].empty()) {
    out.push_back(d.value("interaction", false) ? "  sites whose checkpointing changes the result, together:"
                                                : "  sites whose checkpointing changes the result:");
    for (const auto& s : d["sites"]) {
      out.push_back(fmt::format("    {}  {}: {}", str(s, "site"), str(s, "cause"), str(s, "evidence")));
      out.push_back(fmt::format("    {}  fix: {}", std::string(str(s, "site").size(), ' '), str(s, "hint")));
    }
  }
  const auto& od = d["first_divergent_op"];
  if (!od.is_null()) {
    if (od.value("index", -1) < 0) {
      out.push_back(fmt::format("  op diff of {}: {}", str(od, "site"), str(od, "note")));
    } else {
      const auto name = od["forward"].is_null() ? str(od["recompute"], "name") : str(od["forward"], "name");
      std::string what = str(od, "what");
      if (what == "values") what = fmt::format("values differ (max abs {})", od.value("max_abs", 0.0));
      else if (what == "count") what = fmt::format("the forward ran {} ops, the recompute {}", od.value("forward_ops", 0), od.value("recompute_ops", 0));
      else if (what == "error") what = str(od, "note");
      else what += " differs";
      out.push_back(fmt::format("  first divergent op: {} (op {} of {}): {}{}", name, od.value("index", -1),
                                str(od, "site"), what, str(od, "innermost").empty() ? "" : "; inside it, " + str(od, "innermost")));
      out.push_back(fmt::format("      {:>4}  {:<46} {}", "op", "forward", "recompute"));
      for (const auto& row : od["context"]) {
        const auto& f = row["forward"];
        const auto& r = row["recompute"];
        const int idx = f.is_null() ? r.value("index", -1) : f.value("index", -1);
        out.push_back(fmt::format("    {} {:>4}  {:<46} {}", row.value("same", true) ? " " : ">", idx, op_cell(f), op_cell(r)));
      }
    }
  }
  const auto& n = d["nan_origin"];
  if (!n["reference"].is_null() || !n["checkpointed"].is_null()) {
    out.push_back(fmt::format("  NaN/Inf origin without checkpointing: {}", nan_text(n["reference"])));
    out.push_back(fmt::format("  NaN/Inf origin with checkpointing:    {}{}", nan_text(n["checkpointed"]),
                              n.value("without_checkpointing", false) ? " (it exists without checkpointing too)"
                                                                      : " (checkpointing introduced it)"));
  }
  return out;
}

}  // namespace

std::vector<std::string> console_sections(const Report& r) {
  std::vector<std::string> out;
  if (r.sections.contains("diagnosis")) {
    for (auto& l : diagnosis_lines(r.sections["diagnosis"])) out.push_back(std::move(l));
  }
  return out;
}

std::vector<std::string> markdown_sections(const Report& r) {
  std::vector<std::string> out;
  if (r.sections.contains("diagnosis")) {
    out.push_back("### Diagnosis\n");
    out.push_back("```");
    for (auto& l : diagnosis_lines(r.sections["diagnosis"])) out.push_back(std::move(l));
    out.push_back("```\n");
  }
  return out;
}

std::string html_sections(const Report& r) {
  std::string out;
  if (r.sections.contains("diagnosis")) {
    out += "<h2>Diagnosis</h2>\n<pre>";
    for (const auto& l : diagnosis_lines(r.sections["diagnosis"])) out += html_escape(l) + "\n";
    out += "</pre>\n";
  }
  return out;
}

}  // namespace ckcheck
