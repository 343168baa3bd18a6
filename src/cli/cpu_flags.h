// The CPU engine flags shared by `wren run` and `wren bench`: threads, kernel level, dense-weight
// formats (--quant presets and per-class overrides) and the MXFP4 activation mode.
#pragma once
#include <CLI/CLI.hpp>
#include <array>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "model/quant.h"

namespace wren::cli {

struct CpuFlags {
  int threads = 0;               ///< 0 = every core
  std::string isa = "auto";      ///< auto | scalar | avx2 | avx512
  std::string quant = "exact";   ///< preset (model/quant.h)
  std::string mx_act = "f32";    ///< f32 | int8
  std::array<std::string, kWClasses> per_class{};  ///< "" = the preset's format

  /// Registers --threads, --isa, --quant, --quant-<class> and --mx-act on `sub`.
  void add_to(CLI::App* sub);
  /// The formats: the preset with the per-class overrides. Throws wren::Error on bad names.
  QuantPlan plan() const;
  /// The backend options. Throws wren::Error on bad names or an unsupported level.
  CpuOptions backend() const;
};

/// One line for the run header: "cpu avx512 x2 threads; weights attn=q4 ...; experts mxfp4 x f32".
std::string describe(const CpuOptions& o, const QuantPlan& p);

}  // namespace wren::cli
