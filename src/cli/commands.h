// The `wren` subcommands; each file registers one with CLI11 and runs it.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace wren::cli {

/// Option checks with plain messages ("must be greater than 0 (got 0)", "'abc' is not a number"),
/// instead of CLI11's PositiveNumber / NonNegativeNumber, which print the whole double range.
CLI::Validator positive();
CLI::Validator non_negative();

/// When argv names a command (or a `bench` subcommand) that does not exist, a one-line error
/// listing the commands there are; "" otherwise (CLI11 alone says "A subcommand is required").
std::string unknown_command(CLI::App& app, int argc, char** argv);

void add_run(CLI::App& app);
void add_chat(CLI::App& app);
void add_inspect(CLI::App& app);
void add_synth(CLI::App& app);
void add_bench(CLI::App& app);
void add_bench_experts(CLI::App* bench);
void add_bench_layers(CLI::App* bench);
void add_bench_prefill(CLI::App* bench);
void add_bench_serve(CLI::App* bench);
void add_bench_cpu(CLI::App* bench);
void add_bench_tokenizer(CLI::App* bench);
void add_tokenize(CLI::App& app);
void add_detokenize(CLI::App& app);
void add_serve(CLI::App& app);
void add_validate(CLI::App& app);
void add_perplexity(CLI::App& app);

}  // namespace wren::cli
