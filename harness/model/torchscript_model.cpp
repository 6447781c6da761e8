#include "harness/model/torchscript_model.h"

#include <fmt/format.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/custom_operator.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/script.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sys/stat.h>

#include "harness/support/errors.h"
#include "harness/support/text.h"

namespace ckcheck {
namespace {

// Why `path` is not a regular file to read ("" when it is one).
std::string not_a_file(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return errno == ENOENT || errno == ENOTDIR ? "no such file" : std::strerror(errno);
  if (S_ISDIR(st.st_mode)) return "is a folder, not a file";
  if (!S_ISREG(st.st_mode)) return "is a device, pipe or socket, not a file";
  return "";
}

using c10::IValue;
using torch::Tensor;
using torch::jit::Stack;

const char* kSiteCall = "ckcheck::site_call";

class TorchScriptModel;

// The runner and model a site_call reaches: set by TorchScriptModel::forward and by every site
// function (which may run again in the backward, as a recompute).
thread_local SiteRunner* current_runner = nullptr;
thread_local const TorchScriptModel* current_model = nullptr;

struct RunnerScope {
  RunnerScope(SiteRunner* r, const TorchScriptModel* m) : runner(current_runner), model(current_model) {
    current_runner = r;
    current_model = m;
  }
  ~RunnerScope() {
    current_runner = runner;
    current_model = model;
  }
  SiteRunner* runner;
  const TorchScriptModel* model;
};

// "Traceback ... RuntimeError: what went wrong" -> "what went wrong".
std::string one_line(const std::string& message) {
  const std::string key = "RuntimeError: ";
  const auto at = message.rfind(key);
  std::string s = at == std::string::npos ? message : message.substr(at + key.size());
  const auto nl = s.find('\n');
  if (nl != std::string::npos) s = s.substr(0, nl);
  return s;
}

// Arguments a site may take: tensors (the checkpoint's inputs), optional tensors, and plain
// values that pass through unchanged (numbers, flags, strings, None, lists of numbers).
bool passable_argument(const c10::TypePtr& t) {
  switch (t->kind()) {
    case c10::TypeKind::TensorType:
    case c10::TypeKind::IntType:
    case c10::TypeKind::FloatType:
    case c10::TypeKind::BoolType:
    case c10::TypeKind::StringType:
    case c10::TypeKind::NoneType:
      return true;
    case c10::TypeKind::OptionalType:
      return passable_argument(t->castRaw<c10::OptionalType>()->getElementType());
    case c10::TypeKind::ListType: {
      const auto e = t->castRaw<c10::ListType>()->getElementType()->kind();
      return e == c10::TypeKind::IntType || e == c10::TypeKind::FloatType || e == c10::TypeKind::BoolType;
    }
    default:
      return false;
  }
}

// What a site may return: tensors, optional tensors (None), and tuples of those.
bool checkpointable_output(const c10::TypePtr& t) {
  switch (t->kind()) {
    case c10::TypeKind::TensorType:
    case c10::TypeKind::NoneType:
      return true;
    case c10::TypeKind::OptionalType:
      return t->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType;
    case c10::TypeKind::TupleType: {
      for (const auto& e : t->castRaw<c10::TupleType>()->elements()) {
        if (!checkpointable_output(e)) return false;
      }
      return true;
    }
    default:
      return false;
  }
}

std::string signature_problem(const c10::FunctionSchema& schema) {
  for (size_t i = 1; i < schema.arguments().size(); ++i) {
    const auto& a = schema.arguments()[i];
    if (!passable_argument(a.type())) {
      return fmt::format("its forward takes {} '{}' of type {}", "argument", a.name(), a.type()->annotation_str());
    }
  }
  for (const auto& r : schema.returns()) {
    if (!checkpointable_output(r.type())) return fmt::format("its forward returns {}", r.type()->annotation_str());
  }
  return "";
}

// The tensors of an output, in order (None and other values are not the checkpoint's).
void output_tensors(const IValue& v, std::vector<Tensor>& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) output_tensors(e, out);
  }
}

