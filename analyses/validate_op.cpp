#include "analyses/validate_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <rapidcheck.h>

#include <ATen/CPUGeneratorImpl.h>
#include <cmath>
#include <map>

#include "checks/common.h"
#include "ckcheck/checkpoint.h"
#include "harness/support/errors.h"
#include "harness/support/global_state.h"
#include "harness/support/text.h"

namespace ckcheck {
namespace {

using c10::IValue;
using torch::Tensor;

// Differences above this relative size are not summation order: the op's result moved.
constexpr double kStatefulRelative = 1e-3;

struct Op {
  c10::OperatorHandle handle;
  const c10::FunctionSchema* schema;
};

Op find_op(const std::string& qualified) {
  const auto dot = qualified.find('.');
  const std::string name = qualified.substr(0, dot);
  const std::string overload = dot == std::string::npos ? "" : qualified.substr(dot + 1);
  const auto colons = name.find("::");
  const bool bad_overload = dot != std::string::npos && (overload.empty() || overload.find('.') != std::string::npos);
  if (colons == std::string::npos || colons == 0 || colons + 2 >= name.size() || bad_overload) {
    throw FieldError("op", fmt::format("@op '{}': give the op as namespace::name or namespace::name.overload, as "
                                       "myops::fused_gelu or aten::add.Tensor",
                                       qualified));
  }
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!handle) {
    const std::string ns = name.substr(0, name.find("::") + 2);
    std::vector<std::string> known;
    for (const auto& n : c10::Dispatcher::singleton().getAllOpNames()) {
      if (n.name.rfind(ns, 0) == 0) known.push_back(n.overload_name.empty() ? n.name : n.name + "." + n.overload_name);
    }
    std::sort(known.begin(), known.end());
    throw UsageError(fmt::format("no op {} is registered; ops in namespace {}: {}", qualified,
                                 ns.substr(0, ns.size() - 2),
                                 known.empty() ? std::string("none (did the library register them with TORCH_LIBRARY?)")
                                               : fmt::format("{}", fmt::join(known, ", "))));
  }
  return {*handle, &handle->schema()};
}

bool is_tensor_arg(const c10::Argument& a) {
  auto t = a.type();
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  return t->kind() == c10::TypeKind::TensorType;
}

bool writes(const c10::Argument& a) { return a.alias_info() && a.alias_info()->isWrite(); }

// Input case k: one IValue per schema argument.
std::vector<IValue> make_inputs(const c10::FunctionSchema& schema, const OpValidationOptions& o, int k) {
  // Shapes from RapidCheck generators, seeded per case: every tensor argument shares one shape
  // (so elementwise ops accept them) unless --shapes says otherwise.
  const rc::Random random(o.seed * 7919 + static_cast<uint64_t>(k));
  const int size = 10 + 10 * k;
  const auto rank = rc::gen::inRange(1, 4)(random, size).value();
  std::vector<int64_t> shape;
  rc::Random r = random;  // split() leaves r as one half and returns the other
  for (int d = 0; d < rank; ++d) {
    r = r.split();
    shape.push_back(rc::gen::inRange<int64_t>(1, 9)(r, size).value());
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed * 104729 + static_cast<uint64_t>(k));
  std::vector<IValue> args;
  size_t tensor_index = 0;
  for (const auto& a : schema.arguments()) {
    if (is_tensor_arg(a)) {
      const auto& s = tensor_index < o.shapes.size() ? o.shapes[tensor_index] : shape;
      ++tensor_index;
      auto t = torch::randn(s, gen);
      args.emplace_back(c10::isFloatingType(o.dtype) ? t.to(o.dtype) : (t * 10).to(o.dtype));
      continue;
    }
    if (a.default_value()) {
      args.push_back(*a.default_value());
      continue;
    }
    switch (a.type()->kind()) {
      case c10::TypeKind::IntType: args.emplace_back(int64_t{1}); break;
      case c10::TypeKind::FloatType: args.emplace_back(0.5); break;
      case c10::TypeKind::BoolType: args.emplace_back(false); break;
      case c10::TypeKind::NumberType: args.emplace_back(c10::Scalar(0.5)); break;
      case c10::TypeKind::OptionalType: args.emplace_back(); break;
      default:
        throw UsageError(fmt::format("argument '{}' of {} has type {}, which ckcheck cannot make up; it "
                                     "makes tensors, numbers, booleans, optionals and arguments with defaults",
                                     a.name(), schema.name(), a.type()->annotation_str()));
    }
  }
  return args;
}

std::vector<IValue> clone_inputs(const std::vector<IValue>& in) {
  std::vector<IValue> out;
  for (const auto& v : in) out.push_back(v.isTensor() ? IValue(v.toTensor().clone()) : v);
  return out;
}

std::vector<Tensor> call(const Op& op, std::vector<IValue> stack) {
  op.handle.callBoxed(stack);
  std::vector<Tensor> outs;
  for (const auto& v : stack) {
    if (v.isTensor()) {
      outs.push_back(v.toTensor());
    } else if (v.isTensorList()) {
      for (const auto& t : v.toTensorVector()) outs.push_back(t);
    }
  }
  return outs;
}

struct Compared {
  bool equal = true;
  double max_rel = 0;
  std::string note;
};

Compared compare(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  Compared c;
  if (a.size() != b.size()) {
    c.equal = false;
    c.note = fmt::format("{} outputs against {}", a.size(), b.size());
    return c;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    const auto d = compare_tensors(a[i], b[i], Tolerance());
    c.equal = c.equal && d.equal;
    c.max_rel = std::max(c.max_rel, std::isfinite(d.max_rel) ? d.max_rel : 1e300);
    if (!d.note.empty()) c.note = d.note;
  }
  return c;
}

class Judge {
 public:
  Judge(const Op& op, const std::string& name) : op_(op), name_(name) {
    for (const char* id : {"determinism", "input-mutation", "rng", "autocast", "gradients"}) {
      CheckResult r;
      r.id = id;
      results_[id] = r;
    }
  }

