// A Hugging Face snapshot folder (see checkpoint.h).
#include "io/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace wren {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr const char* kPrefix = "language_model.";
constexpr const char* kProbe = "model.layers.0.input_layernorm.weight";
}  // namespace

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir), config_(load_config(dir)) {
  index_path_ = dir + "/model.safetensors.index.json";
  if (fs::exists(index_path_)) {
    std::ifstream f(index_path_);
    json idx = json::parse(f, nullptr, false);
    check(!idx.is_discarded() && idx.is_object(), index_path_ + ": not a valid JSON object");
    check(idx.contains("weight_map") && idx["weight_map"].is_object(),
          index_path_ + ": missing object 'weight_map'");
    for (const auto& [name, file] : idx["weight_map"].items()) {
      check(file.is_string(), index_path_ + ": weight_map['" + name + "'] must be a file name");
      const std::string fname = file.get<std::string>();
      check(fname.find('/') == std::string::npos && fname != ".." && !fname.empty(),
            index_path_ + ": weight_map['" + name + "'] = '" + fname + "' is not a plain file name");
      weight_map_[name] = fname;
    }
  } else {
    const std::string single = dir + "/model.safetensors";
    check(fs::exists(single), dir + ": neither model.safetensors.index.json nor model.safetensors found");
    index_path_ = single;
    for (const auto& [name, _] : shard("model.safetensors").tensors()) weight_map_[name] = "model.safetensors";
  }
  // C and REF probe the first layer norm without, then with, the prefix (spec §3.1).
  if (weight_map_.count(kProbe)) prefix_ = "";
  else if (weight_map_.count(std::string(kPrefix) + kProbe)) prefix_ = kPrefix;
  else throw Error(index_path_ + ": missing tensor '" + kProbe + "' (also tried prefix '" + kPrefix + "')");
}

const SafetensorsFile& Checkpoint::shard(const std::string& file) {
  auto it = shards_.find(file);
  if (it != shards_.end()) return *it->second;
  const std::string path = dir_ + "/" + file;
  check(fs::exists(path), index_path_ + " names shard '" + file + "', which does not exist in " + dir_);
  auto [ins, _] = shards_.emplace(file, std::make_unique<SafetensorsFile>(path));
  return *ins->second;
}

TensorRef Checkpoint::find(const std::string& name) {
  for (const std::string& full : {prefix_ + name, name, std::string(kPrefix) + name}) {
    auto it = weight_map_.find(full);
    if (it == weight_map_.end()) continue;
    const SafetensorsFile& f = shard(it->second);
    const TensorInfo* info = f.find(full);
    check(info != nullptr, index_path_ + " says tensor '" + full + "' is in " + it->second +
                               ", but that shard's header has no such tensor");
    return {info, &f};
  }
  return {};
}

void Checkpoint::release_pages() const {
  for (const auto& [_, f] : shards_) f->release_pages();
}

TensorRef Checkpoint::require(const std::string& name, const std::string& alt) {
  TensorRef r = find(name);
  if (!r.info && !alt.empty()) r = find(alt);
  check(r.info != nullptr, index_path_ + ": missing tensor '" + prefix_ + name + "'");
  return r;
}

}  // namespace wren
