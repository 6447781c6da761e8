// JSON: the report contract (fields may be added, never renamed).
#include "reports/report.h"

namespace ckcheck {
namespace {

class JsonReporter : public Reporter {
 public:
  void write(const Report& report, std::ostream& out) override {
    // Non-finite numbers have no JSON form; nlohmann writes them as null.
    out << report_json(report).dump(2) << "\n";
  }
};

}  // namespace

std::unique_ptr<Reporter> make_json_reporter() { return std::make_unique<JsonReporter>(); }

}  // namespace ckcheck