class TorchScriptModel : public Model {
 public:
  TorchScriptModel(torch::jit::Module module, std::string name, TorchScriptInputs inputs, uint64_t seed)
      : module_(std::move(module)), name_(std::move(name)), inputs_(std::move(inputs)), seed_(seed) {
    if (inputs_.mode == "train" || inputs_.mode == "eval") {
      module_.train(inputs_.mode == "train");
    } else if (inputs_.mode != "as-saved") {
      throw FieldError("mode", fmt::format("@mode '{}'; valid: as-saved (each module's training flag as exported), train, eval",
                                           inputs_.mode));
    }
    // Every module object, by identity, with its path.
    std::vector<std::pair<std::string, torch::jit::Module>> all;
    all.push_back({"", module_});
    for (const auto& item : module_.named_modules()) {
      if (!item.name.empty()) all.push_back({item.name, item.value});
    }
    std::set<c10::ClassType*> types;
    for (const auto& [path, m] : all) {
      paths_[m._ivalue().get()] = path;
      types.insert(m.type().get());
      collect_attributes(path, m);
    }
    std::set<c10::ClassType*> called;
    for (auto* type : types) {
      for (auto* fn : type->methods()) {
        auto graph = torch::jit::toGraphFunction(*fn).graph();
        rewrite(graph->block(), *graph, called);
      }
    }
    for (const auto& [path, m] : all) {
      if (path.empty() || !called.count(m.type().get())) continue;
      sites_.push_back(path);
      if (auto method = m.find_method("forward")) {
        const auto problem = signature_problem(method->function().getSchema());
        if (!problem.empty()) problems_[path] = problem;
      }
    }
    // The default candidates are the top-level submodules, all of them: one that cannot be
    // checkpointed is an error naming it (choose others with --sites), never silently left out.
    for (const auto& s : sites_) {
      if (s.find('.') == std::string::npos) default_sites_.push_back(s);
    }
    if (default_sites_.empty()) default_sites_ = sites_;
  }

  std::string name() const override { return name_; }
  std::vector<std::string> sites() const override { return sites_; }
  std::vector<std::string> default_sites() const override { return default_sites_; }

  std::string site_problem(const std::string& site) const override {
    auto it = problems_.find(site);
    return it == problems_.end()
               ? ""
               : fmt::format("{}; only submodules whose forward takes tensors, optional tensors or plain values and "
                             "returns tensors (or tuples of them) can be checkpointed",
                             it->second);
  }

