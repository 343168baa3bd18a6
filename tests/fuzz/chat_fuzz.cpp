// libFuzzer target: the K3 chat renderer (an OpenAI chat request rendered to ids, tools included)
// and the reply parser (model output ids split into channels and tool calls); see targets.h.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return wren::fuzz::chat(data, size); }
