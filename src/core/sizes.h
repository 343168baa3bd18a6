// Byte sizes and count lists as users write them ("8G", "512M", "1,4,16") and the process's memory figures.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace wren {

/// Parses "8G", "512M", "300K", "1.5G", "2GiB" or a plain byte count (decimal K/M/G/T, binary
/// KiB/MiB/GiB); throws wren::Error naming `what` on bad input.
uint64_t parse_size(const std::string& s, const std::string& what);

/// Parses a comma-separated list of integers in [lo, hi] (e.g. --clients 1,4,16); throws
/// UsageError naming `flag` and `noun` for an item that is not such an integer or an empty list.
std::vector<int> parse_count_list(const std::string& s, const std::string& flag, int lo, int hi,
                                  const std::string& noun);

/// Peak resident set size of this process in bytes (getrusage).
uint64_t peak_rss_bytes();

/// MemAvailable from /proc/meminfo in bytes (0 if unknown).
uint64_t available_memory();

}  // namespace wren
