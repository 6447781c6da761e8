#include "ckcheck/testing.h"

#include <fmt/format.h>

#include <sstream>

#include "analyses/session.h"
#include "harness/support/errors.h"
#include "reports/report.h"

namespace ckcheck {
namespace {

class ModuleModelImpl : public Model {
 public:
  ModuleModelImpl(std::string name, std::shared_ptr<torch::nn::Module> module, std::vector<std::string> sites,
                  ModuleForward forward)
      : name_(std::move(name)), module_(std::move(module)), sites_(std::move(sites)), forward_(std::move(forward)) {}
  std::string name() const override { return name_; }
  std::vector<std::string> sites() const override { return sites_; }
  std::vector<std::string> default_sites() const override {
    std::vector<std::string> out;
    for (const auto& s : sites_) {
      bool nested = false;
      for (const auto& o : sites_) nested = nested || (o != s && site_within(s, o));
      if (!nested) out.push_back(s);
    }
    return out;
  }
  std::vector<torch::Tensor> make_inputs(uint64_t) override {
    throw UsageError("module_model has no inputs of its own: pass them to EXPECT_CHECKPOINT_EQUIVALENT");
  }
  std::vector<torch::Tensor> forward(const std::vector<torch::Tensor>& inputs, SiteRunner& sites) override {
    return forward_(inputs, sites);
  }
  NamedTensors named_parameters() override {
    NamedTensors out;
    for (const auto& p : module_->named_parameters()) out.emplace_back(p.key(), p.value());
    return out;
  }
  NamedTensors named_buffers() override {
    NamedTensors out;
    for (const auto& b : module_->named_buffers()) out.emplace_back(b.key(), b.value());
    return out;
  }
  void to(const torch::Device& device) override {
    module_->to(device);
    device_ = device;
  }
  torch::Device device() const override { return device_; }

 private:
  std::string name_;
  std::shared_ptr<torch::nn::Module> module_;
  std::vector<std::string> sites_;
  ModuleForward forward_;
  torch::Device device_ = torch::kCPU;
};

// The model with the caller's inputs in place of its own.
class WithInputs : public Model {
 public:
  WithInputs(Model& inner, std::vector<torch::Tensor> inputs) : inner_(inner), inputs_(std::move(inputs)) {}
  std::string name() const override { return inner_.name(); }
  std::vector<std::string> sites() const override { return inner_.sites(); }
  std::vector<std::string> default_sites() const override { return inner_.default_sites(); }
  std::vector<std::string> chain_sites() const override { return inner_.chain_sites(); }
  std::string site_problem(const std::string& s) const override { return inner_.site_problem(s); }
  std::vector<torch::Tensor> make_inputs(uint64_t) override { return inputs_; }
  std::vector<torch::Tensor> forward(const std::vector<torch::Tensor>& x, SiteRunner& r) override { return inner_.forward(x, r); }
  NamedTensors named_parameters() override { return inner_.named_parameters(); }
  NamedTensors named_buffers() override { return inner_.named_buffers(); }
  std::vector<torch::Tensor> site_buffers(const std::string& s) override { return inner_.site_buffers(s); }
  void to(const torch::Device& d) override { inner_.to(d); }
  torch::Device device() const override { return inner_.device(); }
  NamedTensors state_tensors() override { return inner_.state_tensors(); }
  NamedTensors unit_state(const std::vector<std::string>& s) override { return inner_.unit_state(s); }
  std::string state_kind_of(const std::string& n) const override { return inner_.state_kind_of(n); }
  std::vector<std::string> state_aliases(const std::string& n) const override { return inner_.state_aliases(n); }
  std::string output_structure() const override { return inner_.output_structure(); }
  ModelState snapshot() override { return inner_.snapshot(); }
  void restore(const ModelState& s) override { inner_.restore(s); }
  std::map<std::string, std::string> options() const override { return inner_.options(); }

 private:
  Model& inner_;
  std::vector<torch::Tensor> inputs_;
};

}  // namespace

std::unique_ptr<Model> module_model(const std::string& name, std::shared_ptr<torch::nn::Module> module,
                                    std::vector<std::string> sites, ModuleForward forward) {
  return std::make_unique<ModuleModelImpl>(name, std::move(module), std::move(sites), std::move(forward));
}

namespace testing {

::testing::AssertionResult AssertCheckpointEquivalent(const char* model_expr, const char* inputs_expr,
                                                      const char* options_expr, Model& model,
                                                      const std::vector<torch::Tensor>& inputs,
                                                      const EquivalenceOptions& options) {
  Report report;
  try {
    WithInputs m(model, inputs);
    const auto plan = Plan::make(m, options.sites(), Policy::parse(options.policy()));
    const auto tolerance = Tolerance::parse(options.tolerance());
    RunConfig config;
    config.seed = options.seed();
    config.steps = options.steps();
    config.checkpoint.restore_buffers = options.restore_buffers();
    Runner runner(m, config);
    const auto outcome = run_checks(runner, plan, tolerance, select_checks(options.checks()));
    if (!outcome.records.reference.error.empty()) {
      return ::testing::AssertionFailure() << model_expr << " fails without checkpointing: "
                                           << outcome.records.reference.error;
    }
    report.model.name = m.name();
    report.model.policy = plan.policy.text();
    for (const auto& u : plan.units) report.model.units.push_back(Plan::unit_label(u));
    report.checks = outcome.results;
    report.tensors = outcome.diffs;
    report.verdict = verdict_of(outcome.results);
    report.config = {{"tolerance", tolerance.text()}};
    report.reproduce = fmt::format("EXPECT_CHECKPOINT_EQUIVALENT({}, {}, {}) with policy {}, seed {}", model_expr,
                                   inputs_expr, options_expr, plan.policy.text(), options.seed());
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "ckcheck could not compare " << model_expr << ": " << e.what();
  }
  if (report.verdict == Verdict::kPass) return ::testing::AssertionSuccess();
  std::ostringstream text;
  make_console_reporter(false)->write(report, text);
  return ::testing::AssertionFailure() << "checkpointing changes " << model_expr << ":\n" << text.str();
}

}  // namespace testing
}  // namespace ckcheck
