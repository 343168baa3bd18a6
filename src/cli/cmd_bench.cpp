// `wren bench`: benchmarks that measure a reference in the same run (a ratio, not a bare time).
#include "cli/commands.h"

namespace wren::cli {

void add_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks with a reference measured in the same run");
  bench->require_subcommand(1);
  add_bench_experts(bench);
  add_bench_layers(bench);
  add_bench_prefill(bench);
  add_bench_cpu(bench);
  add_bench_tokenizer(bench);
}

}  // namespace wren::cli
