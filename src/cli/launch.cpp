// The multi-process pipeline launcher (see launch.h).
#include "cli/launch.h"

#include <signal.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "backends/cuda/nccl_transport.h"
#include "core/error.h"

namespace wren::cli {

bool under_launcher() {
  return (std::getenv("RANK") && std::getenv("WORLD_SIZE")) ||
         (std::getenv("OMPI_COMM_WORLD_RANK") && std::getenv("OMPI_COMM_WORLD_SIZE"));
}

void apply_rank_env(EngineOptions& o, const std::vector<int>& gpus) {
  NcclWorldOptions w;
  if (!nccl_world_from_env(o.nccl_id_file, &w)) return;
  check(gpus.empty() || int(gpus.size()) == w.world, "--gpus lists " + std::to_string(gpus.size()) +
                                                         " GPUs for a world of " + std::to_string(w.world) + " ranks");
  o.rank = w.rank, o.world = w.world;
  o.device = gpus.empty() ? w.device : gpus[size_t(w.rank)];
}

namespace {

/// This process's command line, as given (/proc/self/cmdline).
std::vector<std::string> own_args() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  size_t at = 0;
  while (at < all.size()) {
    const size_t end = all.find('\0', at);
    out.push_back(all.substr(at, end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return out;
}

}  // namespace

int launch_ranks(const std::vector<int>& gpus) {
  const int W = int(gpus.size());
  check(W >= 1, "--gpus: list at least one GPU");
  char tmpl[] = "/tmp/wren-ranks-XXXXXX";
  check(mkdtemp(tmpl) != nullptr, std::string("--gpus: cannot make a temporary folder: ") + std::strerror(errno));
  const std::string dir = tmpl, id_file = dir + "/nccl-id";
  std::vector<std::string> args = own_args();
  check(!args.empty(), "--gpus: cannot read this process's command line (/proc/self/cmdline)");
  args.push_back("--nccl-id-file");
  args.push_back(id_file);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < W; ++r) {
    const pid_t pid = fork();
    check(pid >= 0, std::string("--gpus: fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(W).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink multicast off unless the caller set it
      if (r > 0) {  // only rank 0 reads the terminal and writes the reply
        const int null_fd = open("/dev/null", O_RDWR);
        if (null_fd >= 0) dup2(null_fd, STDIN_FILENO), dup2(null_fd, STDOUT_FILENO);
      }
      execv("/proc/self/exe", argv.data());
      std::fprintf(stderr, "wren: --gpus: cannot start rank %d: %s\n", r, std::strerror(errno));
      _exit(127);
    }
    pids.push_back(pid);
  }
  int rc = 0, alive = W;
  while (alive > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    int r = -1;
    for (int i = 0; i < W; ++i)
      if (pids[size_t(i)] == pid) r = i, pids[size_t(i)] = -1;
    if (r < 0) continue;
    --alive;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    if (code != 0 && rc == 0) {
      rc = code;
      std::fprintf(stderr, "wren: --gpus: rank %d failed (status %d); stopping the other ranks\n", r, code);
      for (pid_t p : pids)
        if (p > 0) kill(p, SIGTERM);  // a rank left waiting on NCCL for the failed one
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return rc;
}

}  // namespace wren::cli
