// libFuzzer target: an HTTP request body through the OpenAI parsers of `wren serve` (chat and text
// completions). Allowed outcomes are a request, a RequestError (the 4xx the server sends), or an
// nlohmann exception (Server::generate answers those with 400 too); anything else is a crash.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return wren::fuzz::openai_request(data, size);
}