  std::vector<Tensor> make_inputs(uint64_t seed) override {
    std::vector<Tensor> out;
    if (!inputs_.file.empty()) {
      out = load_inputs(inputs_.file);
    } else {
      out.push_back(random_input(seed));
    }
    for (auto& t : out) t = t.to(device_);
    return out;
  }

  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, SiteRunner& runner) override {
    RunnerScope scope(&runner, this);
    std::vector<IValue> args(inputs.begin(), inputs.end());
    IValue out;
    try {
      out = module_.forward(args);
    } catch (const c10::Error& e) {
      // The interpreter's message carries a TorchScript traceback; keep the part that says why.
      throw std::runtime_error(fmt::format("{} rejects its input: {}", name_, one_line(e.what_without_backtrace())));
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(fmt::format("{} rejects its input: {}", name_, one_line(e.what())));
    }
    std::vector<Tensor> outs;
    flatten(out, outs);
    if (outs.empty()) throw std::runtime_error(fmt::format("{} returned no tensor", name_));
    return outs;
  }

  NamedTensors named_parameters() override {
    NamedTensors out;
    for (const auto& p : module_.named_parameters(true)) out.emplace_back(p.name, p.value);
    return out;
  }
  NamedTensors named_buffers() override {
    NamedTensors out;
    for (const auto& b : module_.named_buffers(true)) out.emplace_back(b.name, b.value);
    return out;
  }
  void to(const torch::Device& device) override {
    module_.to(device);
    device_ = device;
  }
  torch::Device device() const override { return device_; }

  // Every attribute that is not a parameter, buffer or submodule -- numbers, flags, strings,
  // tensors held as plain attributes, containers of those, each module's training flag -- is
  // state: snapshot, restored before every run, and compared after the step.
  std::string state_kind_of(const std::string& name) const override {
    auto it = attribute_kinds_.find(name);
    return it != attribute_kinds_.end() ? it->second : Model::state_kind_of(name);
  }

  std::vector<std::string> eval_modules() const override {
    std::vector<std::string> out;
    for (const auto& a : attributes_) {
      if (a.name == "training" && !a.object->getSlot(a.slot).toBool()) out.push_back(a.path.empty() ? "(root)" : a.path);
    }
    return out;
  }

  ModelState snapshot() override {
    auto s = Model::snapshot();
    for (const auto& a : attributes_) s.values.emplace_back(a.full, a.object->getSlot(a.slot).deepcopy());
    return s;
  }

  void restore(const ModelState& state) override {
    Model::restore(state);
    std::map<std::string, const IValue*> values;
    for (const auto& [name, v] : state.values) values[name] = &v;
    for (const auto& a : attributes_) {
      auto it = values.find(a.full);
      if (it != values.end()) a.object->setSlot(a.slot, it->second->deepcopy());
    }
  }

  std::map<std::string, std::string> options() const override {
    std::map<std::string, std::string> o;
    if (inputs_.mode != "as-saved") o["mode"] = inputs_.mode;
    if (inputs_.random.given()) o["input-shape"] = inputs_.random.shape_text();
    o["input-dtype"] = inputs_.random.dtype_text();
    if (inputs_.random.range) o["input-range"] = inputs_.random.range_text();
    if (!inputs_.file.empty()) o["input"] = inputs_.file;
    return o;
  }

  std::string path_of(const c10::ivalue::Object* obj) const {
    auto it = paths_.find(obj);
    return it == paths_.end() ? "" : it->second;
  }
  bool eligible(const std::string& path) const { return !path.empty() && !problems_.count(path); }

 private:
  static void flatten(const IValue& v, std::vector<Tensor>& out) {
    if (v.isTensor()) {
      out.push_back(v.toTensor());
    } else if (v.isTuple()) {
      for (const auto& e : v.toTupleRef().elements()) flatten(e, out);
    } else if (v.isList()) {
      for (const auto& e : v.toListRef()) flatten(e, out);
    } else if (v.isGenericDict()) {
      for (const auto& kv : v.toGenericDict()) flatten(kv.value(), out);
    }
  }

  void rewrite(torch::jit::Block* block, torch::jit::Graph& graph, std::set<c10::ClassType*>& called) {
    static const auto site_call = c10::Symbol::fromQualString(kSiteCall);
    for (auto it = block->nodes().begin(); it != block->nodes().end();) {
      torch::jit::Node* n = *it;
      ++it;
      for (auto* sub : n->blocks()) rewrite(sub, graph, called);
      if (n->kind() != c10::prim::CallMethod || n->s(c10::attr::name) != "forward") continue;
      auto type = n->input(0)->type()->cast<c10::ClassType>();
      if (!type || !type->is_module()) continue;
      called.insert(type.get());
      auto* call = graph.create(site_call, n->inputs(), n->outputs().size());
      call->insertBefore(n);
      for (size_t i = 0; i < n->outputs().size(); ++i) {
        call->output(i)->setType(n->output(i)->type());
        n->output(i)->replaceAllUsesWith(call->output(i));
      }
      n->destroy();
    }
  }

  std::vector<Tensor> load_inputs(const std::string& path) const {
    if (const auto problem = not_a_file(path); !problem.empty()) {
      throw FieldError("input_file", fmt::format("@input_file {}: {}; give a file of tensors saved with torch.save", path, problem));
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) throw FieldError("input_file", fmt::format("@input_file {}: cannot read the file ({})", path, std::strerror(errno)));
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    IValue v;
    try {
      v = torch::jit::pickle_load(bytes);
    } catch (const std::exception& e) {
      throw FieldError("input_file", fmt::format("@input_file {}: not a file of tensors saved with torch.save ({})", path,
                                                 one_line(e.what())));
    }
    std::vector<Tensor> out;
    flatten(v, out);
    if (out.empty()) throw FieldError("input_file", fmt::format("@input_file {}: holds no tensor", path));
    return out;
  }

  Tensor random_input(uint64_t seed) const {
    if (!inputs_.random.given()) {
      throw FieldError("input_shape", fmt::format("model {} is a TorchScript file: give its input with @input_shape "
                                                  "(e.g. 2,3,224,224) or @input_file FILE",
                                                  name_));
    }
    return inputs_.random.make(seed);
  }

  struct Attribute {
    std::string path, name, full;  // module path, attribute name, path.name
    c10::intrusive_ptr<c10::ivalue::Object> object;
    size_t slot = 0;
  };

  void collect_attributes(const std::string& path, const torch::jit::Module& m) {
    const auto object = m._ivalue();
    const auto& type = object->type();
    std::set<const c10::TensorImpl*> owned;  // parameters and buffers: snapshot as such
    for (const auto& p : module_.named_parameters(true)) owned.insert(p.value.unsafeGetTensorImpl());
    for (const auto& b : module_.named_buffers(true)) owned.insert(b.value.unsafeGetTensorImpl());
    for (size_t i = 0; i < type->numAttributes(); ++i) {
      if (type->is_parameter(i) || type->is_buffer(i)) continue;
      const auto attr_type = type->getAttribute(i);
      if (auto cls = attr_type->cast<c10::ClassType>(); cls && cls->is_module()) continue;
      const auto value = object->getSlot(i);
      if (value.isTensor() && owned.count(value.toTensor().unsafeGetTensorImpl())) continue;
      if (!(value.isTensor() || value.isInt() || value.isDouble() || value.isBool() || value.isString() ||
            value.isNone() || value.isList() || value.isTuple() || value.isGenericDict())) {
        continue;  // objects and functions are not state a step changes
      }
      Attribute a{path, type->getAttributeName(i), "", object, i};
      a.full = "@" + (path.empty() ? a.name : path + "." + a.name);
      attributes_.push_back(a);
    }
  }

  // The attributes as tensors to compare: a tensor as itself, a number or flag as a 0-d tensor, a
  // string by its hash, a container element by element ("@blocks.0.cache.1").
  void attribute_tensors(const std::string& name, const IValue& v, const std::string& kind, NamedTensors& out) {
    if (v.isTensor()) {
      out.emplace_back(name, v.toTensor());
      attribute_kinds_[name] = state_kind::kTensorAttribute;
    } else if (v.isNone()) {
      out.emplace_back(name, Tensor());
      attribute_kinds_[name] = state_kind::kTensorAttribute;
    } else if (v.isInt() || v.isDouble() || v.isBool() || v.isString()) {
      Tensor t = v.isInt()      ? torch::tensor(v.toInt(), torch::kLong)
                 : v.isDouble() ? torch::tensor(v.toDouble(), torch::kDouble)
                 : v.isBool()   ? torch::tensor(v.toBool())
                                : torch::tensor(static_cast<int64_t>(std::hash<std::string>()(v.toStringRef())), torch::kLong);
      out.emplace_back(name, t);
      attribute_kinds_[name] = kind;
    } else {
      size_t k = 0;
      auto each = [&](const IValue& e) { attribute_tensors(fmt::format("{}.{}", name, k++), e, state_kind::kScalarAttribute, out); };
      if (v.isList()) {
        for (const auto& e : v.toListRef()) each(e);
      } else if (v.isTuple()) {
        for (const auto& e : v.toTupleRef().elements()) each(e);
      } else if (v.isGenericDict()) {
        for (const auto& kv : v.toGenericDict()) each(kv.value());
      }
    }
  }

  NamedTensors extra_state() override {
    NamedTensors out;
    for (const auto& a : attributes_) {
      attribute_tensors(a.full, a.object->getSlot(a.slot), a.name == "training" ? state_kind::kMode : state_kind::kScalarAttribute,
                        out);
    }
    return out;
  }

  torch::jit::Module module_;
  std::vector<Attribute> attributes_;
  std::map<std::string, std::string> attribute_kinds_;
  std::string name_;
  TorchScriptInputs inputs_;
  uint64_t seed_;
  torch::Device device_ = torch::kCPU;
  std::map<const c10::ivalue::Object*, std::string> paths_;
  std::vector<std::string> sites_, default_sites_;
  std::map<std::string, std::string> problems_;
};

