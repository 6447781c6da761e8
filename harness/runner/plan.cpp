#include "harness/runner/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "harness/support/errors.h"
#include "harness/support/text.h"

namespace ckcheck {

namespace {

const char* kPolicyForms =
    "none, every:K, segments[:N], sites:GLOB[,GLOB], (with --compile) budget:F or (Python models) sac:OP[+OP][@GLOB[+GLOB]]";

int64_t parse_positive(const std::string& text, const std::string& whole) {
  const auto v = parse_int(text);
  if (!v || *v < 1) {
    throw UsageError(fmt::format("policy '{}': '{}' is not a positive integer; valid policies: {}",
                                 whole, text, kPolicyForms));
  }
  return *v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

std::string some(const std::vector<std::string>& names, size_t limit = 8) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < limit; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > limit) out += fmt::format(", ... ({} in all)", names.size());
  return out.empty() ? "(none)" : out;
}

bool match_set(const std::string& p, size_t& i, char c) {
  // p[i] == '['; on return i points past ']'.
  size_t j = i + 1;
  bool negate = j < p.size() && (p[j] == '!' || p[j] == '^');
  if (negate) ++j;
  bool found = false;
  size_t start = j;
  for (; j < p.size() && (p[j] != ']' || j == start); ++j) {
    if (j + 2 < p.size() && p[j + 1] == '-' && p[j + 2] != ']') {
      found = found || (c >= p[j] && c <= p[j + 2]);
      j += 2;
    } else {
      found = found || c == p[j];
    }
  }
  i = j < p.size() ? j + 1 : j;
  return found != negate;
}

// Outermost of `sites` (keeping order): a site nested in another one of the list is dropped.
std::vector<std::string> outermost(const std::vector<std::string>& sites) {
  std::vector<std::string> out;
  for (const auto& s : sites) {
    bool nested = false;
    for (const auto& o : sites) nested = nested || (o != s && site_within(s, o));
    if (!nested) out.push_back(s);
  }
  return out;
}

}  // namespace