  void finding(const std::string& check, Cause cause, const std::string& tensor, const std::string& message,
               const std::string& hint = "") {
    auto& r = results_[check];
    for (const auto& f : r.findings) {
      if (f.cause == cause && f.tensor == tensor) return;  // once per check, cause and argument
    }
    r.status = Status::kFail;
    add_finding(r, {cause, name_, tensor, message, hint});
  }
  void note(const std::string& n) {
    if (std::find(notes.begin(), notes.end(), n) == notes.end()) notes.push_back(n);
  }
  bool failed(const std::string& check) { return results_[check].status == Status::kFail; }

  void run_case(const std::vector<IValue>& inputs) {
    const RngState r0 = RngState::capture();
    // Input mutation: values or version counters of the arguments.
    auto args = clone_inputs(inputs);
    std::vector<int64_t> versions;
    for (const auto& v : args) versions.push_back(v.isTensor() ? static_cast<int64_t>(v.toTensor()._version()) : 0);
    std::vector<Tensor> first;
    try {
      first = call(op_, args);
    } catch (const std::exception& e) {
      throw FieldError("shapes", fmt::format("{} fails on generated inputs: {} (give @shapes and @dtype it accepts)", name_,
                                             first_line(e.what())));
    }
    const RngState r1 = RngState::capture();
    check_arguments(inputs, args, versions);
    const bool repeats = check_repeat(inputs, first, r0, r1);
    bool floating = false;
    for (const auto& v : inputs) floating = floating || (v.isTensor() && v.toTensor().is_floating_point());
    if (floating) check_autocast(inputs, r0, repeats);
    // Gradients through a checkpoint against plain.
    if (floating && c10::isFloatingType(inputs[0].isTensor() ? inputs[0].toTensor().scalar_type() : c10::kFloat)) {
      gradients(inputs, r0);
    }
    r0.restore();
  }

  OpValidation result(const std::string& schema, int cases) {
    OpValidation v;
    v.op = name_;
    v.schema = schema;
    v.cases = cases;
    for (const char* id : {"determinism", "input-mutation", "rng", "autocast", "gradients"}) {
      auto& r = results_[id];
      if (r.status == Status::kPass && r.summary.empty()) r.summary = pass_summary(id, cases);
      if (r.status == Status::kFail) {
        v.safe = false;
        if (r.summary.empty()) r.summary = fmt::format("unsafe: {}", r.findings.front().message);
      }
      v.checks.push_back(r);
    }
    v.notes = notes;
    return v;
  }

  std::vector<std::string> notes;

 private:
  std::string pass_summary(const std::string& id, int cases) {
    if (id == "determinism") return fmt::format("identical calls gave identical results in {}", count_of(cases, "case"));
    if (id == "input-mutation") return "changes no argument its schema does not mark as mutable";
    if (id == "rng") return "draws no random numbers, or only ones a restored generator replays";
    if (id == "autocast") return "the same result with grad mode on and off under autocast";
    return "the same gradients checkpointed as plain";
  }

