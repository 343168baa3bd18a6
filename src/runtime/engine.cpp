// One loaded model ready to generate (see engine.h).
#include "runtime/engine.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "runtime/backend_factory.h"
#include "runtime/default_model.h"

namespace wren {

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

Engine::Engine(const EngineOptions& o) : ctx_(o.ctx) {
  const std::string backend = resolve_backend(o.backend);  // fail on a bad --backend before loading
  dir_ = o.model_dir.empty() ? ensure_default_model(default_vocab_file()) : o.model_dir;
  model_ = load_model(dir_, o.plan);
  be_ = make_backend(backend, model_->weights, o.cpu, o.vram_experts, o.cuda);
  // The store serves the CPU backend, and the CUDA backend's VRAM tier when its budget does not
  // hold every expert (disk -> host store -> VRAM slots); with all experts in VRAM it is not needed.
  be_->set_strict(o.strict);
  if (model_->config.expert_format == ExpertFormat::MXFP4 && be_->streams_experts()) {
    store_ = open_expert_store(model_->weights, model_->config, o.expert_cache, o.direct, o.announce);
    be_->set_expert_source(store_.get());
  }
  chunk_ = o.chunk > 0 ? o.chunk : default_chunk(backend, o.cuda.precision, model_->config, device_free_bytes(*be_));
  fwd_ = std::make_unique<Runner>(*model_, *be_, ForwardOptions{chunk_, o.layers});
  if (backend != "cpu" && o.cpu_fallback) {
    const CpuOptions cpu = o.cpu;
    fwd_->set_fallback([this, cpu] { return make_backend("cpu", model_->weights, cpu); });
  }
  if (std::filesystem::exists(dir_ + "/tiktoken.model")) tok_ = Tokenizer::load(dir_);
}

const Tokenizer& Engine::tokenizer() const {
  check(tok_.has_value(), dir_ + ": no tiktoken.model here, so text prompts are not possible (use --ids)");
  return *tok_;
}

}  // namespace wren
