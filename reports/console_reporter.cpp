// Console: a verdict line per check, the findings under it, the worst tensors, the verdict and
// the command that reproduces the run. Colour only when asked (a terminal without NO_COLOR).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "harness/support/text.h"
#include "reports/report.h"
#include "reports/sections.h"

namespace ckcheck {
namespace {

// Text from the model on a terminal, one line each: no control characters (an escape sequence in a
// module name or an error message could rewrite the screen, a newline forge a verdict line), shown
// as escapes instead; ckcheck's own colours are added after.
std::string clean(const std::string& s) { return visible(s); }

void clean_all(std::vector<std::string>& v) {
  for (auto& s : v) s = clean(s);
}

// The report with every text the model can put in it cleaned.
Report printable(const Report& given) {
  Report r = given;
  r.model.name = clean(r.model.name);
  r.model.policy = clean(r.model.policy);
  r.model.checkpoint_reason = clean(r.model.checkpoint_reason);
  clean_all(r.model.units);
  clean_all(r.model.eval_modules);
  for (auto& c : r.checks) {
    c.summary = clean(c.summary);
    for (auto& f : c.findings) {
      f.site = clean(f.site);
      f.tensor = clean(f.tensor);
      f.message = clean(f.message);
      f.hint = clean(f.hint);
    }
  }
  for (auto& d : r.tensors) d.name = clean(d.name);
  r.reproduce = clean(r.reproduce);
  return r;
}

class ConsoleReporter : public Reporter {
 public:
  explicit ConsoleReporter(bool color) : color_(color) {}

  void write(const Report& given, std::ostream& out) override {
    const Report r = printable(given);
    out << header(r) << "\n";
    size_t width = 15;  // the ids line up, the longest one included
    for (const auto& c : r.checks) width = std::max(width, c.id.size());
    for (const auto& c : r.checks) {
      out << fmt::format("  {}  {:<{}} {}\n", status(c.status), c.id, width, c.summary);
      for (const auto& f : c.findings) {
        out << fmt::format("        {}{}{}: {}\n", f.site.empty() ? "" : f.site + " ",
                           f.tensor.empty() ? "" : "(" + f.tensor + ") ", cause_name(f.cause), f.message);
        if (!f.hint.empty()) out << "        " << dim("fix: " + f.hint) << "\n";
      }
      if (c.details.contains("findings_not_listed")) {
        out << fmt::format("        ... and {} more\n", c.details["findings_not_listed"].get<int>());
      }
    }
    if (!r.tensors.empty()) worst_tensors(r, out);
    if (r.validation) {
      for (const auto& line : validation_lines(*r.validation)) out << clean(line) << "\n";
    }
    if (r.diagnosis) {
      for (const auto& line : diagnosis_lines(*r.diagnosis)) out << clean(line) << "\n";
    }
    if (r.bench) {
      for (const auto& line : bench_lines(*r.bench)) out << clean(line) << "\n";
    }
    if (r.plan) {
      for (const auto& line : plan_lines(*r.plan, r.plan_command)) out << clean(line) << "\n";
    }
    if (r.selftest) {
      for (const auto& line : selftest_lines(*r.selftest)) out << clean(line) << "\n";
    }
    if (r.cost && r.cost->plain_step_seconds > 0) {
      out << dim(fmt::format("cost: {:.1f} plain steps of CPU time (the plain reference step, first of the run: {})", r.cost->plain_steps(),
                             seconds_text(r.cost->plain_step_seconds)))
          << "\n";
    }
    out << "verdict: " << verdict(r) << "\n";
    if (r.baseline) {
      const auto& b = *r.baseline;
      out << "baseline " << clean(b.path) << ": "
          << (b.changes.empty() ? paint("unchanged", "32;1")
                                : paint(fmt::format("{} changed", b.changes.size() == 1 ? "1 thing" : std::to_string(b.changes.size()) + " things"), "31;1") +
                                      " -- " + clean(fmt::format("{}", fmt::join(b.changes, "; "))))
          << "\n";
    }
    if (!r.reproduce.empty()) out << "reproduce: " << r.reproduce << "\n";
  }

 private:
  std::string paint(const std::string& s, const char* code) const {
    return color_ ? fmt::format("\033[{}m{}\033[0m", code, s) : s;
  }
  std::string dim(const std::string& s) const { return paint(s, "2"); }

  std::string status(Status s) const {
    switch (s) {
      case Status::kPass:
        return paint("PASS ", "32");
      case Status::kWarn:
        return paint("WARN ", "33");
      case Status::kFail:
        return paint("FAIL ", "31;1");
      case Status::kSkip:
        return paint("SKIP ", "2");
      case Status::kError:
        return paint("ERROR", "35;1");
    }
    return "";
  }

