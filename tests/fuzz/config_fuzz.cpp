// libFuzzer target: config.json through parse_config (as load_config parses it), then every size
// derived from an accepted config: the tensor table's shapes, the state and workspace sizes, the
// expert bytes (signed overflow there is undefined behaviour UBSan reports).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return wren::fuzz::config(data, size);
}
