// Plain-worded option checks and the unknown-command message (see commands.h).
#include <cstdlib>

#include "cli/commands.h"

namespace wren::cli {

namespace {

CLI::Validator number_at_least(double lo, bool strict, const char* name) {
  return CLI::Validator(
      [lo, strict](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || end == nullptr || *end != '\0') return "'" + s + "' is not a number";
        if (strict ? v > lo : v >= lo) return "";
        return std::string("must be ") + (strict ? "greater than " : "at least ") + (lo == 0 ? "0" : std::to_string(lo)) +
               " (got " + s + ")";
      },
      name);
}

}  // namespace

CLI::Validator positive() { return number_at_least(0, true, "POSITIVE"); }
CLI::Validator non_negative() { return number_at_least(0, false, "NONNEGATIVE"); }

std::string unknown_command(CLI::App& app, int argc, char** argv) {
  CLI::App* level = &app;
  std::string path = "wren";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.empty() || arg[0] == '-') return "";
    const auto subs = level->get_subcommands([](CLI::App*) { return true; });
    if (subs.empty()) return "";
    CLI::App* next = nullptr;
    std::string names;
    for (CLI::App* s : subs) {
      if (s->get_name() == arg) next = s;
      names += (names.empty() ? "" : ", ") + s->get_name();
    }
    if (!next) return "unknown command '" + path + " " + arg + "' (commands: " + names + "; see " + path + " --help)";
    level = next;
    path += " " + arg;
  }
  return "";
}

}  // namespace wren::cli
