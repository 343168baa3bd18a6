// One loaded model ready to generate (see engine.h).
#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "core/sizes.h"
#include "runtime/backend_factory.h"
#include "runtime/default_model.h"

namespace wren {

namespace {

std::string gb(double bytes) {
  char buf[32];
  if (bytes >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  else std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  return buf;
}

}  // namespace

void check_sizes(const EngineOptions& o, const Config& c, const std::string& backend) {
  check(o.ctx <= c.max_positions, "--ctx " + std::to_string(o.ctx) + " exceeds the model's " +
                                      std::to_string(c.max_positions) +
                                      " positions (config.json: max_position_embeddings; 1048576 when absent)");
  check(o.layers <= c.n_layers, "--layers " + std::to_string(o.layers) + ": the model has only " +
                                    std::to_string(c.n_layers) + " layers (config.json: num_hidden_layers)");
  // Host memory the first sequence and the activation workspace take (the CPU backend allocates
  // both on the host; a GPU backend reports its own allocation failures).
  if (backend != "cpu") return;
  const double state = double(SequenceState::bytes_for(c, o.ctx));
  const int chunk = o.chunk > 0 ? o.chunk : 32;  // 0 = the backend's default, 32 on the CPU
  const double work = double(Forward::workspace_bytes(c, chunk));
  const double avail = double(available_memory());
  check(avail == 0 || state + work <= avail,
        "--ctx " + std::to_string(o.ctx) + " and --chunk " + std::to_string(chunk) + " need " + gb(state + work) +
            " of memory (" + gb(state) + " sequence state, mostly the MLA cache; " + gb(work) +
            " activation workspace), but only " + gb(avail) + " is available; lower --ctx or --chunk");
}

int default_chunk(const std::string& backend, GpuPrecision precision, const Config& c, uint64_t free_device_bytes) {
  if (backend != "cuda" || precision != GpuPrecision::Fast) return 32;
  // Per token beside the workspace: BF16 activations of the widest GEMM input and the grouped
  // MoE's BF16 GLU rows (top_k x intermediate).
  const size_t extra = 2 * size_t(std::max({c.hidden, c.kda_width(), c.dense_inter, c.moe_inter})) +
                       2 * size_t(c.top_k) * size_t(std::max(c.moe_inter, 1));
  for (int C = 4096; C > 32; C /= 2)
    if (Forward::workspace_bytes(c, C) + size_t(C) * extra <= free_device_bytes / 4) return C;
  return 32;
}

int streaming_chunk(const Config& c, uint64_t free_host_bytes) {
  for (int C = 4096; C > 32; C /= 2)
    if (Forward::workspace_bytes(c, C) <= free_host_bytes / 8) return C;
  return 32;
}

LoadProgress load_progress_line() {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto last = std::make_shared<clock::time_point>(t0 - std::chrono::seconds(1));
  return [t0, last](uint64_t done, uint64_t total) {
    const auto now = clock::now();
    const bool end = done >= total;
    if (!end && now - *last < std::chrono::milliseconds(100)) return;  // at most 10 redraws a second
    *last = now;
    const double s = std::chrono::duration<double>(now - t0).count();
    std::fprintf(stderr, "\rwren: loading weights %3.0f%% (%.2f / %.2f GB, %.2f GB/s)%s", total ? 100.0 * done / total : 100.0,
                 done / 1e9, total / 1e9, s > 0 ? done / 1e9 / s : 0.0, end ? "\n" : "");
    std::fflush(stderr);
  };
}

Engine::Engine(const EngineOptions& o) : ctx_(o.ctx) {
  const std::string backend = resolve_backend(o.backend);  // fail on a bad --backend before loading
  dir_ = o.model_dir.empty() ? default_model_dir() : o.model_dir;
  // The backend first, so that one that places its own weights (CUDA) takes each dense matrix
  // straight from the mapped checkpoint: no host copy of what lives on the device.
  be_ = create_backend(backend, o.cpu, o.vram_experts, o.cuda);
  LoadOptions lo;
  if (be_->places_dense()) lo.place_on = be_.get();
  uint64_t placed_bytes = 0;
  const LoadProgress line = o.progress ? load_progress_line() : LoadProgress{};
  if (line || (lo.place_on && o.announce))
    lo.progress = [&](uint64_t done, uint64_t total) {
      placed_bytes = total;
      if (line) line(done, total);
    };
  const auto t0 = std::chrono::steady_clock::now();
  model_ = load_model(dir_, o.plan, lo);
  if (lo.place_on && o.announce) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "wren: loaded %.2f GB of dense weights straight to the %s backend in %.2f s (%.2f GB/s)\n",
                 placed_bytes / 1e9, be_->name(), s, s > 0 ? placed_bytes / 1e9 / s : 0.0);
  }
  check_sizes(o, model_->config, backend);
  give_weights(*be_, model_->weights);
  // The store serves the CPU backend, and the CUDA backend's VRAM tier when its budget does not
  // hold every expert (disk -> host store -> VRAM slots); with all experts in VRAM it is not needed.
  be_->set_strict(o.strict);
  if (model_->config.expert_format == ExpertFormat::MXFP4 && be_->streams_experts()) {
    store_ = open_expert_store(model_->weights, model_->config, o.expert_cache, o.direct, o.announce);
    be_->set_expert_source(store_.get());
  }
  chunk_ = o.chunk > 0 ? o.chunk : default_chunk(backend, o.cuda.precision, model_->config, device_free_bytes(*be_));
  const Config& mc = model_->config;
  if (o.chunk <= 0 && backend == "cpu" && store_ &&
      uint64_t(store_->slots()) < uint64_t(mc.n_experts) * uint64_t(mc.n_layers - mc.first_dense))
    chunk_ = std::max(chunk_, streaming_chunk(mc, available_memory()));  // one read per expert per prompt
  fwd_ = std::make_unique<Runner>(
      *model_, *be_, ForwardOptions{.max_chunk = chunk_, .layers = o.layers, .check_finite = o.check_finite,
                                   .predict = o.predict != "off"});
  if (backend != "cpu" && o.cpu_fallback) {
    const CpuOptions cpu = o.cpu;
    const QuantPlan plan = o.plan;
    const bool placed = lo.place_on != nullptr;
    fwd_->set_fallback_with_model([this, cpu, plan, placed] {
      Runner::Fallback fb;
      if (placed) {  // the weights live on the failed device: the CPU loads its own copy now
        host_model_ = load_model(dir_, plan);
        fb.model = host_model_.get();
      }
      fb.backend = make_backend("cpu", (placed ? host_model_ : model_)->weights, cpu);
      return fb;
    });
  }
  if (std::filesystem::exists(dir_ + "/tiktoken.model")) {
    tok_ = Tokenizer::load(dir_);
    // A token the model has no embedding row for can be neither prompted nor generated.
    const int V = model_->config.vocab;
    if (tok_->vocab_size() > V) {
      const std::string what = tok_->specials().empty() || tok_->specials().back().id < V
                                   ? dir_ + "/tiktoken.model: " + std::to_string(tok_->n_ranks()) + " BPE ranks"
                                   : dir_ + "/tokenizer_config.json: special token '" + tok_->specials().back().content +
                                         "' has id " + std::to_string(tok_->specials().back().id) + ",";
      throw Error(what + " beyond the model's vocabulary (config.json: vocab_size " + std::to_string(V) + ")");
    }
  }
}

const Tokenizer& Engine::tokenizer() const {
  check(tok_.has_value(), dir_ + ": no tiktoken.model here, so text prompts are not possible (use --ids)");
  return *tok_;
}

}  // namespace wren
