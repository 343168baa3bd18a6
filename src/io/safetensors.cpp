// One safetensors file: memory-mapped, header fully validated (see safetensors.h).
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loader/json_brief.h"

namespace wren {

using nlohmann::json;

namespace {
constexpr uint64_t kMaxHeader = uint64_t(1) << 30;  // 1 GiB: far above any real header

TensorInfo parse_entry(const std::string& name, const json& v, uint64_t data_start,
                       uint64_t data_size, const std::string& src) {
  const std::string where = src + ": tensor '" + name + "'";
  check(v.is_object(), where + ": expected an object {dtype, shape, data_offsets}");
  TensorInfo t;
  t.name = name;
  check(v.contains("dtype") && v["dtype"].is_string(), where + ": missing string 'dtype'");
  check(parse_dtype(v["dtype"].get<std::string>(), &t.dtype),
        where + ": unknown dtype " + json_brief(v["dtype"]) + " (known: F32 F16 BF16 U8 I8 I32 I64 F64)");
  check(v.contains("shape") && v["shape"].is_array(), where + ": missing list 'shape'");
  uint64_t count = 1;
  for (const auto& d : v["shape"]) {
    check(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
          where + ": shape entries must be non-negative integers, found " + json_brief(v["shape"]));
    const uint64_t x = d.get<uint64_t>();
    check(x == 0 || count <= UINT64_MAX / x / 8, where + ": shape " + json_brief(v["shape"]) + " overflows");
    count *= x;
    t.shape.push_back(int64_t(x));
  }
  static const json kNone;  // both branches lvalues: no (recursive, stack-hungry) copy of the value
  const json& off = v.contains("data_offsets") ? v["data_offsets"] : kNone;
  check(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
        where + ": 'data_offsets' must be two non-negative integers");
  const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
  check(b <= e, where + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) + "] are reversed");
  check(e <= data_size, where + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                            "] run past the end of the data section (" + std::to_string(data_size) +
                            " bytes; file truncated?)");
  const uint64_t want = count * dtype_size(t.dtype);
  check(e - b == want, where + ": " + std::to_string(e - b) + " bytes for shape " + shape_str(t.shape) +
                           " x " + dtype_name(t.dtype) + ", expected " + std::to_string(want));
  t.offset = data_start + b;
  t.nbytes = e - b;
  return t;
}
}  // namespace

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::map<std::string, TensorInfo> parse_safetensors_header(const std::string& header_json,
                                                           uint64_t data_start, uint64_t data_size,
                                                           const std::string& src) {
  json h = json::parse(header_json, nullptr, false);
  check(!h.is_discarded() && h.is_object(), src + ": safetensors header is not a JSON object");
  std::map<std::string, TensorInfo> out;
  for (const auto& [name, v] : h.items()) {
    if (name == "__metadata__") continue;
    out.emplace(name, parse_entry(name, v, data_start, data_size, src));
  }
  // No two tensors may share bytes.
  std::vector<const TensorInfo*> order;
  for (const auto& [_, t] : out) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const TensorInfo &p = *order[i - 1], &q = *order[i];
    check(p.offset + p.nbytes <= q.offset || q.nbytes == 0 || p.nbytes == 0,
          src + ": tensors '" + p.name + "' and '" + q.name + "' overlap in the data section");
  }
  return out;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check(fd >= 0, path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(path + ": cannot stat: " + std::strerror(errno));
  }
  size_ = uint64_t(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    throw Error(path + ": " + std::to_string(size_) + " bytes, too short for a safetensors file (need the 8-byte header length)");
  }
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  check(m != MAP_FAILED, path + ": mmap failed: " + std::strerror(errno));
  base_ = static_cast<const uint8_t*>(m);
  uint64_t n = 0;
  std::memcpy(&n, base_, 8);  // little-endian host assumed (x86-64, arm64)
  if (n > size_ - 8 || n > kMaxHeader) {
    ::munmap(const_cast<uint8_t*>(base_), size_);
    throw Error(path + ": header length " + std::to_string(n) + " exceeds the file size " +
                std::to_string(size_) + " (truncated or not a safetensors file)");
  }
  try {
    tensors_ = parse_safetensors_header(std::string(reinterpret_cast<const char*>(base_ + 8), n),
                                        8 + n, size_ - 8 - n, path);
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(base_), size_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

void SafetensorsFile::release_pages() const {
  if (base_) ::madvise(const_cast<uint8_t*>(base_), size_, MADV_DONTNEED);
}

void SafetensorsFile::release_range(uint64_t offset, uint64_t nbytes) const {
  if (!base_ || nbytes == 0 || offset >= size_) return;
  static const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  const uint64_t lo = offset / page * page, hi = std::min(size_, offset + nbytes);
  ::madvise(const_cast<uint8_t*>(base_) + lo, size_t(hi - lo), MADV_DONTNEED);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace wren