  static std::string header(const Report& r) {
    std::string h = fmt::format("ckcheck {}: {} {}", r.command, r.command == "validate-op" ? "op" : "model", r.model.name);
    if (!r.model.policy.empty()) h += fmt::format(", policy {}", r.model.policy);
    if (!r.model.units.empty() || r.command == "run" || r.command == "selftest") {
      h += fmt::format(", checkpointed {}", r.model.units.empty() ? std::string("nothing")
                                                                : fmt::format("{}", fmt::join(r.model.units, " ")));
    }
    if (r.config.contains("tolerance")) h += ", tolerance " + r.config["tolerance"].get<std::string>();
    if (r.config.contains("amp") && r.config["amp"] != "off") h += ", amp " + r.config["amp"].get<std::string>();
    if (!r.model.checkpoint.empty() && r.model.checkpoint != "ckcheck") {
      h += fmt::format("\ncheckpoint under test: {} ({})", r.model.checkpoint, r.model.checkpoint_reason);
    }
    if (r.config.value("world_size", 1) > 1) {
      const auto engine = parse_parallel_kind(r.config.value("parallel", std::string("off")));
      const auto mixed = r.config.value("mixed_precision", std::string("off"));
      h += fmt::format("\ndata-parallel: {} ranks, {} over {}", r.config["world_size"].get<int>(),
                       engine == ParallelKind::kDdp    ? "PyTorch's DistributedDataParallel"
                       : engine == ParallelKind::kFsdp ? "PyTorch's FSDP2 (fully_shard" + (mixed != "off" ? ", parameters in " + mixed : std::string()) + ")"
                                          : "ckcheck's bucketed all-reduce",
                       r.config.value("backend", std::string("?")));
    }
    if (!r.model.eval_modules.empty()) {
      h += fmt::format("\nin eval mode (as built or exported; for a TorchScript file --mode train changes that): {}", fmt::join(r.model.eval_modules, " "));
    }
    return h;
  }

  std::string verdict(const Report& r) const {
    size_t failed = 0, warned = 0, errored = 0;
    for (const auto& c : r.checks) {
      failed += c.status == Status::kFail;
      warned += c.status == Status::kWarn;
      errored += c.status == Status::kError;
    }
    std::string v = r.verdict == Verdict::kPass   ? paint("PASS", "32;1")
                    : r.verdict == Verdict::kFail ? paint("FAIL", "31;1")
                                                  : paint("ERROR", "35;1");
    if (r.selftest) {
      const auto& t = *r.selftest;
      const size_t live = t.count("caught") + t.count("other-cause") + t.count("missed");
      v += fmt::format(" ({} of {} live plants caught, {} with the right cause; the unplanted model {})",
                       live - t.count("missed"), live, t.count("caught"),
                       t.unplanted == Verdict::kPass ? "passes" : "does not pass");
    } else if (!r.checks.empty()) {
      v += fmt::format(" ({} of {} checks failed{}{})", failed, r.checks.size(),
                       errored ? fmt::format(", {} could not judge (error)", errored) : "",
                       warned ? fmt::format(", {} warned", warned) : "");
    }
    return v;
  }

  void worst_tensors(const Report& r, std::ostream& out) const {
    std::vector<const TensorDiff*> rows;
    for (const auto& d : r.tensors) rows.push_back(&d);
    std::stable_sort(rows.begin(), rows.end(), [](const TensorDiff* a, const TensorDiff* b) {
      if (a->equal != b->equal) return !a->equal;
      return a->max_rel > b->max_rel;
    });
    size_t differing = 0;
    for (const auto* d : rows) differing += !d->equal;
    if (differing == 0) {
      out << fmt::format("tensors: all {} equal\n", rows.size());
      return;
    }
    out << fmt::format("tensors: {} of {} differ; the worst:\n", differing, rows.size());
    out << fmt::format("  {:<10} {:<34} {:>4} {:>9} {:>9} {:>9} {:>11}\n", "kind", "tensor", "step",
                       "max abs", "max rel", "max ulp", "mismatched");
    for (size_t i = 0; i < rows.size() && i < 8 && !rows[i]->equal; ++i) {
      const auto& d = *rows[i];
      const std::string mism = d.missing != "none" ? "missing:" + d.missing
                                                   : fmt::format("{}/{}", d.mismatched, d.numel);
      out << fmt::format("  {:<10} {:<34} {:>4} {:>9} {:>9} {:>9} {:>11}\n", d.kind, d.name,
                         d.step, format_number(d.max_abs), format_number(d.max_rel), d.max_ulp, mism);
    }
  }

  bool color_;
};

}  // namespace

std::unique_ptr<Reporter> make_console_reporter(bool color) {
  return std::make_unique<ConsoleReporter>(color);
}

}  // namespace ckcheck
