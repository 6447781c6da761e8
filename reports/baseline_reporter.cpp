// Baseline: the verdict, and each check's status and causes, as a file CI keeps beside the code
// (--export FILE, or --report baseline=FILE); a later run given it (--baseline FILE) fails when any
// of them changed. Nothing that varies between machines (numbers, times, messages) is in it.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <set>
#include <sstream>

#include "harness/support/errors.h"
#include "reports/report.h"

namespace ckcheck {
namespace {

constexpr int kBaselineFormat = 1;

// Each check's status and causes, by id, from a baseline or a whole JSON report.
struct Judged {
  std::string status;
  std::set<std::string> causes;
};
using JudgedChecks = std::map<std::string, Judged>;

JudgedChecks judged_of(const nlohmann::json& checks) {
  JudgedChecks out;
  for (const auto& c : checks) {
    Judged j;
    j.status = c.at("status").get<std::string>();
    if (c.contains("causes")) {
      for (const auto& cause : c["causes"]) j.causes.insert(cause.get<std::string>());
    } else if (c.contains("findings")) {
      for (const auto& f : c["findings"]) j.causes.insert(f.at("cause").get<std::string>());
    }
    out[c.at("id").get<std::string>()] = j;
  }
  return out;
}

std::string causes_text(const std::set<std::string>& causes) {
  return causes.empty() ? "no cause" : fmt::format("{}", fmt::join(causes, ", "));
}

class BaselineReporter : public Reporter {
 public:
  void write(const Report& report, std::ostream& out) override { out << baseline_json(report).dump(2) << "\n"; }
};

}  // namespace

nlohmann::json baseline_json(const Report& report) {
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& c : report.checks) {
    std::set<std::string> causes;
    for (const auto& f : c.findings) causes.insert(f.cause.name());
    checks.push_back({{"id", c.id}, {"status", status_name(c.status)}, {"causes", causes}});
  }
  return {{"tool", "ckcheck"},           {"baseline", kBaselineFormat}, {"command", report.command},
          {"model", report.model.name}, {"reproduce", report.reproduce}, {"verdict", verdict_name(report.verdict)},
          {"checks", checks}};
}

nlohmann::json read_baseline(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw FieldError("baseline", fmt::format("@baseline '{}' cannot be read; give a file @export wrote", path));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
    if (j.value("tool", "") != "ckcheck" || !j.contains("verdict") || !j.contains("checks")) throw std::runtime_error("");
    judged_of(j.at("checks"));  // every check with its id and status
    j.at("verdict").get<std::string>();
  } catch (const std::exception&) {
    throw FieldError("baseline", fmt::format("@baseline '{}' is not a ckcheck baseline or JSON report; write one with "
                                             "@export", path));
  }
  return j;
}

std::vector<std::string> baseline_changes(const nlohmann::json& stored, const Report& now) {
  std::vector<std::string> changes;
  const auto was = stored.at("verdict").get<std::string>();
  const std::string is = verdict_name(now.verdict);
  if (was != is) changes.push_back(fmt::format("verdict {} -> {}", was, is));
  const auto before = judged_of(stored.at("checks"));
  const auto after = judged_of(baseline_json(now).at("checks"));
  for (const auto& [id, b] : before) {
    const auto it = after.find(id);
    if (it == after.end()) {
      changes.push_back(fmt::format("{}: not run (was {})", id, b.status));
      continue;
    }
    const auto& a = it->second;
    if (a.status != b.status) changes.push_back(fmt::format("{}: {} -> {}", id, b.status, a.status));
    if (a.causes != b.causes) {
      changes.push_back(fmt::format("{}: causes {} -> {}", id, causes_text(b.causes), causes_text(a.causes)));
    }
  }
  for (const auto& [id, a] : after) {
    if (!before.count(id)) changes.push_back(fmt::format("{}: new, {}", id, a.status));
  }
  return changes;
}

std::unique_ptr<Reporter> make_baseline_reporter() { return std::make_unique<BaselineReporter>(); }

}  // namespace ckcheck
