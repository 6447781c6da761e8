#include "harness/support/enum_names.h"
#include "analyses/diagnose.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "checks/common.h"
#include "checks/evidence.h"

namespace ckcheck {
namespace {

using Unit = std::vector<std::string>;

// Output copies are kept for the op diff up to this many bytes (the traced run is one step of
// the model the user is already running; 256 MiB bounds it on a large one).
constexpr int64_t kValueBudget = 256ll << 20;

// Ops whose output contents say nothing when read as the op ends: uninitialised memory, and
// views and aliases, which may look at a buffer that the op calling them has yet to fill (mm's
// resolve_conj of its result) and otherwise repeat what their base already showed.
bool contents_uninformative(const std::string& name) {
  static const std::set<std::string> views = {
      "aten::resolve_conj", "aten::resolve_neg", "aten::as_strided", "aten::as_strided_",
      "aten::view",         "aten::_unsafe_view", "aten::reshape",   "aten::_reshape_alias",
      "aten::t",            "aten::transpose",    "aten::permute",   "aten::expand",
      "aten::select",       "aten::slice",        "aten::narrow",    "aten::detach",
      "aten::alias",        "aten::squeeze",      "aten::unsqueeze", "aten::view_as",
      "aten::expand_as",    "aten::unbind",       "aten::split",     "aten::chunk",
      "aten::diagonal",     "aten::unfold",       "aten::flatten",   "aten::lift_fresh"};
  return name.find("empty") != std::string::npos || name == "aten::resize_" ||
         name == "aten::set_" || views.count(name) > 0;
}

std::string join_shapes(const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<std::string> parts;
  for (const auto& s : shapes) parts.push_back(fmt::format("[{}]", fmt::join(s, ",")));
  return fmt::format("{}", fmt::join(parts, " "));
}

OpView view_of(const OpRecord& r, int64_t index) {
  return {index, r.name, r.depth, r.site, join_shapes(r.shapes), fmt::format("{}", fmt::join(r.dtypes, ",")), r.autocast};
}

// What differs between two ops at the same position.
OpDifference difference(const OpRecord& a, const OpRecord& b) {
  if (a.name != b.name) return OpDifference::kName;
  if (a.shapes != b.shapes) return OpDifference::kShape;
  if (a.dtypes != b.dtypes) return OpDifference::kDtype;
  if (a.autocast != b.autocast) return OpDifference::kAutocast;
  if (!contents_uninformative(a.name) && a.fingerprints != b.fingerprints) return OpDifference::kValues;
  return OpDifference::kNone;
}

// Under data parallelism every rank runs the diagnosis's steps in lockstep: what decides the next
// step is agreed. Whether something holds on any rank (a rank's own outputs may differ alone).
bool on_any_rank(Runner& runner, bool mine) {
  auto* dp = runner.config().data_parallel;
  return dp ? dp->any_rank(mine) : mine;
}

class Bisector {
 public:
  Bisector(Runner& runner, const Plan& plan, const Tolerance& tolerance, const StepRecord& reference)
      : runner_(runner), plan_(plan), tolerance_(tolerance), reference_(reference) {}

  bool diverges(const std::vector<Unit>& units) {
    Plan p = plan_;
    p.units = units;
    StepOptions o;
    o.evidence = false;
    const auto rec = runner_.run(&p, o, "bisection");
    ++runs;
    bool differs = !rec.error.empty();
    for (const auto& d : compare_records(reference_, rec, tolerance_)) differs = differs || !d.equal;
    return on_any_rank(runner_, differs);
  }

  // Every unit that diverges on its own, by halves.
  void find(const std::vector<Unit>& units, std::vector<Unit>& out) {
    if (units.empty() || !diverges(units)) return;
    if (units.size() == 1) {
      out.push_back(units[0]);
      return;
    }
    const auto mid = units.begin() + static_cast<int64_t>(units.size() / 2);
    find({units.begin(), mid}, out);
    find({mid, units.end()}, out);
  }

