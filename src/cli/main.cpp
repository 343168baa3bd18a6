// `wren`: the one executable; subcommands are registered from cmd_*.cpp.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/error.h"

namespace {

/// CLI11's help with the `{false}` it prints after negated flag names (`--no-think{false}`)
/// removed; option defaults are shown as `TYPE=DEFAULT` (always_capture_default below).
class Formatter : public CLI::Formatter {
 public:
  std::string make_option_name(const CLI::Option* opt, bool positional) const override {
    const std::string s = CLI::Formatter::make_option_name(opt, positional);
    std::string out;
    int depth = 0;
    for (char c : s) {
      if (c == '{') ++depth;
      else if (c == '}') depth = depth > 0 ? depth - 1 : 0;
      else if (depth == 0) out += c;
    }
    return out;
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Wren: an inference engine for Kimi K3 hybrid MoE models"};
  app.formatter(std::make_shared<Formatter>());  // subcommands inherit both settings
  app.option_defaults()->always_capture_default();
  app.require_subcommand(1);
#ifdef WREN_HAVE_CUDA
  app.set_version_flag("--version", "wren 0.1.0 (CPU and CUDA backends)");
#else
  app.set_version_flag("--version", "wren 0.1.0 (CPU backend; built without CUDA)");
#endif
  wren::cli::add_run(app);
  wren::cli::add_chat(app);
  wren::cli::add_inspect(app);
  wren::cli::add_synth(app);
  wren::cli::add_bench(app);
  wren::cli::add_tokenize(app);
  wren::cli::add_detokenize(app);
  wren::cli::add_serve(app);
  wren::cli::add_validate(app);
  wren::cli::add_perplexity(app);
  try {
    if (const std::string bad = wren::cli::unknown_command(app, argc, argv); !bad.empty()) {
      std::fprintf(stderr, "wren: error: %s\n", bad.c_str());
      return 2;
    }
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help / --version are "errors" of CLI11 with exit code 0: let it print them. Every other parse
    // error is a usage error: one `wren: error:` line like the rest of Wren's errors, exit 2.
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "wren: error: %s\nRun with --help for more information.\n", e.what());
    return 2;
  } catch (const wren::UsageError& e) {  // a flag's value that only Wren could check: a usage error too
    std::fprintf(stderr, "wren: error: %s\nRun with --help for more information.\n", e.what());
    return 2;
  } catch (const wren::Error& e) {
    std::fprintf(stderr, "wren: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wren: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
