// The CPU engine flags (see cpu_flags.h).
#include "cli/cpu_flags.h"
#include "cli/commands.h"

#include <map>
#include <algorithm>
#include <cstdio>
#include <thread>

#include "core/error.h"
#include "runtime/backend_factory.h"

namespace wren::cli {

void CpuFlags::add_to(CLI::App* sub) {
  sub->add_option("--threads", threads, "Threads (default: every core; at most 1024)")->check(CLI::Range(0, 1024))->default_str("every core");
  sub->add_option("--isa", isa, "Kernel level: auto, scalar (the reference kernels), avx2, avx512")
      ->check(CLI::IsMember({"auto", "scalar", "avx2", "avx512"}));
  sub->add_option("--quant", quant,
                  "Dense-weight formats: exact (all f32; the default on the CPU and with --gpu-precision exact), "
                  "stored (the checkpoint's dtype: bf16 matrices stay bf16, others f32; the default on CUDA in "
                  "fast mode), bf16, q8, default (q4 attn/latent/shared/dense, q8 mla/head, bf16 router/embed), q4");
  for (int c = 1; c < kWClasses; ++c) {
    const std::string name = wclass_name(WClass(c));
    sub->add_option("--quant-" + name, per_class[c], "Format of the " + name + " weights: f32, bf16, q8, q4");
  }
  sub->add_option("--mx-act", mx_act, "MXFP4 expert activations: f32 (default, exact) or int8 (per-32-group)")
      ->check(CLI::IsMember({"f32", "int8"}));
}

bool gpu_fast(const std::string& backend, GpuPrecision precision) {
  return precision == GpuPrecision::Fast && resolve_backend(backend) == "cuda";
}

QuantPlan CpuFlags::plan(bool gpu_fast) const {
  QuantPlan p = QuantPlan::preset(!quant.empty() ? quant : gpu_fast ? "stored" : "exact");
  for (int c = 1; c < kWClasses; ++c)
    if (!per_class[c].empty())
      p.set(WClass(c), parse_wformat(per_class[c], std::string("--quant-") + wclass_name(WClass(c))));
  return p;
}

CpuOptions CpuFlags::backend() const {
  CpuOptions o;
  o.threads = threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency()));
  o.isa = cpu::parse_isa(isa);
  check(mx_act == "f32" || mx_act == "int8", "--mx-act: '" + mx_act + "' is not an activation mode (expected f32 or int8)");
  o.mx_int8_act = mx_act == "int8";
  return o;
}

std::string describe(const CpuOptions& o, const QuantPlan& p) {
  return std::string("cpu ") + cpu::isa_name(o.isa) + ", " + std::to_string(o.threads) + " thread" +
         (o.threads == 1 ? "" : "s") + "; weights " + p.describe() + "; experts mxfp4 x " +
         (o.mx_int8_act ? "int8" : "f32") + " activations";
}

void CudaFlags::add_to(CLI::App* sub) {
  sub->add_option("--gpu-precision", precision,
                  "CUDA numerics: fast (default: prefill on tensor cores, BF16 operands, f32 accumulation) or "
                  "exact (the f32 path, bit-stable across chunk sizes)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, GpuPrecision>{{"exact", GpuPrecision::Exact},
                                                                              {"fast", GpuPrecision::Fast}}))
      ->default_str("fast");
  sub->add_option("--cuda-kda", kda,
                  "CUDA: KDA path for prefill: recurrent (the CPU's order; default in exact mode) or chunked "
                  "(default in fast mode)");
  sub->add_option("--cuda-kda-chunk", kda_chunk, "CUDA: chunk length of --cuda-kda chunked: 16, 32 (default) or 64")
      ->check(CLI::IsMember({16, 32, 64}));
  sub->add_option("--cuda-fault-at", fault_at, "Test hook: CUDA kernel launch N fails (exercises the CPU fallback)")
      ->group("");  // hidden: a test hook, documented in docs/backends.md
}

CudaOptions CudaFlags::backend() const {
  CudaOptions o;
  o.precision = precision;
  o.kda = !kda.empty() ? parse_cuda_kda(kda, "--cuda-kda")
                       : precision == GpuPrecision::Fast ? CudaKda::Chunked : CudaKda::Recurrent;
  o.kda_chunk = kda_chunk;
  o.fault_at = fault_at;
  check_cuda_options(o, "--cuda-kda-chunk");
  return o;
}

void print_run_header(const std::string& backend, const CpuOptions& cpu, const QuantPlan& plan,
                      const CudaOptions& cuda, bool strict, bool predict) {
  std::fprintf(stderr, "wren: %s%s; expert prediction %s\n", describe(cpu, plan).c_str(),
               strict ? "; strict (no slow fallbacks)" : "", predict ? "on" : "off");
  if (resolve_backend(backend) == "cuda") std::fprintf(stderr, "wren: %s\n", describe(cuda).c_str());
}

}  // namespace wren::cli
