// `wren`: the one executable; subcommands are registered from cmd_*.cpp.
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"Wren: an inference engine for Kimi K3 hybrid MoE models"};
  app.require_subcommand(1);
  wren::cli::add_run(app);
  wren::cli::add_chat(app);
  wren::cli::add_inspect(app);
  wren::cli::add_synth(app);
  wren::cli::add_bench(app);
  wren::cli::add_tokenize(app);
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
    return app.exit(e);
  } catch (const wren::Error& e) {
    std::fprintf(stderr, "wren: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wren: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
