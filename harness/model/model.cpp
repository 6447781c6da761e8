#include "ckcheck/model.h"

#include <algorithm>

#include <fmt/format.h>

namespace ckcheck {

torch::Tensor SiteRunner::call(const std::string& site, const TensorFn& fn, const torch::Tensor& x) {
  return call(
      site, [fn](const std::vector<torch::Tensor>& xs) { return std::vector<torch::Tensor>{fn(xs[0])}; },
      std::vector<torch::Tensor>{x})[0];
}

torch::Tensor SiteRunner::chain(const std::vector<std::string>& sites,
                                const std::vector<TensorFn>& fns, const torch::Tensor& x) {
  torch::Tensor h = x;
  for (size_t i = 0; i < fns.size(); ++i) h = call(sites[i], fns[i], h);
  return h;
}

bool site_within(const std::string& site, const std::string& outer) {
  return site == outer ||
         (site.size() > outer.size() && site.compare(0, outer.size(), outer) == 0 &&
          site[outer.size()] == '.');
}

std::vector<torch::Tensor> Model::site_buffers(const std::string& site) {
  std::vector<torch::Tensor> out;
  for (auto& [name, t] : named_buffers()) {
    if (site_within(name, site)) out.push_back(t);
  }
  return out;
}

bool is_state_kind(const std::string& kind) {
  return kind == state_kind::kBuffer || kind == state_kind::kTensorAttribute || kind == state_kind::kScalarAttribute ||
         kind == state_kind::kMode || kind == state_kind::kExtra || kind == state_kind::kParameter ||
         kind == state_kind::kGlobal;
}

std::string state_kind_words(const std::string& kind) {
  if (kind == state_kind::kTensorAttribute) return "tensor attribute";
  if (kind == state_kind::kScalarAttribute) return "scalar attribute";
  if (kind == state_kind::kMode) return "training flag";
  if (kind == state_kind::kExtra) return "state";
  if (kind == state_kind::kParameter) return "parameter value";
  if (kind == state_kind::kGlobal) return "module-level variable";
  return "buffer";
}

std::string state_display_name(const std::string& name) {
  return !name.empty() && name[0] == '@' ? name.substr(1) : name;
}

std::string Model::state_kind_of(const std::string& name) const {
  return !name.empty() && name[0] == '@' ? state_kind::kExtra : state_kind::kBuffer;
}

NamedTensors Model::state_tensors() {
  auto out = named_buffers();
  for (auto& item : extra_state()) out.push_back(std::move(item));
  return out;
}

NamedTensors Model::unit_state(const std::vector<std::string>& sites) {
  auto in_sites = [&](const std::string& name) {
    const auto plain = state_display_name(name);
    return std::any_of(sites.begin(), sites.end(), [&](const std::string& s) { return site_within(plain, s); });
  };
  auto read = [&](const std::string& name) {
    if (in_sites(name)) return true;
    const auto aliases = state_aliases(name);
    return std::any_of(aliases.begin(), aliases.end(), in_sites);
  };
  NamedTensors out;
  for (auto& item : named_parameters()) {
    if (read(item.first)) out.push_back(std::move(item));
  }
  for (auto& item : state_tensors()) {
    if (read(item.first)) out.push_back(std::move(item));
  }
  return out;
}

ModelState Model::snapshot() {
  torch::NoGradGuard no_grad;
  ModelState s;
  for (auto& [name, t] : named_parameters()) s.tensors.emplace_back(name, t.detach().clone());
  for (auto& [name, t] : state_tensors()) s.tensors.emplace_back(name, t.defined() ? t.detach().clone() : torch::Tensor());
  return s;
}

void Model::restore(const ModelState& state) {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> live;
  for (auto& [name, t] : named_parameters()) live[name] = t;
  for (auto& [name, t] : named_buffers()) live[name] = t;
  for (const auto& [name, value] : state.tensors) {
    if (!name.empty() && name[0] == '@') {
      load_extra_state(name, value);
      continue;
    }
    auto it = live.find(name);
    TORCH_CHECK(it != live.end(), "model ", this->name(), " has no tensor '", name,
                "' to restore; the snapshot belongs to another model");
    it->second.copy_(value);
  }
  for (auto& [name, p] : named_parameters()) {
    if (p.grad().defined()) p.mutable_grad() = torch::Tensor();
  }
}

}  // namespace ckcheck
