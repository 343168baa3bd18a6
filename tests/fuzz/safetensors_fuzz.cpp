// libFuzzer target: a whole safetensors file (8-byte length, JSON header, data section), opened
// through SafetensorsFile exactly as a shard is; also the header text alone through
// parse_safetensors_header with a data-section size taken from the first input bytes.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return wren::fuzz::safetensors(data, size);
}