  // Arguments the op changed in place: findings unless the schema declares them mutable.
  void check_arguments(const std::vector<IValue>& inputs, const std::vector<IValue>& args,
                       const std::vector<int64_t>& versions) {
    const auto& schema = *op_.schema;
    for (size_t i = 0; i < args.size(); ++i) {
      if (!args[i].isTensor()) continue;
      const auto& a = schema.arguments()[i];
      const bool changed = !torch::equal(args[i].toTensor(), inputs[i].toTensor()) ||
                           static_cast<int64_t>(args[i].toTensor()._version()) != versions[i];
      if (!changed) continue;
      if (writes(a)) {
        note(fmt::format("mutates '{}' as its schema declares: never pass it a checkpointed segment's input", a.name()));
      } else {
        finding("input-mutation", Cause::kInPlace, a.name(),
                fmt::format("changes its argument '{}' in place, which its schema ({}) does not mark as mutable "
                            "(Tensor(a!) {}): a recompute would start from the changed data",
                            a.name(), c10::toString(schema), a.name()),
                "copy the argument inside the op, or declare it mutable and keep its input out of checkpointed segments");
      }
    }
  }

  // Random numbers and repeatability, from identical inputs and RNG state (r0 before the first
  // call, r1 after it). True when the second call gave the first call's results.
  bool check_repeat(const std::vector<IValue>& inputs, const std::vector<Tensor>& first, const RngState& r0,
                    const RngState& r1) {
    r0.restore();
    const auto again = call(op_, clone_inputs(inputs));
    const auto same = compare(first, again);
    const bool consumes = r1 != r0;
    if (consumes) {
      if (same.equal) {
        note("draws from the default generator, which a checkpoint replays: keep preserve_rng_state on");
      } else {
        finding("rng", Cause::kRng, "",
                "draws random numbers that a restored default generator does not replay (a private "
                "generator, or a random source outside LibTorch)");
      }
    }
    if (!same.equal && !(consumes && failed("rng"))) {
      if (same.max_rel > kStatefulRelative) {
        finding("determinism", Cause::kStateful, "",
                fmt::format("gives another result on the second identical call (max rel difference {:.3g}): it "
                            "keeps state across calls (a counter, a cache, lazy initialisation)", same.max_rel));
      } else {
        finding("determinism", Cause::kNonDeterministic, "",
                fmt::format("gives results that differ in the last bits on identical calls (max rel difference "
                            "{:.3g}): its result depends on the order of a reduction", same.max_rel));
      }
    }
    // Only random draws may differ between calls; other ops must not move the generators.
    if (!consumes) r0.restore();
    return same.equal;
  }

  // Autocast and grad mode: the forward runs under no-grad, the recompute under grad mode, both
  // with the forward's autocast state.
  void check_autocast(const std::vector<IValue>& inputs, const RngState& r0, bool repeats) {
    AutocastState amp = AutocastState::capture();
    amp.cpu_enabled = true;
    amp.cpu_dtype = c10::kBFloat16;
    std::vector<Tensor> fwd, rec;
    {
      AutocastScope scope(amp);
      r0.restore();
      {
        torch::NoGradGuard no_grad;
        fwd = call(op_, clone_inputs(inputs));
      }
      r0.restore();
      rec = call(op_, clone_inputs(inputs));
    }
    const auto c = compare(fwd, rec);
    if (!c.equal && repeats) {
      finding("autocast", Cause::kAutocast, "",
              fmt::format("under autocast it gives another result with grad mode on (a recompute) than with it "
                          "off (a checkpoint's forward){}",
                          c.note.empty() ? "" : ": " + c.note));
    }
  }

  // The leaves' gradients after one backward of fn(leaves), checkpointed or plain, from RNG state
  // r0 and seeded upstream gradients; an error message instead ("no-autograd": nothing to do).
  std::pair<std::vector<Tensor>, std::string> gradients_of(const TensorsFn& fn, std::vector<Tensor>& leaves,
                                                          const RngState& r0, bool checkpointed) {
    for (auto& l : leaves) l.mutable_grad() = Tensor();
    r0.restore();
    std::vector<Tensor> outs;
    try {
      outs = checkpointed ? checkpoint(fn, leaves) : fn(leaves);
    } catch (const std::exception& e) {
      return {{}, first_line(e.what())};
    }
    std::vector<Tensor> roots, ups;
    for (size_t i = 0; i < outs.size(); ++i) {
      if (!outs[i].requires_grad()) continue;
      auto g = at::make_generator<at::CPUGeneratorImpl>(1000 + i);
      roots.push_back(outs[i]);
      ups.push_back(torch::randn(outs[i].sizes(), g).to(outs[i].scalar_type()));
    }
    if (roots.empty()) return {{}, "no-autograd"};
    try {
      torch::autograd::backward(roots, ups);
    } catch (const std::exception& e) {
      return {{}, first_line(e.what())};
    }
    std::vector<Tensor> gs;
    for (auto& l : leaves) gs.push_back(l.grad().defined() ? l.grad().clone() : Tensor());
    return {gs, ""};
  }

