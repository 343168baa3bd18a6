// Flags shared by `wren run` and `wren chat`: model, memory, sampling.
#pragma once
#include <CLI/CLI.hpp>
#include <optional>

#include "cli/cpu_flags.h"
#include "runtime/chat_format.h"
#include "runtime/engine.h"
#include "runtime/generate.h"

namespace wren::cli {

/// Engine + sampling flags; `add_to` registers them on a subcommand.
struct CommonArgs {
  EngineOptions engine;
  SamplerOptions sampling;
  int n = 256;  ///< -n default
  bool think = true;
  std::string effort = "max";         ///< thinking effort (low, high, max), rendered when thinking
  std::optional<std::string> system;  ///< given (even empty: the encoder renders an empty system message)
  CpuFlags cpu;
  CudaFlags cuda;
  bool quiet = false;  ///< --quiet: no load-progress line
  /// --gpus: one pipeline rank per listed CUDA device (cli/launch.h; docs/parallel.md).
  std::vector<int> gpus;
  void add_to(CLI::App* sub, float default_temperature);
  /// The engine options with the CPU and CUDA flags resolved (throws wren::Error on bad names);
  /// prints the run header.
  EngineOptions engine_options() const;
};

/// The chat options these flags give (thinking, effort).
ChatOptions chat_options(const CommonArgs& a);
/// The run-header line for the GPU prefill chunk: "prefill chunk N" (or "" on the CPU). The
/// precision mode is on the CUDA line (describe(CudaOptions)).
std::string describe_gpu(Engine& e, const EngineOptions& o);

/// Prints the statistics line on stderr (prompt tokens, prefill tok/s, TTFT, decode tok/s, peak
/// RSS) and the expert-store line when there is a store.
void print_stats(const GenerateStats& s, Engine& e);

}  // namespace wren::cli
