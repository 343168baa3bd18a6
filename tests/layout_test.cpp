// The floors of src/ (docs/architecture.md): no #include runs back up a floor or across peers.
// Runs scripts/check_layers.sh on this checkout's src/ (it reads only the repository).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace {

std::string run(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "popen failed";
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  *status = pclose(p);
  return out;
}

TEST(Layout, NoIncludeRunsBackUpAFloor) {
  int status = -1;
  const std::string out = run("bash '" WREN_SOURCE_DIR "/scripts/check_layers.sh' 2>&1", &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("check_layers: ok"), std::string::npos) << out;
}

}  // namespace