  // A 1-minimal diverging subset, for divergence that needs several units together.
  std::vector<Unit> minimise(std::vector<Unit> units) {
    for (size_t i = 0; i < units.size() && units.size() > 1;) {
      auto without = units;
      without.erase(without.begin() + static_cast<int64_t>(i));
      if (diverges(without)) {
        units = without;
      } else {
        ++i;
      }
    }
    return units;
  }

  int64_t runs = 0;

 private:
  Runner& runner_;
  const Plan& plan_;
  const Tolerance& tolerance_;
  const StepRecord& reference_;
};

constexpr const char* kUnexplained = "checkpointing this site changes the result, and no check names a more specific cause";

// Cause of a unit from the check results, or from the evidence.
SiteDiagnosis classify(const std::string& site, const RunOutcome& outcome,
                       const std::vector<SiteExplanation>& explained) {
  SiteDiagnosis s;
  s.site = site;
  const auto& hazards = hazard_check_ids();
  for (const auto& r : outcome.results) {
    if (std::find(hazards.begin(), hazards.end(), r.id) == hazards.end() || r.status != Status::kFail) continue;
    for (const auto& f : r.findings) {
      if (f.site == site) {
        s.cause = f.cause;
        s.evidence = f.message;
        s.hint = f.hint;
        return s;
      }
    }
  }
  for (const auto& e : explained) {
    if (e.site == site) {
      s.cause = e.cause;
      s.evidence = e.evidence;
      s.hint = e.hint.empty() ? fix_hint(e.cause) : e.hint;
      return s;
    }
  }
  for (const auto& r : outcome.results) {
    for (const auto& f : r.findings) {
      if (f.site == site && f.cause != Cause::kVacuous) {
        s.cause = f.cause;
        s.evidence = f.message;
        s.hint = f.hint;
        return s;
      }
    }
  }
  s.evidence = kUnexplained;
  s.hint = fix_hint(s.cause);
  return s;
}

// The first op, in order, whose output holds NaN (or, when none does, Inf), descending to the
// innermost op that produced it.
NanOrigin nan_origin(const std::vector<OpRecord>& ops) {
  NanOrigin o;
  for (bool want_nan : {true, false}) {
    for (size_t i = 0; i < ops.size(); ++i) {
      const bool hit = want_nan ? ops[i].nan : ops[i].nonfinite;
      if (!hit) continue;
      size_t at = i;
      // Descend: the first child (an op nested directly in it) with the same defect.
      for (bool moved = true; moved;) {
        moved = false;
        for (size_t j = at + 1; j < ops.size() && ops[j].depth > ops[at].depth; ++j) {
          if (ops[j].depth == ops[at].depth + 1 && (want_nan ? ops[j].nan : ops[j].nonfinite)) {
            at = j;
            moved = true;
            break;
          }
        }
      }
      o.found = true;
      o.phase = ops[at].phase;
      o.op = ops[at].name;
      o.site = ops[at].site;
      o.node = ops[at].node;
      o.index = ops[at].index;
      return o;
    }
  }
  return o;
}

// The ops of one checkpointed call in its forward and in its recompute, in order.
struct CallOps {
  std::vector<const OpRecord*> forward, recompute;
};

CallOps ops_of_call(const StepRecord& rec, const std::string& site, int64_t& call) {
  call = -1;
  for (const auto& c : rec.calls) {
    if (c.site == site) {
      call = c.call;
      break;
    }
  }
  CallOps ops;
  for (const auto& op : rec.ops) {
    if (op.call != call || call < 0) continue;
    // A checkpoint's own bookkeeping (PyTorch's detaches its inputs for the recompute) changes
    // no value: it is not the model's computation.
    if (op.name == "aten::detach" || op.name == "detach") continue;
    if (op.phase == Phase::kForward) ops.forward.push_back(&op);
    if (op.phase == Phase::kRecompute) ops.recompute.push_back(&op);
  }
  return ops;
}

// Where the values first differ: the largest difference, and the innermost op that differs first.
void describe_value_difference(const CallOps& ops, size_t first, OpDiff& d) {
  const auto& fwd = ops.forward;
  const auto& rec = ops.recompute;
  const size_t n = std::min(fwd.size(), rec.size());
  const auto& a = fwd[first]->values;
  const auto& b = rec[first]->values;
  for (size_t k = 0; k < a.size() && k < b.size(); ++k) {
    d.max_abs = std::max(d.max_abs, compare_tensors(a[k], b[k], Tolerance()).max_abs);
  }
  // Innermost: follow the first differing child down.
  size_t at = first;
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t j = at + 1; j < n && fwd[j]->depth > fwd[at]->depth; ++j) {
      if (fwd[j]->depth == fwd[at]->depth + 1 && difference(*fwd[j], *rec[j]) != OpDifference::kNone) {
        at = j;
        moved = true;
        break;
      }
    }
  }
  if (at != first && fwd[at]->name != fwd[first]->name) d.innermost = fwd[at]->name;
}

