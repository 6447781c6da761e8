#include "tests/support/records.h"

#include "fixtures/registry.h"
#include "analyses/session.h"

namespace ckcheck::testing {

HandBuiltRecords::HandBuiltRecords()
    : model(make_model("mlp", {}, 0)), plan(Plan::make(*model, {}, Policy::parse("every:1"))) {}

void HandBuiltRecords::same(const std::string& name, const std::string& kind, const torch::Tensor& value) {
  records.reference.tensors.push_back({name, kind, 1, value});
  records.checkpointed.tensors.push_back({name, kind, 1, value.clone()});
}

void HandBuiltRecords::differ(const std::string& name, const std::string& kind, const torch::Tensor& reference,
                              const torch::Tensor& checkpointed) {
  records.reference.tensors.push_back({name, kind, 1, reference});
  records.checkpointed.tensors.push_back({name, kind, 1, checkpointed});
}

CallEvidence& HandBuiltRecords::call(const std::string& site) {
  CallEvidence c;
  c.site = site;
  c.call = static_cast<int64_t>(records.checkpointed.calls.size());
  c.recomputed = true;
  c.grad_all_zero = false;
  c.output_diffs = {TensorDiff()};
  records.checkpointed.calls.push_back(c);
  return records.checkpointed.calls.back();
}

UnitProbe& HandBuiltRecords::probe(const std::string& site) {
  if (!records.probes) records.probes.emplace();
  UnitProbe p;
  p.site = site;
  records.probes->push_back(p);
  return records.probes->back();
}

CheckResult HandBuiltRecords::run(const Check& check, const std::map<std::string, double>& knobs) const {
  const auto diffs = compare_records(records.reference, records.checkpointed, tolerance);
  CheckContext ctx{*model, plan, config, tolerance, records, diffs, knobs};
  return check.run(ctx);
}

std::vector<Cause> causes_of(const CheckResult& result) {
  std::vector<Cause> out;
  for (const auto& f : result.findings) out.push_back(f.cause);
  return out;
}

}  // namespace ckcheck::testing
