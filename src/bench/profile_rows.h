// The rows of a per-launch device profile (runtime/backend_factory.h gpu_profile_end), printed and
// kept for --json: shared by `bench batch --profile` and `bench layers --profile`.
#pragma once
#include <nlohmann/json.hpp>
#include <vector>

#include "runtime/backend_factory.h"

namespace wren::bench {

/// Prints the first `max_rows` of `prof` (label, device ms, share of `total_ms`, launches), one
/// indented line each, and returns all of them as a JSON array of {name, ms, launches}.
nlohmann::json print_profile_rows(const std::vector<GpuOpTime>& prof, double total_ms, int max_rows);

}  // namespace wren::bench
