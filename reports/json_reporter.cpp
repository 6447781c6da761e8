// JSON: the report contract (fields may be added, never renamed), written here and only here.
#include <fmt/format.h>

#include "checks/common.h"
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

nlohmann::json view_json(const OpView& v) {
  if (v.index < 0) return nullptr;
  return {{"index", v.index}, {"name", v.name},     {"depth", v.depth},     {"site", v.site},
          {"shapes", v.shapes}, {"dtypes", v.dtypes}, {"autocast", v.autocast}};
}

nlohmann::json nan_json(const NanOrigin& o) {
  if (!o.found) return nullptr;
  return {{"phase", phase_name(o.phase)}, {"op", o.op}, {"site", o.site}, {"node", o.node}, {"index", o.index}};
}

nlohmann::json op_diff_json(const OpDiff& o) {
  nlohmann::json od = {{"site", o.site},
                       {"index", o.index},
                       {"what", op_difference_name(o.what)},
                       {"innermost", o.innermost},
                       {"max_abs", o.max_abs},
                       {"forward", view_json(o.forward)},
                       {"recompute", view_json(o.recompute)},
                       {"forward_ops", o.forward_ops},
                       {"recompute_ops", o.recompute_ops},
                       {"note", o.note}};
  od["context"] = nlohmann::json::array();
  for (size_t i = 0; i < o.context.size(); ++i) {
    od["context"].push_back({{"forward", view_json(o.context[i].first)},
                             {"recompute", view_json(o.context[i].second)},
                             {"same", o.context_same[i]}});
  }
  return od;
}

nlohmann::json policy_json(const PolicyBench& p, const PolicyBench* none) {
  nlohmann::json pj = {{"policy", p.policy}, {"checkpointed", p.checkpointed}, {"fits", p.fits}, {"note", p.note},
                       {"checks", p.checks ? nlohmann::json(verdict_name(*p.checks)) : nlohmann::json(nullptr)},
                       {"check_failures", p.check_failures}, {"ranked", p.ranked},
                       {"not_ranked", p.not_ranked}};
  if (p.measurement.step_seconds.empty()) {
    pj["peak_bytes"] = nullptr;
    pj["time_median_s"] = nullptr;
  } else {
    pj["peak_bytes"] = p.measurement.peak_bytes;
    pj["time_median_s"] = p.time_median_s;
    pj["time_min_s"] = p.time_min_s;
    pj["time_max_s"] = p.time_max_s;
    pj["forward_median_s"] = p.forward_median_s;
    pj["cpu_median_s"] = p.cpu_median_s;
    pj["time_spread"] = p.time_spread;
    pj["steps"] = p.measurement.step_seconds.size();
    if (none) {
      pj["peak_ratio"] = peak_ratio(p, *none);
      pj["time_ratio"] = p.time_ratio;
      pj["time_ratio_low"] = p.time_ratio_low;
      pj["time_ratio_high"] = p.time_ratio_high;
      pj["cpu_ratio"] = p.cpu_ratio;
      pj["cpu_ratio_low"] = p.cpu_ratio_low;
      pj["cpu_ratio_high"] = p.cpu_ratio_high;
      pj["instructions_ratio"] = p.instructions_ratio ? nlohmann::json(*p.instructions_ratio) : nlohmann::json(nullptr);
      // How many forwards of the plain model the checkpointing costs (the recompute should
      // cost about one forward of the checkpointed sites).
      pj["extra_time_in_forwards"] =
          none->forward_median_s > 0 ? (p.time_median_s - none->time_median_s) / none->forward_median_s : 0.0;
    }
  }
  pj["analytic_bytes"] = p.analytic_bytes ? nlohmann::json(*p.analytic_bytes) : nlohmann::json(nullptr);
  return pj;
}

}  // namespace

std::unique_ptr<Reporter> make_json_reporter() { return std::make_unique<JsonReporter>(); }

