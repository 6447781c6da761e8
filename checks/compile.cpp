// compile (with --compile): what the compiler did to the steps. The compiled plain step computes the
// eager step's math (within a stated tolerance); the checkpointed step compiles into as many graphs
// as the plain one (a graph break moves the checkpoint's boundaries); how many tensors each saves
// for its backward, and what compiling cost.
#include <fmt/ranges.h>

#include "checks/common.h"

namespace ckcheck {
namespace {

constexpr CauseWord kCompiledMathWord{
    "compiled-math",
    "the compiled plain step differs from the eager one beyond rounding: the compiler changes the math, "
    "checkpointing aside; check the model with torch.compile alone (compare eager and compiled outputs) and "
    "report it to PyTorch with the smallest model that shows it"};
const Cause kCompiledMath{kCompiledMathWord};

constexpr CauseWord kGraphBreakWord{
    "graph-break",
    "the checkpointed step compiles into more graphs than the plain one, so checkpoints no longer cover what they "
    "were placed around: remove the graph break inside the checkpointed blocks (TORCH_LOGS=graph_breaks names it)"};
const Cause kGraphBreak{kGraphBreakWord};

// How the Python side (ckcheck/_compile.py, CHECKPOINTED_ONLY) marks a graph break that only the
// checkpointed step's compile met.
constexpr const char* kCheckpointedOnly = "checkpointed step only: ";

class CompileCheck : public DeclaredCheck {
 public:
  CompileCheck()
      : DeclaredCheck(CheckInfo{"compile", CheckKind::kTraining, 140,
          "(with --compile) the compiled plain step computes the eager one's math, and the checkpointed step "
          "compiles into the graphs the plain one does"}
          .applying(Applies::kWithCompile)
          .with_causes({kCompiledMath, kGraphBreak})) {}

  CheckResult run(const CheckContext& ctx) const override {
    if (!ctx.records.compiled) return skipped(id(), "not compiled (run with --compile)");
    const auto& c = *ctx.records.compiled;
    auto r = result();
    r.details = {{"mode", c.mode},
                 {"memory_budget", c.memory_budget},
                 {"compile_seconds", c.compile_seconds},
                 {"plain_graphs", c.plain_graphs},
                 {"checkpointed_graphs", c.checkpointed_graphs},
                 {"graph_breaks", c.graph_breaks},
                 {"plain_saved_tensors", c.plain_saved},
                 {"checkpointed_saved_tensors", c.checkpointed_saved},
                 {"random_ops_recomputed_fresh", c.recomputed_random.size()},
                 {"random_ops_replayed", c.replayed_random},
                 {"eager_compared", c.eager_compared},
                 {"eager_max_rel", c.eager_max_rel},
                 {"eager_tolerance", c.eager_tolerance}};
    if (c.eager_compared && c.eager_max_rel > c.eager_tolerance) {
      r.status = Status::kWarn;
      add_finding(r, {kCompiledMath, "", c.eager_worst,
                      fmt::format("the compiled plain step differs from the eager one by {:.3g} of the largest value "
                                  "(in {}), beyond the tolerance {:.0e}",
                                  c.eager_max_rel, c.eager_worst, c.eager_tolerance),
                      ""});
    }
    // Graph breaks only the checkpointed step met (the Python side marks them): a checkpoint Dynamo
    // could not trace runs outside the compiled graph, around compiled pieces.
    std::vector<std::string> own;
    for (const auto& b : c.graph_breaks) {
      if (b.rfind(kCheckpointedOnly, 0) == 0) own.push_back(b.substr(std::string(kCheckpointedOnly).size()));
    }
    if (!own.empty() || c.checkpointed_graphs > c.plain_graphs) {
      r.status = Status::kWarn;
      add_finding(r, {kGraphBreak, "", "",
                      fmt::format("the checkpointed step's compile breaks the graph where the plain step's does not "
                                  "({} against {}){}",
                                  count_of(static_cast<size_t>(c.checkpointed_graphs), "new graph"),
                                  count_of(static_cast<size_t>(c.plain_graphs), "graph"),
                                  own.empty() ? "" : fmt::format(": {}", fmt::join(own, "; "))),
                      ""});
    }
    const std::string eager =
        c.eager_compared ? fmt::format("the compiled plain step is the eager one's math within {:.2g} (tolerance {:.0e})",
                                       c.eager_max_rel, c.eager_tolerance)
                         : "eager and compiled not compared: " + c.eager_note;
    const std::string graphs = fmt::format("graphs compiled: {} plain, {} checkpointed; tensors saved for backward {} -> {}; "
                                           "compiling took {:.1f} s",
                                           c.plain_graphs, c.checkpointed_graphs, c.plain_saved, c.checkpointed_saved,
                                           c.compile_seconds);
    r.summary = eager + "; " + graphs;
    return r;
  }
};

}  // namespace

CKCHECK_REGISTER_CHECK(CompileCheck);

}  // namespace ckcheck
