// Flags shared by `wren run` and `wren chat`: model, memory, sampling.
#pragma once
#include <CLI/CLI.hpp>

#include "cli/cpu_flags.h"
#include "runtime/engine.h"
#include "runtime/generate.h"

namespace wren::cli {

/// Engine + sampling flags; `add_to` registers them on a subcommand.
struct CommonArgs {
  EngineOptions engine;
  SamplerOptions sampling;
  int n = 256;  ///< -n default
  bool think = true;
  std::string system;
  CpuFlags cpu;
  void add_to(CLI::App* sub, float default_temperature);
  /// The engine options with the CPU flags resolved (throws wren::Error on bad names).
  EngineOptions engine_options() const;
};

/// Registers --gpu-precision exact|fast on `sub` (CUDA numerics; default fast).
void add_gpu_precision(CLI::App* sub, GpuPrecision& p);
/// The run-header line for the GPU side: "gpu precision fast, prefill chunk N" (or "" on the CPU).
std::string describe_gpu(Engine& e, const EngineOptions& o);

/// Prints the statistics line on stderr (prompt tokens, prefill tok/s, TTFT, decode tok/s, peak
/// RSS) and the expert-store line when there is a store.
void print_stats(const GenerateStats& s, Engine& e);

}  // namespace wren::cli