nlohmann::json selftest_json(const SelftestResult& s) {
  nlohmann::json classes = nlohmann::json::array();
  for (const auto& c : s.classes) {
    classes.push_back({{"plant", c.plant}, {"cause", c.cause}, {"what", c.what}, {"applies", c.not_applicable.empty()},
                       {"not_applicable", c.not_applicable}});
  }
  nlohmann::json cells = nlohmann::json::array();
  for (const auto& c : s.cells) {
    cells.push_back({{"plant", c.plant}, {"site", c.site}, {"cause", c.cause}, {"outcome", c.outcome},
                     {"found", c.found}, {"note", c.note}, {"cpu_seconds", c.cpu_seconds}, {"reproduce", c.reproduce}});
  }
  const double steps = s.plain_step_seconds > 0 ? s.cpu_seconds / s.plain_step_seconds : 0.0;
  return {{"classes", classes},
          {"sites", s.sites},
          {"unplanted", {{"verdict", verdict_name(s.unplanted)}, {"failing", s.unplanted_failing}}},
          {"cells", cells},
          {"counts",
           {{"caught", s.count("caught")},
            {"other_cause", s.count("other-cause")},
            {"missed", s.count("missed")},
            {"dormant", s.count("dormant")},
            {"false_alarm", s.count("false-alarm")},
            {"error", s.count("error")}}},
          {"caught_share", s.caught_share()},
          {"cpu_seconds", s.cpu_seconds},
          {"plain_step_cpu_seconds", s.plain_step_seconds},
          {"plain_steps", steps}};
}

namespace {

// The model's part: its name, options, sites, the checkpoint under test and its inputs.
nlohmann::json model_json(const Report& r) {
  nlohmann::json m = {{"name", r.model.name},       {"options", r.model.options},
                      {"sites", r.model.sites},     {"candidates", r.model.candidates},
                      {"checkpointed", r.model.checkpointed}, {"units", r.model.units},
                      {"policy", r.model.policy},           {"eval_modules", r.model.eval_modules}};
  if (!r.model.checkpoint.empty()) {
    m["checkpoint"] = r.model.checkpoint;
    m["checkpoint_reason"] = r.model.checkpoint_reason;
  }
  if (r.command != "validate-op") {
    m["inputs"] = nlohmann::json::array();
    for (const auto& in : r.model.inputs) {
      m["inputs"].push_back({{"shape", in.shape}, {"dtype", in.dtype}, {"requires_grad", in.requires_grad}});
    }
  }
  return m;
}

nlohmann::json check_json(const CheckResult& c) {
  nlohmann::json cj = {{"id", c.id}, {"status", status_name(c.status)}, {"summary", c.summary}};
  cj["findings"] = nlohmann::json::array();
  for (const auto& f : c.findings) {
    cj["findings"].push_back({{"cause", cause_name(f.cause)},
                              {"site", f.site},
                              {"tensor", f.tensor},
                              {"message", f.message},
                              {"hint", f.hint},
                              {"details", f.details}});
  }
  cj["details"] = c.details;
  return cj;
}

nlohmann::json cost_json(const CheckCost& cost) {
  nlohmann::json phases = nlohmann::json::array();  // in the order they ran
  for (const auto& [name, seconds] : cost.phases) phases.push_back({{"part", name}, {"cpu_seconds", seconds}});
  return {{"plain_steps", cost.plain_steps()},
          {"cpu_seconds", cost.seconds},
          {"plain_step_cpu_seconds", cost.plain_step_seconds},
          {"phases", phases}};
}

// The parts only some commands have: diagnosis, validation, bench, plan, cost, selftest, plant,
// baseline.
void add_command_parts(const Report& r, nlohmann::json& j) {
  if (r.diagnosis) j["diagnosis"] = diagnosis_json(*r.diagnosis);
  if (r.validation) j["validation"] = validation_json(*r.validation);
  if (r.bench) {
    const auto fields = bench_json(*r.bench);  // its fields stand at the top level
    for (const auto& [key, value] : fields.items()) j[key] = value;
  }
  if (r.plan) {
    j["plan"] = plan_json(*r.plan);
    j["plan"]["run_command"] = r.plan_command.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.plan_command);
  }
  if (r.cost) j["cost"] = cost_json(*r.cost);
  if (r.selftest) j["selftest"] = selftest_json(*r.selftest);
  if (r.plant) {
    j["plant"] = {{"plant", r.plant->plant}, {"site", r.plant->site}, {"cause", r.plant->cause},
                  {"manifest", r.plant->manifest}};
  }
  if (r.baseline) {
    j["baseline"] = {{"file", r.baseline->path}, {"unchanged", r.baseline->changes.empty()},
                     {"changes", r.baseline->changes}};
  }
}

}  // namespace