  void gradients(const std::vector<IValue>& inputs, const RngState& r0) {
    auto& r = results_["gradients"];
    std::vector<Tensor> leaves;
    for (const auto& v : inputs) {
      if (v.isTensor() && v.toTensor().is_floating_point()) leaves.push_back(v.toTensor().clone().requires_grad_());
    }
    const TensorsFn fn = [this, inputs](const std::vector<Tensor>& xs) {
      std::vector<IValue> args;
      size_t k = 0;
      for (const auto& v : inputs) {
        // A non-leaf copy, as a segment's input is: ops may write to it.
        args.push_back(v.isTensor() && v.toTensor().is_floating_point() ? IValue(xs[k++] * 1) : v);
      }
      return call(op_, args);
    };
    const auto plain = gradients_of(fn, leaves, r0, false);
    if (plain.second == "no-autograd") {
      if (r.status == Status::kPass) {
        r.status = Status::kSkip;
        r.summary = "its outputs need no gradient (no autograd formula): nothing to compare";
      }
      return;
    }
    if (!plain.second.empty()) {
      note("fails in a plain backward: " + plain.second);
      return;
    }
    const auto ckpt = gradients_of(fn, leaves, r0, true);
    if (!ckpt.second.empty()) {
      const Cause cause = failed("input-mutation") ? Cause::kInPlace : Cause::kNonDeterministic;
      finding("gradients", cause, "", "fails under a checkpoint where the plain call works: " + ckpt.second);
      return;
    }
    const auto c = compare(plain.first, ckpt.first);
    if (!c.equal) {
      Cause cause = Cause::kNonDeterministic;
      for (const char* id : {"input-mutation", "rng", "determinism", "autocast"}) {
        if (failed(id)) {
          cause = results_[id].findings.front().cause;
          break;
        }
      }
      finding("gradients", cause, "",
              fmt::format("gives other gradients checkpointed than plain (max rel difference {:.3g})", c.max_rel));
    }
  }

  Op op_;
  std::string name_;
  std::map<std::string, CheckResult> results_;
};

}  // namespace

std::vector<std::vector<int64_t>> parse_shapes(const std::string& text) {
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> cur;
  std::string num;
  auto flush_num = [&] {
    const auto v = parse_int(num);
    if (!v || *v < 1 || *v > (int64_t{1} << 28)) {
      throw FieldError("shapes", fmt::format("@shapes '{}': write one shape per tensor argument, sizes of at least 1, as 4x16,4x16",
                                             text));
    }
    cur.push_back(*v);
    num.clear();
  };
  for (char c : text + ",") {
    if (c == 'x') {
      flush_num();
    } else if (c == ',') {
      flush_num();
      shapes.push_back(cur);
      cur.clear();
    } else {
      num += c;
    }
  }
  for (const auto& shape : shapes) {
    double elements = 1;
    for (auto n : shape) elements *= static_cast<double>(n);
    if (elements > static_cast<double>(int64_t{1} << 28)) {
      throw FieldError("shapes", fmt::format("@shapes '{}': a shape of {:g} elements; at most 2^28 per tensor", text, elements));
    }
  }
  return shapes;
}

OpValidation validate_op(const OpValidationOptions& o) {
  if (!o.library.empty()) {
    if (!dlopen(o.library.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
      throw FieldError("library", fmt::format("@library {}: cannot load it: {}", o.library, dlerror()));
    }
  }
  if (o.cases < 1) throw FieldError("cases", "@cases must be at least 1");
  const auto op = find_op(o.op);
  size_t tensor_args = 0;
  for (const auto& a : op.schema->arguments()) tensor_args += is_tensor_arg(a);
  if (tensor_args == 0) throw UsageError(fmt::format("{} takes no tensor, so there is nothing to recompute", o.op));
  if (!o.shapes.empty() && o.shapes.size() != tensor_args) {
    throw FieldError("shapes", fmt::format("@shapes gives {} shapes but {} takes {} tensor arguments", o.shapes.size(), o.op, tensor_args));
  }
  Judge judge(op, o.op);
  for (int k = 0; k < o.cases; ++k) judge.run_case(make_inputs(*op.schema, o, k));
  return judge.result(c10::toString(*op.schema), o.cases);
}

}  // namespace ckcheck