// The ops around the first difference, side by side.
void add_context(const CallOps& ops, size_t first, OpDiff& d) {
  const auto& fwd = ops.forward;
  const auto& rec = ops.recompute;
  const size_t lo = first >= 3 ? first - 3 : 0;
  for (size_t i = lo; i < first + 4 && (i < fwd.size() || i < rec.size()); ++i) {
    OpView f = i < fwd.size() ? view_of(*fwd[i], static_cast<int64_t>(i)) : OpView{};
    OpView r = i < rec.size() ? view_of(*rec[i], static_cast<int64_t>(i)) : OpView{};
    d.context.emplace_back(f, r);
    d.context_same.push_back(i < fwd.size() && i < rec.size() && difference(*fwd[i], *rec[i]) == OpDifference::kNone);
  }
}

std::optional<OpDiff> op_diff(Runner& runner, const Plan& plan, const Unit& unit) {
  Plan p = plan;
  p.units = {unit};
  StepOptions o;
  o.trace = TraceLevel::kFull;
  o.value_budget_bytes = kValueBudget;
  // Let the step go on where the checkpoint would refuse a changed input: the diff then shows
  // what the recompute would have computed.
  o.checkpoint = runner.config().checkpoint;
  o.checkpoint->check_input_versions = false;
  const auto rec = runner.run(&p, o, "diagnosis");
  OpDiff d;
  d.site = Plan::unit_label(unit);
  int64_t call = -1;
  const auto ops = ops_of_call(rec, d.site, call);
  const auto& fwd = ops.forward;
  const auto& rec_ops = ops.recompute;
  d.forward_ops = static_cast<int64_t>(fwd.size());
  d.recompute_ops = static_cast<int64_t>(rec_ops.size());
  if (call < 0 || fwd.empty()) {
    d.note = rec.error.empty() ? "the site ran no op in its forward" : "the traced step failed: " + rec.error;
    return d;
  }
  if (rec_ops.empty()) {
    d.note = rec.error.empty() ? "no gradient reached the site, so it was not recomputed"
                               : "the recompute did not run: " + rec.error;
    return d;
  }
  const size_t n = std::min(fwd.size(), rec_ops.size());
  size_t first = n;
  for (size_t i = 0; i < n && first == n; ++i) {
    d.what = difference(*fwd[i], *rec_ops[i]);
    if (d.what != OpDifference::kNone) first = i;
  }
  if (first == n) {
    if (fwd.size() == rec_ops.size()) {
      d.what = OpDifference::kNone;
      d.note = "the forward and the recompute ran the same ops with the same outputs";
      return d;
    }
    d.what = OpDifference::kCount;
  }
  d.index = static_cast<int64_t>(first);
  if (first < fwd.size()) d.forward = view_of(*fwd[first], static_cast<int64_t>(first));
  if (first < rec_ops.size()) d.recompute = view_of(*rec_ops[first], static_cast<int64_t>(first));
  if (d.what == OpDifference::kValues) describe_value_difference(ops, first, d);
  // A recompute op without outputs, last before the step failed: the op threw.
  if (!rec.error.empty() && first < rec_ops.size() && first + 1 == rec_ops.size() &&
      rec_ops[first]->shapes.empty() && first < fwd.size() && !fwd[first]->shapes.empty()) {
    d.what = OpDifference::kError;
    d.note = "the recompute stopped at this op: " + rec.error;
  }
  add_context(ops, first, d);
  return d;
}

}  // namespace

