// The engine flags shared by `wren run`, `chat`, `serve`, `validate` and `bench`: the CPU ones
// (threads, kernel level, dense-weight formats: --quant presets and per-class overrides, the MXFP4
// activation mode) and the CUDA ones (KDA path, the fault-injection test hook).
#pragma once
#include <CLI/CLI.hpp>
#include <array>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_options.h"
#include "model/quant.h"

namespace wren::cli {

struct CpuFlags {
  int threads = 0;               ///< 0 = every core
  std::string isa = "auto";      ///< auto | scalar | avx2 | avx512
  std::string quant;             ///< preset (model/quant.h); "" = the default rule of plan()
  std::string mx_act = "f32";    ///< f32 | int8
  std::array<std::string, kWClasses> per_class{};  ///< "" = the preset's format

  /// Registers --threads, --isa, --quant, --quant-<class> and --mx-act on `sub`.
  void add_to(CLI::App* sub);
  /// The formats: the preset with the per-class overrides. Without --quant the preset is
  /// "stored" (the checkpoint's dtype: BF16 matrices stay BF16) when `gpu_fast` (the run's backend
  /// is CUDA in fast precision mode: gpu_fast()), else "exact" (all f32). Throws wren::Error on
  /// bad names.
  QuantPlan plan(bool gpu_fast = false) const;
  /// The backend options. Throws wren::Error on bad names or an unsupported level.
  CpuOptions backend() const;
};

/// True when `backend` (cpu | cuda | auto) resolves to CUDA and `precision` is fast: the case in
/// which CpuFlags::plan keeps the checkpoint's BF16 matrices as BF16. Throws as resolve_backend.
bool gpu_fast(const std::string& backend, GpuPrecision precision);

/// One line for the run header: "cpu avx512 x2 threads; weights attn=q4 ...; experts mxfp4 x f32".
std::string describe(const CpuOptions& o, const QuantPlan& p);

struct CudaFlags {
  GpuPrecision precision = GpuPrecision::Fast;  ///< --gpu-precision: fast (the CLI default) | exact
  std::string kda;                ///< --cuda-kda: recurrent | chunked; "" = the precision's (fast: chunked)
  int kda_chunk = 32;             ///< --cuda-kda-chunk: 16 | 32 | 64
  uint64_t fault_at = 0;          ///< --cuda-fault-at (test hook, not in --help)

  /// Registers --gpu-precision, --cuda-kda, --cuda-kda-chunk and --cuda-fault-at on `sub`.
  void add_to(CLI::App* sub);
  /// The backend options. Throws wren::Error on bad values.
  CudaOptions backend() const;
};

/// The run header on stderr: the CPU line (the backend, or the fallback of a GPU run) and, when
/// `backend` resolves to cuda, the CUDA line ("wren: cuda precision fast; kda chunked (chunk 32)"). Throws wren::Error when
/// `backend` cannot be used (resolve_backend).
/// `strict` (--strict) is echoed on the CPU line ("; strict (no slow fallbacks)"), and so is
/// `predict` (--predict: "; expert prediction on|off").
void print_run_header(const std::string& backend, const CpuOptions& cpu, const QuantPlan& plan,
                      const CudaOptions& cuda, bool strict = false, bool predict = true);

}  // namespace wren::cli
