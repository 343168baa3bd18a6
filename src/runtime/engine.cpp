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
#include "runtime/rank_pipeline.h"
#include "backends/cuda/nccl_transport.h"

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
  const bool ranked = o.world > 1;
  check(!ranked || backend == "cuda", "a multi-process pipeline (--gpus, RANK/WORLD_SIZE) needs the CUDA backend "
                                      "(NCCL moves the activations between GPUs)");
  const bool piped = ranked || (!o.pipeline.empty() && o.pipeline != "1");
  const bool expert_ranked = !o.expert_parallel.empty() && o.expert_parallel != "1";
  usage_check(!expert_ranked || !ranked, "--expert-parallel with --gpus or a launcher (NCCL ranks): not wired yet; the "
                                        "expert ranks run as CPU threads of one process (docs/parallel.md)");
  usage_check(!expert_ranked || !piped, "--expert-parallel with --pipeline: one split at a time (docs/parallel.md)");
  usage_check(!expert_ranked || backend == "cpu",
              "--expert-parallel: its ranks are CPU threads (--backend cpu); GPU ranks through NCCL are not wired "
              "yet (docs/parallel.md)");
  be_ = create_backend(backend, o.cpu, o.vram_experts, o.cuda,
                       ranked ? o.device : o.gpus.empty() ? 0 : o.gpus[0]);
  LoadOptions lo;
  // Pipeline stages take their own layers' weights from the host model (give_weights below).
  if (be_->places_dense() && !piped) lo.place_on = be_.get();
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
  if (ranked) make_rank(o);
  else if (piped) make_stages(o, backend);
  else give_weights(*be_, model_->weights);
  // The store serves the CPU backend, and the CUDA backend's VRAM tier when its budget does not
  // hold every expert (disk -> host store -> VRAM slots); with all experts in VRAM it is not needed.
  be_->set_strict(o.strict);
  for (auto& sb : stage_be_) sb->set_strict(o.strict);
  if (model_->config.expert_format == ExpertFormat::MXFP4 && be_->streams_experts()) {
    store_ = open_expert_store(model_->weights, model_->config, o.expert_cache, o.direct, o.announce);
    be_->set_expert_source(store_.get());
    for (auto& sb : stage_be_) sb->set_expert_source(store_.get());  // stages run one at a time
  }
  chunk_ = o.chunk > 0 ? o.chunk : default_chunk(backend, o.cuda.precision, model_->config, device_free_bytes(*be_));
  const Config& mc = model_->config;
  if (o.chunk <= 0 && backend == "cpu" && store_ &&
      uint64_t(store_->slots()) < uint64_t(mc.n_experts) * uint64_t(mc.n_layers - mc.first_dense))
    chunk_ = std::max(chunk_, streaming_chunk(mc, available_memory()));  // one read per expert per prompt
  ForwardOptions fo{.max_chunk = chunk_, .layers = o.layers, .check_finite = o.check_finite,
                    .predict = o.predict != "off"};
  if (expert_ranked) {  // ranks 1.. as threads, each its own CPU backend over the mapped experts
    const ExpertShard shard = parse_expert_shard(o.expert_parallel, mc.n_experts);
    std::vector<std::unique_ptr<Backend>> workers;
    for (int r = 1; r < shard.ranks(); ++r) workers.push_back(create_backend(backend, o.cpu));
    expert_ranks_ = std::make_unique<ExpertRanks>(*model_, *be_, std::move(workers), shard);
    fo.experts = expert_ranks_->link();
  }
  fo_ = fo;
  fwd_ = std::make_unique<Runner>(*model_, *be_, fo);
  if (ranked && rank_ == 0) {
    auto pipe = std::make_unique<RankPipeline>(*model_, *be_, *transport_, *plan_, fo);
    const RankPipeline* p = pipe.get();
    fwd_->set_pipeline(std::move(pipe), [p](int cap) { return p->new_sequence(cap); });
  } else if (plan_ && !ranked) {
    std::vector<Backend*> bs{be_.get()};
    for (auto& sb : stage_be_) bs.push_back(sb.get());
    auto pipe = std::make_unique<PipelineForward>(*model_, bs, *plan_, fo);
    const PipelineForward* p = pipe.get();
    fwd_->set_pipeline(std::move(pipe), [p](int cap) { return p->new_sequence(cap); });
  }
  if (backend != "cpu" && o.cpu_fallback && !ranked) {  // ranks cannot leave their pipeline
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

void Engine::make_stages(const EngineOptions& o, const std::string& backend) {
  const Config& c = model_->config;
  const int run = o.layers < 0 ? c.n_layers : o.layers;
  std::vector<uint64_t> bytes = layer_bytes(c);
  bytes.resize(size_t(run));
  plan_ = parse_pipeline(o.pipeline, run, parse_stage_split(o.pipeline_split), bytes);
  const int S = plan_->stages();
  for (int s = 1; s < S; ++s)
    stage_be_.push_back(
        create_backend(backend, o.cpu, o.vram_experts, o.cuda, o.gpus.empty() ? 0 : o.gpus[size_t(s) % o.gpus.size()]));
  for (int s = 0; s < S; ++s) {
    Backend& be = s == 0 ? *be_ : *stage_be_[size_t(s) - 1];
    give_weights(be, weight_list(model_->weights, plan_->first(s), plan_->end(s), s == 0, s + 1 == S));
  }
}

void Engine::make_rank(const EngineOptions& o) {
  const Config& c = model_->config;
  const int run = o.layers < 0 ? c.n_layers : o.layers;
  std::vector<uint64_t> bytes = layer_bytes(c);
  bytes.resize(size_t(run));
  const std::string spec = o.pipeline.empty() || o.pipeline == "1" ? std::to_string(o.world) : o.pipeline;
  plan_ = parse_pipeline(spec, run, parse_stage_split(o.pipeline_split), bytes);
  check(plan_->stages() == o.world, "--pipeline " + spec + " makes " + std::to_string(plan_->stages()) +
                                        " stages for " + std::to_string(o.world) + " ranks (one stage per rank)");
  rank_ = o.rank, world_ = o.world;
  const int S = plan_->stages();
  give_weights(*be_, weight_list(model_->weights, plan_->first(rank_), plan_->end(rank_), rank_ == 0, rank_ + 1 == S));
  NcclWorldOptions w;
  w.rank = o.rank, w.world = o.world, w.device = o.device, w.id_file = o.nccl_id_file;
  transport_ = std::make_unique<NcclTransport>(w);
}

void Engine::run_worker() {
  check(rank_ > 0 && transport_, "run_worker: this process is not a worker rank of a pipeline");
  rank_worker_loop(*model_, *be_, *transport_, *plan_, ctx_, fo_);
}

std::string Engine::stages_line() const {
  if (expert_ranks_) return expert_ranks_->describe();
  if (!plan_) return "";
  const std::vector<uint64_t> bytes = layer_bytes(model_->config);
  if (transport_)
    return "pipeline " + plan_->describe(&bytes) + " (NCCL transport, rank " + std::to_string(rank_) + " of " +
           std::to_string(world_) + ")";
  return "pipeline " + plan_->describe(&bytes) + " (in-process transport, " + be_->name() + " stages)";
}

const Tokenizer& Engine::tokenizer() const {
  check(tok_.has_value(), dir_ + ": no tiktoken.model here, so text prompts are not possible (use --ids)");
  return *tok_;
}

}  // namespace wren