const char* op_difference_name(OpDifference what) {
  static constexpr EnumName<OpDifference> kNames[] = {
      {OpDifference::kNone, ""},         {OpDifference::kName, "name"},     {OpDifference::kShape, "shape"},
      {OpDifference::kDtype, "dtype"},   {OpDifference::kAutocast, "autocast"}, {OpDifference::kValues, "values"},
      {OpDifference::kCount, "count"},   {OpDifference::kError, "error"}};
  return name_in(kNames, what);
}

namespace {

// One compiled whole (the model's own switch, or the memory budget): no unit can be checkpointed
// without the others, so the compiled graphs name the sites -- the modules of the random ops the
// backward recomputes with new numbers.
void compiled_culprits(const RunOutcome& outcome, const std::vector<SiteExplanation>& explained, Diagnosis& d) {
  for (const auto& e : explained) d.sites.push_back(classify(e.site, outcome, explained));
  if (d.sites.empty()) {
    d.summary = "the compiled checkpointed step differs, and its compiled graphs recompute no random op with new "
                "numbers; with --checkpoint torch the blocks are compiled with checkpoints one set at a time";
  }
}

// Even two plain steps differ: the model is not repeatable, so bisecting over checkpointing would
// blame every site. The probe's findings say which sites are.
std::vector<Unit> probed_culprits(const Plan& plan, const RunOutcome& outcome) {
  std::vector<Unit> culprits;
  for (const auto& r : outcome.results) {
    if (r.id != "determinism") continue;
    for (const auto& f : r.findings) {
      for (const auto& u : plan.units) {
        if (Plan::unit_label(u) == f.site) culprits.push_back(u);
      }
    }
  }
  return culprits;
}

// The probe's findings are each rank's own: the sites traced next are rank 0's.
std::vector<Unit> rank0_culprits(DataParallel& dp, const Plan& plan, const std::vector<Unit>& culprits) {
  std::string mask;
  for (const auto& u : plan.units) mask += std::find(culprits.begin(), culprits.end(), u) != culprits.end() ? '1' : '0';
  mask = dp.rank0(mask);
  std::vector<Unit> out;
  for (size_t i = 0; i < plan.units.size() && i < mask.size(); ++i) {
    if (mask[i] == '1') out.push_back(plan.units[i]);
  }
  return out;
}

// A site no check explains (the step stopped before its recompute ran) takes a dtype cause from
// its own op diff when the first op that differs gives another dtype.
void dtype_from_op_diff(const CheckContext& ctx, Diagnosis& d) {
  if (!d.op_diff || d.op_diff->index < 0 || d.sites.front().evidence != kUnexplained) return;
  const auto& o = *d.op_diff;
  if (o.forward.dtypes.empty() || o.recompute.dtypes.empty() || o.forward.dtypes == o.recompute.dtypes) return;
  auto& s = d.sites.front();
  s.cause = dtype_cause(ctx);
  s.evidence = fmt::format("op {} of the site gives {} ({}) in the forward but {} ({}) in the recompute", o.index,
                           o.forward.dtypes, o.forward.name, o.recompute.dtypes, o.recompute.name);
  s.hint = fix_hint(s.cause);
}

// Which checkpointed units change the result: bisection over the plan, or, when two plain steps
// already differ, the units the determinism probe named.
void find_culprits(Runner& runner, const Plan& plan, const Tolerance& tolerance, const RunOutcome& outcome,
                   Diagnosis& d) {
  CheckContext ctx{runner.model(), plan, runner.config(), tolerance, outcome.records, outcome.diffs};
  const auto explained = explain_sites(ctx);
  if (outcome.records.compiled && outcome.records.compiled->whole_graph) return compiled_culprits(outcome, explained, d);
  Bisector b(runner, plan, tolerance, outcome.records.reference);
  std::vector<Unit> culprits;
  const bool unstable = b.diverges({});
  if (unstable) {
    culprits = probed_culprits(plan, outcome);
  } else {
    b.find(plan.units, culprits);
    if (culprits.empty() && b.diverges(plan.units)) {
      culprits = b.minimise(plan.units);
      d.interaction = culprits.size() > 1;
    }
  }
  d.bisection_runs = b.runs;
  if (auto* dp = runner.config().data_parallel) culprits = rank0_culprits(*dp, plan, culprits);
  for (const auto& u : culprits) d.sites.push_back(classify(Plan::unit_label(u), outcome, explained));
  // A compiled unit's ops run inside the compiled graph, out of the tracer's sight.
  if (!culprits.empty() && !outcome.records.compiled) d.op_diff = op_diff(runner, plan, culprits.front());
  dtype_from_op_diff(ctx, d);
  if (unstable) {
    d.summary = "two plain steps already differ: the model is not repeatable without checkpointing";
    if (!d.sites.empty()) d.summary += fmt::format("; {} does not repeat ({})", d.sites.front().site, cause_name(d.sites.front().cause));
  }
}

std::string summary_of(const Diagnosis& d) {
  std::vector<std::string> parts;
  if (!d.diverges && !d.non_finite) parts.push_back("nothing diverges: the checkpointed step equals the plain step");
  if (!d.sites.empty()) {
    std::vector<std::string> names;
    for (const auto& s : d.sites) names.push_back(fmt::format("{} ({})", s.site, cause_name(s.cause)));
    parts.push_back(fmt::format("checkpointing {} changes the result{}", fmt::join(names, ", "),
                                d.interaction ? ", but only together" : ""));
  } else if (d.diverges) {
    parts.push_back("the checkpointed step differs, but no checkpointed site does on its own");
  }
  if (d.op_diff && d.op_diff->index >= 0) {
    const auto& o = *d.op_diff;
    parts.push_back(fmt::format("first divergent op: {} (op {} of {}, {}){}", o.forward.index >= 0 ? o.forward.name : o.recompute.name,
                                o.index, o.site, op_difference_name(o.what), o.innermost.empty() ? "" : ", inside it " + o.innermost));
  }
  if (d.nan_reference.found || d.nan_checkpointed.found) {
    const auto& n = d.nan_reference.found ? d.nan_reference : d.nan_checkpointed;
    parts.push_back(fmt::format("NaN/Inf first from {} at {} in the {}{}", n.op, n.site.empty() ? "(outside any site)" : n.site,
                                phase_name(n.phase), d.nan_reference.found ? "; it exists without checkpointing too"
                                                               : "; checkpointing introduced it"));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace

Diagnosis diagnose(Runner& runner, const Plan& plan, const Tolerance& tolerance,
                   const RunOutcome& outcome) {
  Diagnosis d;
  for (const auto& t : outcome.diffs) {
    d.diverges = d.diverges || !t.equal;
    d.non_finite = d.non_finite || t.nonfinite_reference > 0 || t.nonfinite_checkpointed > 0;
  }
  d.diverges = on_any_rank(runner, d.diverges || !outcome.records.checkpointed.error.empty());
  d.non_finite = on_any_rank(runner, d.non_finite);
  if (d.diverges) find_culprits(runner, plan, tolerance, outcome, d);
  if (d.non_finite) {
    StepOptions o;
    o.evidence = false;
    o.trace = TraceLevel::kFull;
    d.nan_reference = nan_origin(runner.run(nullptr, o, "reference, traced").ops);
    o.evidence = true;
    d.nan_checkpointed = nan_origin(runner.run(&plan, o, "checkpointed, traced").ops);
  }
  if (d.summary.empty()) d.summary = summary_of(d);
  return d;
}

}  // namespace ckcheck
