// Every fuzz seed (tests/fuzz/corpus/<target>/) and every input that once crashed a fuzz target
// (tests/fuzz/regressions/<target>/) runs through the same target bodies in the regular suite
// (tests/fuzz/targets.h), so a regression shows without clang or libFuzzer; under the ASan build
// the sanitizers watch them too. A crash here is an escaped exception, a signal or a sanitizer report.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "fuzz/targets.h"

namespace wren {
namespace {

namespace fs = std::filesystem;

const std::map<std::string, std::function<int(const uint8_t*, size_t)>>& targets() {
  static const std::map<std::string, std::function<int(const uint8_t*, size_t)>> t = {
      {"safetensors", fuzz::safetensors}, {"config", fuzz::config},     {"index", fuzz::index},
      {"tokenizer_config", fuzz::tokenizer_config}, {"tiktoken", fuzz::tiktoken},
      {"openai_request", fuzz::openai_request}, {"chat", fuzz::chat}};
  return t;
}

int replay(const std::string& kind) {
  int n = 0;
  for (const auto& [name, fn] : targets()) {
    const fs::path dir = fs::path(WREN_SOURCE_DIR) / "tests/fuzz" / kind / name;
    if (!fs::exists(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (!e.is_regular_file() || e.path().filename().string()[0] == '.') continue;
      SCOPED_TRACE(e.path().string());
      std::ifstream f(e.path(), std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      EXPECT_NO_THROW(fn(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
      ++n;
    }
  }
  return n;
}

TEST(FuzzRegressions, EverySeedInputIsHandled) { EXPECT_GE(replay("corpus"), 7); }

TEST(FuzzRegressions, EveryOnceCrashingInputIsHandled) { replay("regressions"); }

}  // namespace
}  // namespace wren
