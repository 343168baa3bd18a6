// libFuzzer target: model.safetensors.index.json, opened by Checkpoint next to a valid config.json
// (the seed corpus's golden config, copied in once), then every tensor the table asks for looked up.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return wren::fuzz::index(data, size);
}