IValue rebuild(const IValue& v, const std::vector<Tensor>& tensors, size_t& next) {
  if (v.isTensor()) return tensors.at(next++);
  if (v.isTuple()) {
    std::vector<IValue> elems;
    for (const auto& e : v.toTupleRef().elements()) elems.push_back(rebuild(e, tensors, next));
    return c10::ivalue::Tuple::create(std::move(elems));
  }
  return v;
}

torch::jit::Operation site_call_op(const torch::jit::Node* node) {
  // The node tells how many inputs the call has (the module and its arguments).
  const size_t n = node->inputs().size();
  return [n](Stack& stack) {
    std::vector<IValue> args(stack.end() - static_cast<int64_t>(n), stack.end());
    torch::jit::drop(stack, n);
    auto self = args[0].toObject();
    std::vector<IValue> rest(args.begin() + 1, args.end());
    const TorchScriptModel* model = current_model;
    SiteRunner* runner = current_runner;
    const std::string path = model ? model->path_of(self.get()) : "";
    auto call_plain = [&self](std::vector<IValue> a) {
      torch::jit::Method method(self, &self->type()->getMethod("forward"));
      return method(std::move(a));
    };
    if (!runner || !model->eligible(path)) {
      torch::jit::push(stack, call_plain(std::move(rest)));
      return;
    }
    // The tensors among the actual arguments are the checkpoint's inputs; the other arguments
    // (None for an absent mask, numbers, flags) go to every call unchanged.
    std::vector<Tensor> xs;
    std::vector<size_t> tensor_at;
    for (size_t i = 0; i < rest.size(); ++i) {
      if (rest[i].isTensor()) {
        xs.push_back(rest[i].toTensor());
        tensor_at.push_back(i);
      }
    }
    auto structure = std::make_shared<IValue>();
    SiteFn fn = [self, model, runner, structure, rest, tensor_at](const std::vector<Tensor>& ts) {
      RunnerScope scope(runner, model);
      torch::jit::Method method(self, &self->type()->getMethod("forward"));
      auto call_args = rest;
      for (size_t k = 0; k < tensor_at.size(); ++k) call_args[tensor_at[k]] = ts[k];
      IValue out = method(std::move(call_args));
      std::vector<Tensor> outs;
      output_tensors(out, outs);
      *structure = out;
      return outs;
    };
    auto outs = runner->call(path, fn, xs);
    size_t next = 0;
    torch::jit::push(stack, rebuild(*structure, outs, next));
  };
}


}  // namespace

