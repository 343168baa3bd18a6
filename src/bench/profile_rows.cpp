#include "bench/profile_rows.h"

#include <algorithm>
#include <cstdio>

namespace wren::bench {

nlohmann::json print_profile_rows(const std::vector<GpuOpTime>& prof, double total_ms, int max_rows) {
  nlohmann::json rows = nlohmann::json::array();
  int shown = 0;
  for (const GpuOpTime& op : prof) {
    if (shown++ < max_rows)
      std::printf("    %-64s %9.3f %6.1f%% %6llu\n", op.name.c_str(), op.ms, 100 * op.ms / std::max(total_ms, 1e-9),
                  (unsigned long long)op.launches);
    rows.push_back({{"name", op.name}, {"ms", op.ms}, {"launches", op.launches}});
  }
  return rows;
}

}  // namespace wren::bench
