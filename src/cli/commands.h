// The `wren` subcommands; each file registers one with CLI11 and runs it.
#pragma once
#include <CLI/CLI.hpp>

namespace wren::cli {

void add_run(CLI::App& app);
void add_chat(CLI::App& app);
void add_inspect(CLI::App& app);
void add_synth(CLI::App& app);
void add_bench(CLI::App& app);
void add_bench_experts(CLI::App* bench);
void add_bench_layers(CLI::App* bench);
void add_bench_cpu(CLI::App* bench);
void add_bench_tokenizer(CLI::App* bench);
void add_tokenize(CLI::App& app);
void add_serve(CLI::App& app);
void add_validate(CLI::App& app);

}  // namespace wren::cli
