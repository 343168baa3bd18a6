// `wren synth`: write a random-weight checkpoint in the published K3 layout from a config.
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "synth/synth.h"

namespace wren::cli {

namespace {
struct SynthArgs {
  std::string config, out;
  uint64_t seed = 1;
  double shard_mb = 64;
  bool no_prefix = false;
};
}  // namespace

void add_synth(CLI::App& app) {
  auto a = std::make_shared<SynthArgs>();
  CLI::App* sub = app.add_subcommand("synth", "Write a random-weight K3-layout checkpoint from a config.json");
  sub->add_option("--config", a->config, "config.json to build from")->required();
  sub->add_option("--out", a->out, "Output folder")->required();
  sub->add_option("--seed", a->seed, "Random seed");
  sub->add_option("--shard-mb", a->shard_mb, "Approximate shard size in MB")->check(positive());
  sub->add_flag("--no-prefix", a->no_prefix, "Write names without the 'language_model.' prefix");
  sub->callback([a] {
    std::ifstream f(a->config);
    check(bool(f), a->config + ": cannot open");
    nlohmann::json cfg = nlohmann::json::parse(f, nullptr, false);
    check(!cfg.is_discarded(), a->config + ": not valid JSON");
    SynthOptions o;
    o.seed = a->seed;
    o.shard_bytes = uint64_t(a->shard_mb * 1e6);
    o.prefix = !a->no_prefix;
    write_synthetic_checkpoint(cfg, a->out, o);
  });
}

}  // namespace wren::cli
