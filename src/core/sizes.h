// Byte sizes as users write them ("8G", "512M") and the process's memory figures.
#pragma once
#include <cstdint>
#include <string>

namespace wren {

/// Parses "8G", "512M", "300K", "1.5G", "2GiB" or a plain byte count (decimal K/M/G/T, binary
/// KiB/MiB/GiB); throws wren::Error naming `what` on bad input.
uint64_t parse_size(const std::string& s, const std::string& what);

/// Peak resident set size of this process in bytes (getrusage).
uint64_t peak_rss_bytes();

/// MemAvailable from /proc/meminfo in bytes (0 if unknown).
uint64_t available_memory();

}  // namespace wren