void register_torchscript_ops() {
  static torch::jit::RegisterOperators reg({torch::jit::Operator(
      c10::Symbol::fromQualString(kSiteCall), site_call_op, c10::AliasAnalysisKind::CONSERVATIVE)});
  // ckcheck compares runs op for op: no fusion or specialisation between them.
  torch::jit::setGraphExecutorOptimize(false);
}

std::unique_ptr<Model> load_torchscript_model(const std::string& path, const TorchScriptInputs& inputs,
                                              uint64_t seed) {
  register_torchscript_ops();
  if (const auto problem = not_a_file(path); !problem.empty()) {
    throw FieldError("model", fmt::format("@model {}: {}{}", path, problem,
                                          problem == "no such file" ? ", and no built-in model has that name (see `ckcheck list`)"
                                                                    : "; give a TorchScript file saved with torch.jit.save"));
  }
  torch::jit::Module module;
  try {
    module = torch::jit::load(path);
  } catch (const std::exception& e) {
    throw FieldError("model", fmt::format("@model {}: not a readable TorchScript file (save one with "
                                          "torch.jit.save): {}",
                                          path, one_line(e.what())));
  }
  auto slash = path.find_last_of('/');
  auto model = std::make_unique<TorchScriptModel>(std::move(module),
                                                  slash == std::string::npos ? path : path.substr(slash + 1),
                                                  inputs, seed);
  if (model->sites().empty()) {
    throw FieldError("model", fmt::format("@model {}: its forward calls no submodule, so there is nothing "
                                          "to checkpoint",
                                          path));
  }
  // The input options are checked now, before any step runs: their errors are the user's, not the model's.
  model->make_inputs(seed);
  return model;
}

}  // namespace ckcheck
