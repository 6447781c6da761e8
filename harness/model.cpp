#include "harness/model.h"

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

NamedTensors Model::state_tensors() {
  auto out = named_buffers();
  for (auto& item : extra_state()) out.push_back(std::move(item));
  return out;
}

ModelState Model::snapshot() {
  torch::NoGradGuard no_grad;
  ModelState s;
  for (auto& [name, t] : named_parameters()) s.tensors.emplace_back(name, t.detach().clone());
  for (auto& [name, t] : state_tensors()) s.tensors.emplace_back(name, t.detach().clone());
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
