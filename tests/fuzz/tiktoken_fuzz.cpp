// libFuzzer target: tiktoken.model text through parse_tiktoken_model, then a Tokenizer over the
// ranks it accepted encoding and decoding a short text.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return wren::fuzz::tiktoken(data, size);
}
