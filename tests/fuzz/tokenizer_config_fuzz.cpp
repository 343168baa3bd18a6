// libFuzzer target: tokenizer_config.json through load_special_tokens (file read, JSON parse, the
// added_tokens_decoder table) and a Tokenizer built from those specials over a small rank table.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return wren::fuzz::tokenizer_config(data, size);
}
