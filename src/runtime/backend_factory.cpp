// Backend selection (see backend_factory.h).
#include "runtime/backend_factory.h"
#include "runtime/vram_tier.h"

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/sizes.h"
#ifdef WREN_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace wren {

bool cuda_built() {
#ifdef WREN_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

bool cuda_usable(std::string* why) {
#ifdef WREN_HAVE_CUDA
  std::string reason;
  if (cuda_device_available(&reason)) return true;
  if (why) *why = "no CUDA device: " + reason;
  return false;
#else
  if (why) *why = "this build has no CUDA backend (configure with -DWREN_CUDA=ON and nvcc installed)";
  return false;
#endif
}

std::string resolve_backend(const std::string& name) {
  if (name == "cpu") return "cpu";
  if (name == "auto") return cuda_usable(nullptr) ? "cuda" : "cpu";
  if (name == "cuda") {
    std::string why;
    if (!cuda_usable(&why)) throw Error("--backend cuda: " + why);
    return "cuda";
  }
  throw Error("--backend: '" + name + "' is not a backend (expected cpu, cuda or auto)");
}

std::unique_ptr<Backend> create_backend(const std::string& name, const CpuOptions& cpu, const std::string& vram_experts,
                                        const CudaOptions& cuda, int device) {
  check_cuda_options(cuda, "--cuda-kda-chunk");
  const std::string kind = resolve_backend(name);
  uint64_t budget = 0;  // default: all that fit with a margin
  if (vram_experts == "all") budget = ~uint64_t(0);
  else if (!vram_experts.empty()) budget = parse_size(vram_experts, "--vram-experts");
#ifdef WREN_HAVE_CUDA
  if (kind == "cuda") {
    auto be = std::make_unique<CudaBackend>(device, cuda);
    be->set_vram_expert_budget(budget == ~uint64_t(0) ? CudaBackend::kAllExperts : budget);
    return be;
  }
#else
  (void)budget;
  (void)cuda;
  (void)device;
#endif
  return std::make_unique<CpuBackend>(cpu);
}

void give_weights(Backend& be, const ModelWeights& weights) { give_weights(be, weight_list(weights)); }

void give_weights(Backend& be, const WeightList& list) {
#ifdef WREN_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaBackend*>(&be)) cuda->upload(list);
#endif
  (void)be, (void)list;
}

std::unique_ptr<Backend> make_backend(const std::string& name, const ModelWeights& weights,
                                      const CpuOptions& cpu, const std::string& vram_experts,
                                      const CudaOptions& cuda) {
  auto be = create_backend(name, cpu, vram_experts, cuda);
  give_weights(*be, weights);
  return be;
}

double gpu_bf16_peak_tflops(Backend& be) {
#ifdef WREN_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaBackend*>(&be)) return cuda->bf16_peak_tflops();
#endif
  (void)be;
  return 0;
}

void set_backend_gpu_precision(Backend& be, GpuPrecision p) {
#ifdef WREN_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaBackend*>(&be)) cuda->set_precision(p);
#endif
  (void)be, (void)p;
}

GpuCounters gpu_counters(Backend& be) {
  GpuCounters c;
#ifdef WREN_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaBackend*>(&be)) {
    const CudaStats s = cuda->stats();
    c.launches = s.launches, c.host_syncs = s.host_syncs, c.graph_launches = s.graph_launches;
    c.graph_kernels = s.graph_kernels, c.expert_visits = s.device_expert_visits, c.expert_bytes = s.device_expert_bytes;
    c.record_host_s = s.record_host_s, c.graph_ahead = s.graph_ahead;
  }
#endif
  (void)be;
  return c;
}

bool gpu_profile_begin(Backend& be) {
#ifdef WREN_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaBackend*>(&be)) {
    cuda->profile_begin();
    return true;
  }
#endif
  (void)be;
  return false;
}

std::vector<GpuOpTime> gpu_profile_end(Backend& be, double* total_ms) {
  std::vector<GpuOpTime> out;
  if (total_ms) *total_ms = 0;
#ifdef WREN_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaBackend*>(&be))
    for (const CudaOpTime& t : cuda->profile_end(total_ms)) out.push_back({t.name, t.ms, t.launches});
#endif
  (void)be;
  return out;
}

bool vram_tier_stats(Backend& be, VramTierStats* out) {
#ifdef WREN_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaBackend*>(&be); cuda && cuda->streams_experts()) {
    const CudaStats s = cuda->stats();
    out->slots = s.expert_slots, out->hits = s.tier_hits, out->misses = s.tier_misses;
    out->demand_bytes = s.tier_bytes, out->prefetch_bytes = s.tier_prefetch_bytes;
    out->prefetch_copied = s.tier_prefetch_issued, out->prefetch_used = s.tier_prefetch_used;
    out->prefetch_wasted = s.tier_prefetch_wasted, out->prefetch_failed = s.tier_prefetch_failed;
    out->not_held = s.tier_guess_not_held;
    out->guess_needed = s.tier_guess_needed, out->guess_hit = s.tier_guess_hit;
    return true;
  }
#endif
  (void)be, (void)out;
  return false;
}

uint64_t device_free_bytes(Backend& be) {
#ifdef WREN_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaBackend*>(&be)) return cuda->free_device_bytes();
#endif
  (void)be;
  return 0;
}

}  // namespace wren
