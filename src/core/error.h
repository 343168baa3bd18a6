// Wren's one error type: a message that names the file, tensor or field and what was expected.
#pragma once
#include <stdexcept>
#include <string>

namespace wren {

/// Thrown for bad input (model files, config, flags, requests) and broken invariants.
/// The message is complete and user-facing; front ends print it and exit non-zero.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

/// Thrown by a backend when its device fails (a CUDA call, launch or allocation), as opposed to
/// bad input: the one kind of error the forward pass may answer by continuing on the CPU.
class DeviceError : public Error {
 public:
  explicit DeviceError(const std::string& msg) : Error(msg) {}
};

/// Thrown for a bad command-line value that CLI11 could not check while parsing (a size such as
/// `--expert-cache abc`, a `--quant` preset): a usage error, which the front end answers with exit 2
/// like CLI11's own parse errors.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& msg) : Error(msg) {}
};

/// Throws UsageError(msg) when `cond` is false: for command-line values (exit 2).
inline void usage_check(bool cond, const std::string& msg) {
  if (!cond) throw UsageError(msg);
}

/// Throws Error(msg) when `cond` is false.
inline void check(bool cond, const std::string& msg) {
  if (!cond) throw Error(msg);
}

}  // namespace wren