bool glob_match(const std::string& p, const std::string& t) {
  size_t pi = 0, ti = 0, star = std::string::npos, mark = 0;
  while (ti < t.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = ti;
    } else if (pi < p.size() && p[pi] == '[') {
      size_t next = pi;
      if (match_set(p, next, t[ti])) {
        pi = next;
        ++ti;
      } else if (star != std::string::npos) {
        pi = star + 1;
        ti = ++mark;
      } else {
        return false;
      }
    } else if (pi < p.size() && (p[pi] == '?' || p[pi] == t[ti])) {
      ++pi;
      ++ti;
    } else if (star != std::string::npos) {
      pi = star + 1;
      ti = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

namespace {

// sites:GLOB[,GLOB]
std::vector<std::string> parse_site_globs(const std::string& arg, const std::string& text) {
  std::vector<std::string> globs;
  for (const auto& g : split(arg, ',')) {
    if (g.empty()) {
      throw UsageError(fmt::format("policy '{}' has an empty glob; write sites:GLOB[,GLOB], as in "
                                   "sites:*.attn",
                                   text));
    }
    globs.push_back(g);
  }
  return globs;
}

// sac:OPS[@GLOB[+GLOB]]; '+' between ops (and sites) keeps a sac: policy one item of a
// comma-separated --policies list.
void parse_sac(const std::string& arg, const std::string& text, Policy& p) {
  const auto at = arg.find('@');
  std::string ops = arg.substr(0, at);
  std::replace(ops.begin(), ops.end(), ',', '+');
  if (at != std::string::npos) {
    for (const auto& g : split(arg.substr(at + 1), '+')) {
      if (g.empty()) {
        throw UsageError(fmt::format("policy '{}' has an empty site glob; write sac:OPS@GLOB[+GLOB], as in "
                                     "sac:aten.mm@blocks.0+blocks.1",
                                     text));
      }
      p.globs.push_back(g);
    }
  }
  for (const auto& op : split(ops, '+')) {
    if (op.empty() || op.find('.') == std::string::npos) {
      throw UsageError(fmt::format("policy '{}': '{}' is not an op; write sac:NAMESPACE.OP[+NAMESPACE.OP], as in "
                                   "sac:aten.mm+aten.bmm (the ops saved; every other op is recomputed)",
                                   text, op));
    }
    p.ops.push_back(op);
  }
}

// budget:B, B from 0 to 1
double parse_budget(const std::string& arg, const std::string& text) {
  const auto v = parse_double(arg);
  if (!v || !(*v >= 0.0 && *v <= 1.0)) {
    throw UsageError(fmt::format("policy '{}': the memory budget is a number from 0 to 1, as in budget:0.5", text));
  }
  return *v;
}

}  // namespace

Policy Policy::parse(const std::string& text) {
  Policy p;
  const auto colon = text.find(':');
  const bool has_arg = colon != std::string::npos;
  const std::string head = text.substr(0, colon);
  const std::string arg = has_arg ? text.substr(colon + 1) : "";
  if (head == "none" && !has_arg) {
    p.kind = Kind::kNone;
  } else if (head == "every") {
    p.kind = Kind::kEvery;
    if (!has_arg) {
      throw UsageError(fmt::format("policy '{}' needs an interval, as in every:2; valid policies: {}",
                                   text, kPolicyForms));
    }
    p.k = parse_positive(arg, text);
  } else if (head == "segments") {
    p.kind = Kind::kSegments;
    p.k = (!has_arg || arg == "sqrt") ? 0 : parse_positive(arg, text);
  } else if (head == "sites") {
    p.kind = Kind::kSites;
    p.globs = parse_site_globs(arg, text);
  } else if (head == "sac" && has_arg) {
    p.kind = Kind::kSac;
    parse_sac(arg, text, p);
  } else if (head == "budget" && has_arg) {
    p.kind = Kind::kBudget;
    p.budget = parse_budget(arg, text);
  } else {
    throw UsageError(fmt::format("unknown policy '{}'; valid policies: {}", text, kPolicyForms));
  }
  return p;
}

std::string Policy::text() const {
  switch (kind) {
    case Kind::kNone:
      return "none";
    case Kind::kEvery:
      return fmt::format("every:{}", k);
    case Kind::kSegments:
      return k == 0 ? "segments:sqrt" : fmt::format("segments:{}", k);
    case Kind::kSites:
      return "sites:" + fmt::format("{}", fmt::join(globs, ","));
    case Kind::kBudget:
      return fmt::format("budget:{:g}", budget);
    case Kind::kSac:
      return "sac:" + fmt::format("{}", fmt::join(ops, "+")) + (globs.empty() ? "" : "@" + fmt::format("{}", fmt::join(globs, "+")));
  }
  return "";
}

std::string Plan::sac_save() const {
  return policy.kind == Policy::Kind::kSac ? fmt::format("{}", fmt::join(policy.ops, ",")) : std::string();
}

namespace {

// The pool: sites matching --sites (or the default sites), with every site nested in them.
std::vector<std::string> site_pool(const Model& model, const std::vector<std::string>& site_globs) {
  const auto all = model.sites();
  std::vector<std::string> roots;
  if (site_globs.empty()) {
    roots = model.default_sites();
  } else {
    for (const auto& g : site_globs) {
      bool any = false;
      for (const auto& s : all) {
        if (glob_match(g, s)) {
          any = true;
          roots.push_back(s);
        }
      }
      if (!any) {
        throw FieldError("sites", fmt::format("@sites '{}' matches no site of model {}; its sites are: {}",
                                     g, model.name(), some(all, 12)));
      }
    }
  }
  std::set<std::string> root_set(roots.begin(), roots.end());
  std::vector<std::string> pool;
  for (const auto& s : all) {
    bool in = false;
    for (const auto& r : root_set) in = in || site_within(s, r);
    if (in) pool.push_back(s);
  }
  return pool;
}

// sites:GLOB: the outermost pool sites a glob matches.
std::vector<std::vector<std::string>> glob_units(const Model& model, const Policy& policy,
                                                 const std::vector<std::string>& pool) {
  std::vector<std::string> chosen;
  for (const auto& s : pool) {
    for (const auto& g : policy.globs) {
      if (glob_match(g, s)) {
        chosen.push_back(s);
        break;
      }
    }
  }
  if (chosen.empty()) {
    throw UsageError(fmt::format("policy {} matches none of the candidate sites of model {}: {}",
                                 policy.text(), model.name(), some(pool, 12)));
  }
  std::vector<std::vector<std::string>> units;
  for (const auto& s : outermost(chosen)) units.push_back({s});
  return units;
}

// segments:N: runs of consecutive chain sites, the last segment left un-checkpointed.
std::vector<std::vector<std::string>> segment_units(const Model& model, const Policy& policy,
                                                    const std::vector<std::string>& candidates) {
  const auto chain = model.chain_sites();
  const auto n = static_cast<int64_t>(candidates.size());
  // The candidates must be a run of consecutive chain sites for a segment to span several.
  auto first = std::find(chain.begin(), chain.end(), n ? candidates[0] : "");
  bool consecutive = n > 0 && first != chain.end() && static_cast<int64_t>(chain.end() - first) >= n &&
                     std::equal(candidates.begin(), candidates.end(), first);
  if (!consecutive) {
    throw UsageError(fmt::format(
        "policy {} needs candidate sites that run one after another as a chain ({}), but the "
        "candidates are {}; use every:K or sites:GLOB for this model",
        policy.text(), chain.empty() ? "this model has no chain" : some(chain), some(candidates)));
  }
  int64_t segments = policy.k;
  if (segments == 0) segments = std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(n))));
  if (segments > n) {
    throw UsageError(fmt::format("policy {} asks for more segments than there are candidate "
                                 "sites ({}); use at most segments:{}",
                                 policy.text(), n, n));
  }
  const int64_t per = (n + segments - 1) / segments;
  std::vector<std::vector<std::string>> units;
  for (int64_t begin = 0; begin + per < n; begin += per) {
    units.emplace_back(candidates.begin() + begin, candidates.begin() + begin + per);
  }
  return units;
}

}  // namespace