nlohmann::json report_json(const Report& r) {
  nlohmann::json j;
  j["tool"] = "ckcheck";
  j["version"] = ckcheck_version();
  const auto b = build_info();
  j["build"] = {{"ckcheck", b.ckcheck}, {"libtorch", b.libtorch}, {"cuda", b.cuda}, {"cuda_version", b.cuda_version}};
  j["command"] = r.command;
  j["verdict"] = verdict_name(r.verdict);
  j["model"] = model_json(r);
  j["config"] = r.config;
  j["checks"] = nlohmann::json::array();
  for (const auto& c : r.checks) j["checks"].push_back(check_json(c));
  j["tensors"] = nlohmann::json::array();
  for (const auto& d : r.tensors) j["tensors"].push_back(diff_json(d));
  add_command_parts(r, j);
  j["seconds"] = r.seconds;
  j["reproduce"] = r.reproduce;
  return j;
}

nlohmann::json diagnosis_json(const Diagnosis& d) {
  nlohmann::json j;
  j["diverges"] = d.diverges;
  j["non_finite"] = d.non_finite;
  j["summary"] = d.summary;
  j["sites"] = nlohmann::json::array();
  for (const auto& s : d.sites) {
    j["sites"].push_back({{"site", s.site}, {"cause", cause_name(s.cause)}, {"evidence", s.evidence}, {"hint", s.hint}});
  }
  j["interaction"] = d.interaction;
  j["bisection_runs"] = d.bisection_runs;
  j["first_divergent_op"] = d.op_diff ? op_diff_json(*d.op_diff) : nlohmann::json(nullptr);
  j["nan_origin"] = {{"reference", nan_json(d.nan_reference)},
                     {"checkpointed", nan_json(d.nan_checkpointed)},
                     {"without_checkpointing", d.nan_reference.found},
                     {"introduced_by_checkpointing", d.nan_checkpointed.found && !d.nan_reference.found}};
  return j;
}

nlohmann::json bench_json(const BenchResult& r) {
  nlohmann::json j;
  j["device"] = r.device;
  j["baseline_bytes"] = r.baseline_bytes;
  j["parameter_bytes"] = r.parameter_bytes;
  j["gradient_bytes"] = r.gradient_bytes;
  j["adam_state_bytes"] = r.adam_state_bytes;
  j["memory_budget_bytes"] = r.memory_budget_bytes >= 0 ? nlohmann::json(r.memory_budget_bytes) : nlohmann::json(nullptr);
  j["max_overhead"] = r.max_overhead;
  j["analytic_formula"] = r.formula;
  j["clock"] = r.clock;
  j["rounds"] = r.rounds;
  j["interleaved"] = true;
  j["too_noisy"] = r.too_noisy;
  const PolicyBench* none = measured_none(r);
  j["policies"] = nlohmann::json::array();
  for (const auto& p : r.policies) {
    auto pj = policy_json(p, none);
    if (r.parallel) pj["rank_peak_bytes"] = p.rank_peak_bytes;
    j["policies"].push_back(pj);
  }
  j["recommendation"] = r.recommendation.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.recommendation);
  j["recommendation_reason"] = r.reason;
  j["warnings"] = r.warnings;
  if (!r.offload.empty()) {
    j["offload"] = r.offload;
    j["offload_note"] = r.offload_note;
  }
  if (r.parallel) {
    j["parallel"] = parallel_kind_name(*r.parallel);
    j["world_size"] = r.world_size;
    j["parallel_note"] = r.parallel_note;
    j["rank_state_bytes"] = r.rank_state_bytes;
  }
  return j;
}

nlohmann::json validation_json(const OpValidation& v) {
  return {{"op", v.op},       {"schema", v.schema}, {"verdict", v.safe ? "safe" : "unsafe"},
          {"causes", validation_causes(v)}, {"notes", v.notes}, {"cases", v.cases}};
}

