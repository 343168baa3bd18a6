// A Hugging Face snapshot folder: config.json, model.safetensors.index.json and its shards.
// Shards are opened (mapped and validated) only when a tensor the engine asks for lives there, so
// the vision shards of a K3 snapshot are never read.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "io/safetensors.h"
#include "loader/config.h"

namespace wren {

/// A located tensor: its header entry and the mapped shard that holds it.
struct TensorRef {
  const TensorInfo* info = nullptr;
  const SafetensorsFile* file = nullptr;
  const uint8_t* data() const { return file->data(*info); }
};

/// The published checkpoint layout, read as it is (no conversion step).
class Checkpoint {
 public:
  /// Opens DIR: parses config.json, then model.safetensors.index.json (or a single
  /// model.safetensors). Throws wren::Error naming the file on any problem.
  explicit Checkpoint(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const Config& config() const { return config_; }

  /// Finds `name` (written without prefix, e.g. "model.norm.weight"), trying the
  /// "language_model." prefix too. Returns nullopt-like {} if absent from the index.
  TensorRef find(const std::string& name);
  /// Like find(), but throws "missing tensor" naming the index file and the tensor. A non-empty
  /// `alt` is an accepted alternative name, tried when `name` is absent.
  TensorRef require(const std::string& name, const std::string& alt = "");
  /// Drops the resident pages of every open shard mapping (see SafetensorsFile::release_pages).
  void release_pages() const;
  /// The name prefix the snapshot uses ("language_model." or "").
  const std::string& prefix() const { return prefix_; }

 private:
  const SafetensorsFile& shard(const std::string& file);

  std::string dir_, index_path_, prefix_;
  Config config_;
  std::map<std::string, std::string> weight_map_;  ///< full tensor name -> shard file name
  std::map<std::string, std::unique_ptr<SafetensorsFile>> shards_;
};

}  // namespace wren