Plan Plan::make(const Model& model, const std::vector<std::string>& site_globs,
                const Policy& policy) {
  Plan plan;
  plan.policy = policy;
  const auto pool = site_pool(model, site_globs);
  plan.candidates = outermost(pool);
  switch (policy.kind) {
    case Policy::Kind::kNone:
      break;
    case Policy::Kind::kEvery:
      for (size_t i = 0; i < plan.candidates.size(); i += static_cast<size_t>(policy.k)) {
        plan.units.push_back({plan.candidates[i]});
      }
      break;
    case Policy::Kind::kSites:
      plan.units = glob_units(model, policy, pool);
      break;
    case Policy::Kind::kSegments:
      plan.units = segment_units(model, policy, plan.candidates);
      break;
    case Policy::Kind::kBudget:
      if (!model.compiled_steps()) {
        throw FieldError("policy", fmt::format("policy {} is the compiler's activation memory budget: it applies to a "
                                               "model trained compiled (@compile, Python models)",
                                               policy.text()));
      }
      for (const auto& c : plan.candidates) plan.units.push_back({c});
      break;
    case Policy::Kind::kSac:
      if (const auto problem = model.selective_problem(policy.ops); !problem.empty()) {
        throw FieldError("policy", fmt::format("policy {} is op-level selective checkpointing (torch.utils.checkpoint's "
                                               "context_fn): {}",
                                               policy.text(), problem));
      }
      if (policy.globs.empty()) {
        for (const auto& c : plan.candidates) plan.units.push_back({c});
      } else {
        plan.units = glob_units(model, policy, pool);
      }
      break;
  }
  for (const auto& unit : plan.units) {
    for (const auto& site : unit) {
      const auto problem = model.site_problem(site);
      if (!problem.empty()) {
        throw FieldError("sites", fmt::format("site {} of model {} cannot be checkpointed: {}; choose other "
                                              "sites with @sites or @policy sites:GLOB",
                                     site, model.name(), problem));
      }
    }
  }
  return plan;
}

std::string Plan::unit_label(const std::vector<std::string>& unit) {
  return unit.size() == 1 ? unit.front() : unit.front() + ".." + unit.back();
}

std::vector<std::string> Plan::checkpointed() const {
  std::vector<std::string> out;
  for (const auto& u : units) out.insert(out.end(), u.begin(), u.end());
  return out;
}

}  // namespace ckcheck
