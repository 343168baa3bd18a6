// The CUDA VRAM expert tier's counters as the CLI reports them (`wren run` stats line and --json),
// without the CUDA headers. Implemented in backend_factory.cpp.
#pragma once
#include <cstdint>

#include "ops/backend.h"

namespace wren {

/// Counters of the CUDA VRAM expert tier (docs/streaming.md#cuda) since the backend was made:
/// device slots, hits and misses (experts), bytes copied host -> device on demand and by prefetch,
/// guesses copied / used / evicted unused / whose host read failed / left out because the host
/// store did not hold them (the tier never sends a guess to the disk), and recall (of the distinct
/// experts a MoE call used, the fraction its guess held: guess_hit / guess_needed).
struct VramTierStats {
  uint64_t slots = 0, hits = 0, misses = 0, demand_bytes = 0, prefetch_bytes = 0;
  uint64_t prefetch_copied = 0, prefetch_used = 0, prefetch_wasted = 0, prefetch_failed = 0, not_held = 0;
  uint64_t guess_needed = 0, guess_hit = 0;
  double hit_rate() const { return hits + misses ? double(hits) / double(hits + misses) : 0; }
  double recall() const { return guess_needed ? double(guess_hit) / double(guess_needed) : 0; }
};

/// The tier's counters into *out when `be` is a CUDA backend whose routed experts stream through
/// VRAM slots; false (and *out untouched) otherwise (CPU backend, or every expert resident).
bool vram_tier_stats(Backend& be, VramTierStats* out);

}  // namespace wren
