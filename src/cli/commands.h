// The `wren` subcommands; each file registers one with CLI11 and runs it.
#pragma once
#include <CLI/CLI.hpp>

namespace wren::cli {

void add_run(CLI::App& app);
void add_inspect(CLI::App& app);
void add_synth(CLI::App& app);
void add_bench(CLI::App& app);

}  // namespace wren::cli
