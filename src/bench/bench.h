// The benchmarks behind `wren bench` (the CLI glue that parses their flags is cli/cmd_bench.cpp).
// Each measures a reference in the same run (a ratio, not a bare time) and prints a table (or JSON)
// on stdout; each throws wren::Error on bad input (missing model, bad names).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_options.h"
#include "model/quant.h"
#include "runtime/engine.h"

namespace wren::bench {

/// `bench kernels`: GB/s of weights streamed by each GEMV (one token) at sizes far beyond the
/// caches, against a STREAM-like copy measured in the same run, plus the chunk GEMM.
struct KernelArgs {
  int cols = 8192, chunk = 32, reps = 5;
  double mb = 256;  ///< weight bytes per matrix, MB (rows follow from it)
  bool cpu_time = false;  ///< time with the thread's CPU clock (one thread only; a loaded machine)
  CpuOptions cpu;
};
void run_kernels(const KernelArgs& a);

/// `bench quality`: teacher-forced logits of every --quant mode against the exact f32 run.
/// With `text` set, the positions are the file's tokens (specials disabled) in windows of
/// `window` ([BOS] + window-1 tokens, each from a fresh state, as `wren perplexity`), the first
/// `positions` of them (0 = all), and each mode's perplexity on them is printed too.
struct QualityArgs {
  std::string model;
  int positions = 256, chunk = 32, seed = 1;
  std::string text;  ///< "" = random ids (seed)
  int window = 256;
  bool per_class = false;
  CpuOptions cpu;
};
void run_quality(const QualityArgs& a);

/// `bench model`: prefill and decode tok/s of every --quant mode, the first mode as reference.
struct SpeedArgs {
  std::string model;
  int prompt = 128, gen = 32, chunk = 32;
  bool cpu_time = false;
  std::vector<std::string> modes = {"exact", "bf16", "q8", "default", "q4"};
  CpuOptions cpu;
};
void run_model(const SpeedArgs& a);

/// `bench experts`: the expert store against a sequential read; decode at three cache budgets.
/// Each measurement is repeated `runs` times (cold each time) and reported as min / median, the
/// store / sequential ratio per run (each run's pair of reads).
struct ExpertsArgs {
  std::string model;
  int tokens = 16;
  int runs = 3;
  std::string direct = "auto";
};
void run_experts(const ExpertsArgs& a);

/// `bench stream`: experts at K3's size streamed from disk (issue 17). Writes or reuses a synthetic
/// checkpoint in `dir` (`moe_layers` MoE layers of `experts` experts, 17.55 MB each), measures the
/// raw sequential read of its shards, then prefill and decode at each budget of `budgets`
/// (comma-separated fractions of all expert bytes) with prediction off and on, `runs` runs each
/// (min / median). Throws wren::Error when the logits differ between budgets or modes.
struct StreamArgs {
  std::string dir = "/var/tmp/wren-bench-stream";
  int moe_layers = 2, experts = 64, prompt = 32, tokens = 6, chunk = 32, runs = 3, loaders = 4;
  std::string budgets = "0.1,0.5,1";
  std::string direct = "auto";
  CpuOptions cpu;
  /// "cpu" (budgets = host expert cache) or "cuda" (budgets = VRAM expert slots, with a host
  /// cache of `host_cache` of all expert bytes between them and the disk; exact precision).
  std::string backend = "cpu";
  double host_cache = 0.25;
  std::string predict = "both";  ///< "off", "on" or "both": the prediction modes run per budget
};
void run_stream(const StreamArgs& a);

/// `bench pieces`: how the expert store's read pieces (ExpertStoreOptions::piece_bytes) change the
/// time of one visit of `misses` experts of `expert_mb` MB, on a simulated disk (a file in `dir`
/// read through the store's pread hook, held back to `gbps` GB/s shared by the reads in flight, in
/// 256 KB steps) with a compute of `compute_ms` ms per expert (each value of the comma-separated
/// list): whole-expert reads against the default pieces, `runs` runs each (min / median), side by
/// side with the I/O floor (bytes / gbps). A model of the disk, not a disk: it isolates the order
/// in which experts land from a real disk's noise.
struct PiecesArgs {
  std::string dir = "/var/tmp/wren-bench-pieces";
  double gbps = 0.05, expert_mb = 4;
  std::string compute_ms = "0,20,40";
  int misses = 12, loaders = 4, runs = 5;
};
void run_pieces(const PiecesArgs& a);

/// `bench layers`: per-layer decode time against the memory floor, TTFT and prefill tok/s on a
/// random in-memory model.
struct LayersArgs {
  std::string backend = "auto", preset = "k3";
  int kda = 3, mla = 1, experts = 0, distinct = 64, vocab = 16384, prompt = 1024, decode = 16;  ///< experts 0: the preset's
  std::string quant = "exact";  ///< dense-weight preset (QuantPlan::preset): exact, bf16, q8, q4, ...
  int chunk = 0;  ///< 0 = the backend's default (runtime/engine.h default_chunk)
  uint64_t seed = 1;
  bool json = false;
  CudaOptions cuda;  ///< --gpu-precision, --cuda-kda etc. (the CUDA backend)
  std::string expert_forms;  ///< --expert-forms (parse_expert_forms): the whole token again per form (CUDA fast)
  bool profile = false;  ///< GPU: one more decode token op by op with per-launch device timing, printed per kernel label
};
void run_layers(const LayersArgs& a);

/// `bench routing`: the router of a checkpoint on real text, decoded one token at a time:
/// per-MoE-layer expert load (counts, max/mean, coefficient of variation, normalized entropy,
/// unused experts) and the expert store's hit rate at each budget (comma-separated fractions of
/// all routed experts) on the recorded trace, beside a uniform-routing trace of the same length.
/// `tokens` > 0 keeps the first that many file tokens. Throws wren::Error (missing file, no MXFP4
/// experts, bad --budgets).
struct RoutingArgs {
  std::string model;  ///< "" = the built-in default model
  std::string text;
  int window = 256, tokens = 0;
  std::string budgets = "0.05,0.125,0.25,0.5,0.75,1";
  bool json = false;
  QuantPlan plan;  ///< dense-weight formats (--quant; default exact)
  CpuOptions cpu;
};
void run_routing(const RoutingArgs& a);

/// `bench tokenizer`: encode MB/s of Wren's tokenizer against the tiktoken core, same corpus, same
/// run.
struct TokenizerArgs {
  std::string model;                ///< "" = full o200k_base vocabulary
  std::vector<std::string> corpus;  ///< empty = the three built-in corpora
  double mb = 2;
  int reps = 3;
  bool json = false;
  std::string oracle;               ///< "" = <source tree>/tests/tokenizer/oracle.js
};
void run_tokenizer(const TokenizerArgs& a);

/// `bench prefill`: prefill tok/s of a checkpoint (engine.model_dir) at each of `prompts`
/// (comma-separated lengths 1..4194304), median of `repeat` timed runs after a warm-up; with
/// `also_exact` > 0 on a GPU, one exact-mode prefill of that many tokens on the same weights.
/// `cpu_line` is the CPU options' header text (the CLI's describe). Throws wren::Error.
struct PrefillArgs {
  EngineOptions engine;
  std::string prompts = "512,4096,16384";
  int repeat = 3;
  int also_exact = 0;
  bool profile = false;  ///< GPU: one more prefill per length with per-launch timing, printed
  uint64_t seed = 1;
  bool json = false;
  std::string cpu_line;
};
void run_prefill(PrefillArgs a);

/// `bench batch`: the batched decode step itself (Forward::run_mixed with B one-token entries, as
/// the server's scheduler runs it) at each batch size of `batches` (comma-separated, 1..4096): B
/// sequences each prefilled with `prompt` random ids (solo), 2 untimed steps, then `steps` timed
/// steps, greedy (each step's greedy ids, BatchEntry::greedy, as the scheduler takes them for
/// plain greedy requests; `host_draw`: also rows "Bh" that copy the logits rows and take the host
/// arg-max, the path of sampled requests). Per batch size: ms per step split into the forward
/// call (device work and the logits or ids copy) and the host draw, generated tok/s and its ratio to the
/// first size, and on the GPU the launches, host syncs, graph launches and device-routed expert
/// bytes per generated token. `profile`: one more step per size with per-launch device timing
/// (op by op: a profiled step is never recorded). The engine's forward pass records a single-token
/// step and runs batched steps op by op (ForwardOptions::graph_rows); `eager`: each size also
/// through a pass that records no step (rows "Be"); `record_batched`: also through one that records
/// batched steps too (rows "Br"), side by side. `gemv_forms` (CUDA, a
/// benchmark knob): every size once per form of the fast mode's tensor-core GEMV (comma-separated
/// 0 .. CudaBackend::gemv_forms() - 1, rows "B/fN"; a form's column split changes the order of a
/// row's sum, not the math); empty: the default form alone. `expert_forms` (CUDA, a benchmark
/// knob, parse_expert_forms): every size once per form of the fast mode's decode experts (rows
/// "B/mN", "B/dN"; every form gives the same bits), after the GEMV forms.
struct BatchArgs {
  EngineOptions engine;
  std::string batches = "1,4,16";
  std::string gemv_forms;
  std::string expert_forms;  ///< --expert-forms (parse_expert_forms): rows "B/mN", "B/dN"
  int prompt = 64, steps = 32;
  bool profile = false, eager = false, record_batched = false, host_draw = false;
  uint64_t seed = 1;
  bool json = false;
  std::string cpu_line;
};
void run_batch(BatchArgs a);

/// A form of a CUDA fast-mode decode kernel for bench batch's side-by-side rows: kind 'f' the
/// tensor-core GEMV (CudaBackend::set_decode_streams' form), 'm' the MXFP4 decode experts
/// (set_mx_decode_form), 'd' the dense decode experts (set_dense_decode_form), 'g' the GEMV's
/// input map (set_gemv_map: n = 0 off, 1 on); n the form. The other kernels at their defaults.
struct DecodeForm {
  char kind = 0;  ///< 0: no hook set (the backend's own settings)
  int n = 0;
};

/// Parses --expert-forms: comma-separated items "mN" (an MXFP4 decode-experts form, 0 ..
/// mx_forms - 1), "dN" (a dense decode-experts form, 0 .. dense_forms - 1) or "g0" / "g1" (the
/// GLU and MLA output gate as their own launches / mapped inside the GEMV that reads them,
/// CudaBackend::set_gemv_map), e.g. "m0,m16,d0,d1,g0,g1"; empty gives none. Throws UsageError naming --expert-forms and the item otherwise.
std::vector<DecodeForm> parse_expert_forms(const std::string& s, int mx_forms, int dense_forms);

/// Sets the CUDA fast mode's decode-kernel hooks for form f: its kind's hook to f.n and the other
/// two to their defaults ({} = all three at their defaults; the decode streams launched as
/// programmatic dependents, no lines prefetched). Does nothing on another backend.
void set_decode_form(Backend& be, DecodeForm f);

}  // namespace wren::bench