namespace {

// The plain step's profile: per site, per stretch of the step, per op class.
nlohmann::json profile_json(const StepProfile& f) {
  nlohmann::json sites = nlohmann::json::array(), regions = nlohmann::json::array();
  for (const auto& s : f.sites) {
    sites.push_back({{"site", s.site}, {"input_bytes", s.input_bytes}, {"output_bytes", s.output_bytes},
                     {"kept_bytes", s.kept_bytes}, {"forward_peak_bytes", s.forward_peak_bytes},
                     {"forward_seconds", s.forward_seconds}, {"recompute_extra_bytes", s.recompute_extra_bytes},
                     {"recompute_seconds", s.recompute_seconds}});
  }
  for (const auto& r : f.regions) {
    regions.push_back({{"where", r.where}, {"peak_bytes", r.peak_bytes}, {"seconds", r.seconds}, {"holding", r.holding},
                       {"recomputes", r.recomputes ? nlohmann::json(f.sites[*r.recomputes].site) : nlohmann::json(nullptr)}});
  }
  nlohmann::json classes = nlohmann::json::array();
  for (const auto& c : f.op_classes) {
    classes.push_back({{"op", c.op}, {"calls", c.calls}, {"bytes", c.bytes()}, {"seconds", c.seconds()},
                       {"site_bytes", c.site_bytes}, {"site_seconds", c.site_seconds}});
  }
  return {{"steps", f.steps},   {"step_seconds", f.step_seconds}, {"peak_bytes", f.peak_bytes},
          {"sites", sites},     {"regions", regions},             {"uncalibrated", f.uncalibrated},
          {"calibration_note", f.calibration_note},
          {"every_site_peak_bytes", predict_peak(f, std::vector<bool>(f.sites.size(), true))},
          {"op_classes", classes},
          {"op_classes_note", f.op_classes_note}};
}

// One plan tried: predicted, checked, and measured where it was.
nlohmann::json attempt_json(const MemoryPlan& p, const PlanAttempt& a) {
  const auto& f = p.profile;
  nlohmann::json aj = {{"policy", a.policy},
                       {"sites", a.sites},
                       {"saved_ops", a.saved_ops},
                       {"predicted_peak_bytes", a.predicted_peak_bytes},
                       {"predicted_total_bytes", a.predicted_peak_bytes + f.baseline_bytes},
                       {"peak_where", a.peak_where},
                       {"predicted_step_seconds", a.predicted_seconds},
                       {"predicted_time_ratio", f.step_seconds > 0 ? a.predicted_seconds / f.step_seconds : 1.0},
                       {"checks", a.checks ? nlohmann::json(verdict_name(*a.checks)) : nlohmann::json(nullptr)},
                       {"check_failures", a.check_failures},
                       {"set_aside", a.set_aside},
                       {"outcome", a.outcome}};
  aj["measured_peak_bytes"] = aj["measured_total_bytes"] = aj["measured_time_ratio"] = aj["peak_error"] = nullptr;
  if (const auto* b = measured_plan(p, a.policy)) {
    aj["measured_peak_bytes"] = b->measurement.peak_bytes;
    aj["measured_total_bytes"] = b->measurement.peak_bytes + b->measurement.baseline_bytes;
    aj["measured_time_ratio"] = b->time_ratio;
    if (b->measurement.peak_bytes > 0) {
      aj["peak_error"] = static_cast<double>(a.predicted_peak_bytes - b->measurement.peak_bytes) / static_cast<double>(b->measurement.peak_bytes);
    }
  }
  return aj;
}

}  // namespace

nlohmann::json plan_json(const MemoryPlan& p) {
  nlohmann::json j;
  j["memory_budget_bytes"] = p.memory_budget_bytes;
  j["baseline_bytes"] = p.profile.baseline_bytes;
  j["recommendation"] = p.recommendation.empty() ? nlohmann::json(nullptr) : nlohmann::json(p.recommendation);
  j["recommendation_reason"] = p.reason;
  j["fits"] = p.fits;
  j["solver"] = {{"method", p.solver},
                 {"states", p.stats.states},
                 {"largest_front", p.stats.largest_front},
                 {"sac_subsets", p.sac_subsets}};
  j["profile"] = profile_json(p.profile);
  j["attempts"] = nlohmann::json::array();
  for (const auto& a : p.attempts) j["attempts"].push_back(attempt_json(p, a));
  j["measured"] = bench_json(p.measured);
  return j;
}

}  // namespace ckcheck
