#include "tests/support/generators.h"

#include <fmt/format.h>

namespace ckcheck::testing {

std::string ModelCase::command(const std::string& extra) const {
  std::string cmd = fmt::format("ckcheck run --model {}", model);
  for (const auto& [k, v] : options) cmd += fmt::format(" --{} {}", k, v);
  cmd += fmt::format(" --policy {} --seed {}", policy, seed);
  if (amp) cmd += " --amp bf16";
  if (restore_buffers) cmd += " --restore-buffers";
  if (!extra.empty()) cmd += " " + extra;
  return cmd;
}

rc::Gen<ModelCase> clean_model_case(bool with_amp) {
  return rc::gen::exec([with_amp] {
    ModelCase c;
    c.model = *rc::gen::element<std::string>("mlp", "transformer", "convnet");
    const int layers = *rc::gen::element(1, 2, 3, 4);
    c.options["layers"] = std::to_string(layers);
    c.options["batch"] = std::to_string(*rc::gen::inRange(2, 4));
    if (c.model == "transformer") {
      const int heads = *rc::gen::element(1, 2, 4);
      c.options["heads"] = std::to_string(heads);
      c.options["hidden"] = std::to_string(heads * *rc::gen::inRange(2, 9));
      c.options["seq"] = std::to_string(*rc::gen::inRange(2, 9));
      c.options["dropout"] = *rc::gen::element<std::string>("0", "0.1", "0.5");
    } else if (c.model == "mlp") {
      c.options["hidden"] = std::to_string(*rc::gen::inRange(1, 33));
      c.options["dropout"] = *rc::gen::element<std::string>("0", "0.1", "0.5");
    } else {
      c.options["channels"] = std::to_string(*rc::gen::inRange(1, 9));
      c.options["size"] = std::to_string(*rc::gen::inRange(2, 9));
      c.restore_buffers = true;
    }
    c.policy = *rc::gen::element<std::string>("every:1", "every:2", "segments", "segments:1",
                                              "sites:blocks.0", "sites:*1");
    if (c.model == "transformer") {
      c.policy = *rc::gen::element(c.policy, std::string("sites:*.attn"), std::string("sites:*.ffn"));
    }
    if (c.policy == "sites:*1" && layers < 2) c.policy = "every:1";
    c.seed = *rc::gen::inRange<uint64_t>(0, 100000);
    c.amp = with_amp && *rc::gen::arbitrary<bool>();
    return c;
  });
}

}  // namespace ckcheck::testing

std::ostream& operator<<(std::ostream& os, const ckcheck::testing::ModelCase& c) {
  return os << c.command();
}
