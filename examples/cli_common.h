// What ditto's programs (ditto-train, ditto-bench, bench_bitwise, bench_ddp, safetensors-info)
// share on their command lines: usage errors end in "PROG: error: MESSAGE" on stderr and exit
// status 2 (argparse's and torchrun's status for a usage error; CLI11's own are 104-114), an
// unknown option gets a did-you-mean from the known ones, and --version prints the project's
// version (cmake/ditto_version.h.in). The programs' own checks of a value stay exit status 1.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/runtime/error.h"
#include "ditto_version.h"

namespace ditto_cli {

/// Exit status of a usage error (an option the parser refuses), as Python's argparse.
inline constexpr int kUsageError = 2;

/// "PROG VERSION", what --version prints.
inline std::string version_line(const char* prog) {
  return std::string(prog) + " " + DITTO_VERSION_STRING;
}

/// The known name `arg` (its text before any '=') was meant to be: the only one it begins
/// (--grad-accum: --grad-accum-steps), else the nearest within max(2, n / 3) edits, n its length
/// without the dashes (--epoch: --epochs); "" when none (or `arg` is itself known).
inline std::string did_you_mean(const std::string& arg, const std::vector<std::string>& known) {
  const std::string a = arg.substr(0, arg.find('='));
  const std::size_t n = a.size() - std::min(a.find_first_not_of('-'), a.size());
  std::string best, prefix_of;
  std::size_t best_d = std::max<std::size_t>(2, n / 3) + 1;
  int prefixes = 0;
  for (const std::string& k : known) {
    if (k == a) return "";
    if (n >= 3 && k.compare(0, a.size(), a) == 0) ++prefixes, prefix_of = k;
    if (const std::size_t d = ditto::detail::edit_distance(a, k); d < best_d) best_d = d, best = k;
  }
  return prefixes == 1 ? prefix_of : best;
}

/// The option names of `app` and its subcommands, as typed: "--epochs", "-d", and the
/// subcommands' names.
inline std::vector<std::string> option_names(const CLI::App& app) {
  std::vector<std::string> out;
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& n : o->get_lnames()) out.push_back("--" + n);
    for (const std::string& n : o->get_snames()) out.push_back("-" + n);
  }
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    out.push_back(sub->get_name());
    for (const std::string& n : option_names(*sub)) out.push_back(n);
  }
  return out;
}

/// The message of a usage error: "PROG: error: MESSAGE", " (did you mean --X?)" after each
/// unknown option of `extras` that is close to a known one, and the --help hint.
inline std::string usage_error(const char* prog, const std::string& message,
                               const std::vector<std::string>& extras,
                               const std::vector<std::string>& known) {
  std::string s = std::string(prog) + ": error: " + message;
  for (const std::string& x : extras) {
    if (x.empty() || x[0] != '-') continue;
    const std::string m = did_you_mean(x, known);
    if (!m.empty()) s += "\n" + std::string(prog) + ": " + x + ": did you mean " + m + "?";
  }
  return s + "\nRun " + prog + " --help for the options.\n";
}

/// What a program returns for a CLI::ParseError `e` of `app.parse`: --help (and --version) print
/// on stdout and return 0; any other prints usage_error on stderr and returns kUsageError.
inline int parse_error(const CLI::App& app, const CLI::ParseError& e, const char* prog) {
  if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
  const std::vector<std::string> extras = app.remaining(true);
  std::string message = e.what();
  if (dynamic_cast<const CLI::ExtrasError*>(&e) && !extras.empty()) {  // argparse's words
    message = "unrecognized arguments:";
    for (const std::string& x : extras) message += " " + x;
  }
  const std::string s = usage_error(prog, message, extras, option_names(app));
  std::fflush(stdout);
  std::fputs(s.c_str(), stderr);
  return kUsageError;
}

/// Adds --version (version_line) to `app`.
inline void add_version(CLI::App& app, const char* prog) {
  app.set_version_flag("--version", version_line(prog), "print the version and exit");
}

/// A check for an option bound to an unsigned integer: CLI11 converts with strtoull, which reads
/// "-1" as 2^64 - 1; this refuses a leading '-' ("--seed: expected an integer >= 0, got -1").
inline CLI::Validator non_negative() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const std::size_t i = s.find_first_not_of(" \t");
        return i != std::string::npos && s[i] == '-' ? "expected an integer >= 0, got " + s : "";
      },
      "", "non_negative");
}

/// An unsigned 64-bit value written in decimal: CLI11's conversion saturates a larger one at
/// 2^64 - 1 without a word (--seed 18446744073709551616 ran as 18446744073709551615).
inline CLI::Validator uint64_decimal() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        std::uint64_t v = 0;
        const char* end = s.data() + s.size();
        const auto [p, ec] = std::from_chars(s.data(), end, v);
        return ec == std::errc() && p == end
                   ? ""
                   : "expected an integer in 0..18446744073709551615, got " + s;
      },
      "", "uint64_decimal");
}

}  // namespace ditto_cli
