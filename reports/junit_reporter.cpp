// JUnit XML: one test case per check, the summary as the failure message, the findings as its
// text; readable by GitLab, Jenkins and the GitHub test-report actions.
#include <fmt/format.h>

#include "reports/report.h"

namespace ckcheck {
namespace {

class JunitReporter : public Reporter {
 public:
  void write(const Report& r, std::ostream& out) override {
    size_t failures = 0, errors = 0, skipped = 0;
    for (const auto& c : r.checks) {
      failures += c.status == Status::kFail;
      errors += c.status == Status::kError;
      skipped += c.status == Status::kSkip;
    }
    const std::string suite = fmt::format("ckcheck {} {}", r.command, r.model.name);
    out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    out << fmt::format("<testsuites name=\"ckcheck\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{:.3f}\">\n",
                       r.checks.size(), failures, errors, skipped, r.seconds);
    out << fmt::format("  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{:.3f}\">\n",
                       escape_markup(suite), r.checks.size(), failures, errors, skipped, r.seconds);
    out << "    <properties>\n";
    out << fmt::format("      <property name=\"verdict\" value=\"{}\"/>\n", verdict_name(r.verdict));
    out << fmt::format("      <property name=\"policy\" value=\"{}\"/>\n", escape_markup(r.model.policy));
    out << fmt::format("      <property name=\"reproduce\" value=\"{}\"/>\n", escape_markup(r.reproduce));
    out << "    </properties>\n";
    const std::string cls = escape_markup(fmt::format("ckcheck.{}", r.model.name));
    for (const auto& c : r.checks) {
      out << fmt::format("    <testcase classname=\"{}\" name=\"{}\" time=\"0\"", cls, escape_markup(c.id));
      std::string body;
      for (const auto& f : c.findings) {
        body += fmt::format("[{}] {}{}{}\nfix: {}\n", cause_name(f.cause), f.site.empty() ? "" : f.site + ": ",
                            f.tensor.empty() ? "" : "(" + f.tensor + ") ", f.message, f.hint);
      }
      body += "reproduce: " + r.reproduce + "\n";
      switch (c.status) {
        case Status::kFail:
          out << fmt::format(">\n      <failure message=\"{}\" type=\"{}\">{}</failure>\n    </testcase>\n",
                             escape_markup(c.summary),
                             c.findings.empty() ? "fail" : cause_name(c.findings.front().cause),
                             escape_markup(body));
          break;
        case Status::kError:
          out << fmt::format(">\n      <error message=\"{}\">{}</error>\n    </testcase>\n",
                             escape_markup(c.summary), escape_markup(body));
          break;
        case Status::kSkip:
          out << fmt::format(">\n      <skipped message=\"{}\"/>\n    </testcase>\n", escape_markup(c.summary));
          break;
        case Status::kWarn:
          out << fmt::format(">\n      <system-out>WARNING: {}\n{}</system-out>\n    </testcase>\n",
                             escape_markup(c.summary), escape_markup(body));
          break;
        case Status::kPass:
          out << fmt::format(">\n      <system-out>{}</system-out>\n    </testcase>\n", escape_markup(c.summary));
          break;
      }
    }
    out << "  </testsuite>\n</testsuites>\n";
  }
};

}  // namespace

std::unique_ptr<Reporter> make_junit_reporter() { return std::make_unique<JunitReporter>(); }

}  // namespace ckcheck
