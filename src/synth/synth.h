// The checkpoint writer: random-weight checkpoints in the published K3 layout (config.json, sharded
// safetensors with model.safetensors.index.json, MXFP4 experts), so tests and benchmarks can cover
// shapes the golden data does not.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace wren {

/// Writer options.
struct SynthOptions {
  uint64_t seed = 1;
  uint64_t shard_bytes = 64'000'000;  ///< a new shard starts once this many bytes are written
  bool prefix = true;                 ///< names start with "language_model." as in the release
  bool shuffle_experts = true;        ///< experts not in id order inside a shard (as in the release)
  bool vision_shard = true;           ///< an extra F16 vision shard the engine must never read
};

/// Validates `config` (as load_config would) and writes DIR/config.json, the shards and the index.
/// Tensor contents depend only on (seed, tensor name), not on sharding. Throws wren::Error.
void write_synthetic_checkpoint(const nlohmann::json& config, const std::string& dir,
                                const SynthOptions& opts);

}  // namespace wren
