// One safetensors file: memory-mapped, header fully validated before any tensor is used.
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
// then the data section; offsets are relative to the data section.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace wren {

/// Where one tensor lives: dtype, shape and its byte range inside the file.
struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  ///< absolute byte offset in the file
  uint64_t nbytes = 0;
};

/// Shape as "[a, b, c]" for error messages.
std::string shape_str(const std::vector<int64_t>& shape);

/// A read-only memory-mapped safetensors file.
class SafetensorsFile {
 public:
  /// Maps `path` and validates its header: 8-byte length inside the file, valid JSON object,
  /// known dtype, integer shape, offsets inside the data section and not overlapping, and
  /// size = product(shape) x dtype size. Throws wren::Error naming the file and tensor.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  /// Pointer to a tensor's bytes inside the mapping.
  const uint8_t* data(const TensorInfo& t) const { return base_ + t.offset; }
  uint64_t size() const { return size_; }
  /// Drops the mapping's resident pages (they fault back in if touched again). Called after the
  /// dense weights were copied out, so RSS counts only what the engine holds.
  void release_pages() const;
  /// Drops the resident pages of the byte range [offset, offset + nbytes) of the file (widened to
  /// whole pages; they fault back in if touched again). The loader calls it after each weight
  /// it streamed to a device, so the mapping never holds the checkpoint at once.
  void release_range(uint64_t offset, uint64_t nbytes) const;

 private:
  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
};

/// Parses and validates a header (exposed for tests and fuzzing). `data_size` is the byte count
/// after the header; `data_start` = 8 + header length. Throws wren::Error naming `source`.
std::map<std::string, TensorInfo> parse_safetensors_header(const std::string& header_json,
                                                           uint64_t data_start,
                                                           uint64_t data_size,
                                                           const std::string& source);

}  // namespace wren
