// The CUDA backend's options (see cuda_options.h).
#include "backends/cuda/cuda_options.h"

#include "core/error.h"

namespace wren {

const char* cuda_kda_name(CudaKda k) { return k == CudaKda::Chunked ? "chunked" : "recurrent"; }

CudaKda parse_cuda_kda(const std::string& s, const std::string& what) {
  if (s == "recurrent") return CudaKda::Recurrent;
  if (s == "chunked") return CudaKda::Chunked;
  throw Error(what + ": '" + s + "' is not a KDA path (expected recurrent or chunked)");
}

void check_cuda_options(const CudaOptions& o, const std::string& what) {
  check(o.kda_chunk == 16 || o.kda_chunk == 32 || o.kda_chunk == 64,
        what + ": " + std::to_string(o.kda_chunk) + " is not a KDA chunk length (expected 16, 32 or 64)");
}

std::string describe(const CudaOptions& o) {
  std::string s = std::string("cuda precision ") + gpu_precision_name(o.precision) + "; kda " + cuda_kda_name(o.kda);
  if (o.kda == CudaKda::Chunked) s += " (chunk " + std::to_string(o.kda_chunk) + ")";
  if (o.fault_at) s += "; fault injected at launch " + std::to_string(o.fault_at);
  return s;
}

}  // namespace wren
