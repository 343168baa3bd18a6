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
  CudaFlags cuda;
  void add_to(CLI::App* sub, float default_temperature);
  /// The engine options with the CPU and CUDA flags resolved (throws wren::Error on bad names);
  /// prints the run header.
  EngineOptions engine_options() const;
};

/// Prints the statistics line on stderr (prompt tokens, prefill tok/s, TTFT, decode tok/s, peak
/// RSS) and the expert-store line when there is a store.
void print_stats(const GenerateStats& s, Engine& e);

}  // namespace wren::cli
