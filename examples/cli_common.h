// What ditto's programs (ditto-train, ditto-bench, bench_bitwise, bench_ddp, safetensors-info)
// share on their command lines: usage errors end in "PROG: error: MESSAGE" on stderr and exit
// status 2 (argparse's and torchrun's status for a usage error; CLI11's own are 104-114), an
// unknown option gets a did-you-mean from the known ones, and --version prints the project's
// version (cmake/ditto_version.h.in). ditto-train's own checks of its options ("--FLAG: expected
// ..., got ...") exit 2 too; the other programs' own checks of a value stay exit status 1.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/base/error.h"
#include "core/train/options.h"
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

/// A program's own hint for an unknown option as typed ("" for none): ditto-train's
/// train::nanogpt_option_hint for nanoGPT's setting names.
using OptionHint = std::function<std::string(const std::string&)>;

/// The message of a usage error: "PROG: error: MESSAGE", a line "PROG: X: HINT" for each unknown
/// option X of `extras` that `hint` knows, else "PROG: X: did you mean --Y?" when X is close to a
/// known option Y, and the --help hint.
inline std::string usage_error(const char* prog, const std::string& message,
                               const std::vector<std::string>& extras,
                               const std::vector<std::string>& known, const OptionHint& hint = {}) {
  std::string s = std::string(prog) + ": error: " + message;
  for (const std::string& x : extras) {
    if (x.empty() || x[0] != '-') continue;
    std::string h = hint ? hint(x) : std::string();
    if (const std::string m = h.empty() ? did_you_mean(x, known) : ""; !m.empty())
      h = "did you mean " + m + "?";
    if (!h.empty()) s += "\n" + std::string(prog) + ": " + x + ": " + h;
  }
  return s + "\nRun " + prog + " --help for the options.\n";
}

/// What a flag's (a bool option's) value may be: CLI11's words for true and false.
inline const std::string kFlagValues =
    "true or false (also 1 / 0, yes / no, on / off; the flag alone is true)";

/// What option `name`'s value must be: its `expected` text (its type and range, e.g. "an integer
/// in 1..65536"), else one from its type ("an integer", "a number", kFlagValues for a flag); ""
/// for a name that is not an option of `app`.
inline std::string expected_value(const CLI::App& app, const std::string& name,
                                  const std::map<std::string, std::string>& expected) {
  if (auto it = expected.find(name); it != expected.end()) return it->second;
  const CLI::Option* opt = nullptr;
  try {
    opt = app.get_option(name);
  } catch (const CLI::Error&) {
    return "";
  }
  const std::string type = opt->get_type_name();
  return type == "INT"     ? "an integer"
         : type == "UINT"  ? "an integer >= 0"
         : type == "FLOAT" ? "a number"
         : type == "TEXT"  ? "a value"
         : type.empty()    ? kFlagValues  // a flag (bool): CLI11 names no type
                           : "a value of type " + type;
}

/// For CLI11's "Could not convert: --devices = abc": "--devices: expected E, got 'abc'", E the
/// option's expected_value; other messages as they are.
inline std::string conversion_message(const CLI::App& app, const std::string& what,
                                      const std::map<std::string, std::string>& expected) {
  const std::string head = "Could not convert: ";
  const std::size_t eq = what.find(" = ");
  if (what.compare(0, head.size(), head) != 0 || eq == std::string::npos) return what;
  const std::string name = what.substr(head.size(), eq - head.size());
  const std::string e = expected_value(app, name, expected);
  return e.empty() ? what : name + ": expected " + e + ", got '" + what.substr(eq + 3) + "'";
}

/// For CLI11's "--epochs: 1 required INT missing" (--epochs last, or --epochs=): "--epochs:
/// expected E, got no value", E the option's expected_value; other messages as they are.
inline std::string missing_value_message(const CLI::App& app, const std::string& what,
                                         const std::map<std::string, std::string>& expected) {
  const std::size_t colon = what.find(": ");
  if (colon == std::string::npos || what.find(" required ", colon) == std::string::npos ||
      what.size() < 8 || what.compare(what.size() - 8, 8, " missing") != 0)
    return what;
  const std::string name = what.substr(0, colon);
  const std::string e = expected_value(app, name, expected);
  return e.empty() ? what : name + ": expected " + e + ", got no value";
}

/// What a program returns for a CLI::ParseError `e` of `app.parse`: --help (and --version) print
/// on stdout and return 0; any other prints usage_error on stderr and returns kUsageError.
/// `expected`: option name -> what its value must be (conversion_message); `hint`: usage_error's.
inline int parse_error(const CLI::App& app, const CLI::ParseError& e, const char* prog,
                       const std::map<std::string, std::string>& expected = {},
                       const OptionHint& hint = {}) {
  if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
  const std::vector<std::string> extras = app.remaining(true);
  std::string message = e.what();
  if (dynamic_cast<const CLI::ConversionError*>(&e))
    message = conversion_message(app, message, expected);
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e))
    message = missing_value_message(app, message, expected);
  if (dynamic_cast<const CLI::ExtrasError*>(&e) && !extras.empty()) {  // argparse's words
    message = "unrecognized arguments:";
    for (const std::string& x : extras) message += " " + x;
  }
  const std::string s = usage_error(prog, message, extras, option_names(app), hint);
  std::fflush(stdout);
  std::fputs(s.c_str(), stderr);
  return kUsageError;
}

/// A flag given an empty value (--bias=): CLI11 reads it as true, and hands a flag's value to no
/// check, so it is looked for in argv before parsing (as numeric_value refuses an empty number).
/// The error message for the first one ("--bias: expected true or false ..., got ''"), or "".
inline std::string empty_flag_value(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (a.size() < 4 || a.compare(0, 2, "--") != 0 || a.back() != '=') continue;
    const std::string name = a.substr(0, a.size() - 1);
    const CLI::Option* o = nullptr;
    try {
      o = app.get_option(name);
    } catch (const CLI::Error&) {  // not an option: the parser says so
      continue;
    }
    if (o->get_type_name().empty()) return name + ": expected " + kFlagValues + ", got ''";
  }
  return "";
}

/// app.parse(argc, argv), a flag given an empty value refused first (empty_flag_value); on a
/// CLI::ParseError, what parse_error returns (0 after --help or --version, else kUsageError) for
/// main to return; nullopt when the command line parsed.
inline std::optional<int> parse(CLI::App& app, int argc, char** argv, const char* prog,
                                const std::map<std::string, std::string>& expected = {}) {
  if (const std::string m = empty_flag_value(app, argc, argv); !m.empty()) {
    std::fflush(stdout);
    std::fputs(usage_error(prog, m, {}, option_names(app)).c_str(), stderr);
    return kUsageError;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return parse_error(app, e, prog, expected);
  }
  return std::nullopt;
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

/// What numeric_value reads: a floating-point number, a signed integer (CLI11's "INT": int and
/// std::int64_t options) or an unsigned one ("UINT").
enum class NumberKind { floating, signed_integer, unsigned_integer };

/// A numeric option's value as Python's int() / float() read it, before CLI11 converts it: an
/// empty value is refused ("expected E, got ''"; CLI11 read it as 0, so --epochs '' trained no
/// epoch), and for an integer leading zeros are decimal (int('010') == 10; CLI11 read a leading
/// 0 as octal, so --epochs 010 ran 8 epochs): they are dropped, a 0x prefix stays hex. A signed
/// integer outside std::int64_t's range is refused as typed ("expected E, got
/// '99999999999999999999': past the largest 64-bit integer, 9223372036854775807"): CLI11 converts
/// with strtoll, which saturates it, so --batch-size 99999999999999999999 ran as
/// 9223372036854775807 (an int option refused it in CLI11's own check that the value fits; the
/// unsigned ones: uint64_value). `expected`: what the value must be ("an integer >= 0").
inline CLI::Validator numeric_value(const std::string& expected, NumberKind kind) {
  return CLI::Validator(
      [expected, kind](std::string& s) -> std::string {
        if (s.find_first_not_of(" \t") == std::string::npos)
          return "expected " + expected + ", got '" + s + "'";
        if (kind == NumberKind::floating) return "";
        const std::string typed = s;
        std::size_t i = s.find_first_not_of(" \t");
        if (s[i] == '-' || s[i] == '+') ++i;
        std::size_t j = i;
        while (j + 1 < s.size() && s[j] == '0' &&
               std::isdigit(static_cast<unsigned char>(s[j + 1])))
          ++j;
        s.erase(i, j - i);  // "010" -> "10", "-007" -> "-7", "0x10" and "0" as they are
        if (kind != NumberKind::signed_integer) return "";
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(s.c_str(), &end, 0);  // CLI11's (0x: hex)
        if (errno != ERANGE) return "";  // in range, or no number: the conversion's error
        return "expected " + expected + ", got '" + typed + "': " +
               (v < 0 ? "below the smallest 64-bit integer, " +
                            std::to_string(std::numeric_limits<std::int64_t>::min())
                      : "past the largest 64-bit integer, " +
                            std::to_string(std::numeric_limits<std::int64_t>::max()));
      },
      "", "numeric_value");
}

/// Adds numeric_value to each integer or floating-point option of `app` (its first check, before
/// its own and CLI11's conversion); `expected`: option name -> what its value must be (else "an
/// integer" / "a number").
inline void check_numeric_values(CLI::App& app,
                                 const std::map<std::string, std::string>& expected) {
  for (CLI::Option* o : app.get_options()) {
    const std::string type = o->get_type_name();
    const NumberKind kind = type.rfind("INT", 0) == 0    ? NumberKind::signed_integer
                            : type.rfind("UINT", 0) == 0 ? NumberKind::unsigned_integer
                                                         : NumberKind::floating;
    if (kind == NumberKind::floating && type.rfind("FLOAT", 0) != 0) continue;
    const auto it = expected.find(o->get_name());
    o->transform(numeric_value(it != expected.end()           ? it->second
                               : kind == NumberKind::floating ? "a number"
                                                              : "an integer",
                               kind));
  }
}

/// An unsigned 64-bit value (decimal, or hex with 0x; leading zeros decimal, numeric_value),
/// refused past 2^64 - 1: CLI11's conversion saturates a larger one without a word
/// (--seed 18446744073709551616 ran as 18446744073709551615).
inline CLI::Validator uint64_value() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const std::size_t i = s.find_first_not_of(" \t");
        const bool digit = i != std::string::npos && std::isdigit(static_cast<unsigned char>(s[i]));
        errno = 0;
        char* end = nullptr;
        const bool hex = digit && (s.compare(i, 2, "0x") == 0 || s.compare(i, 2, "0X") == 0);
        if (digit) std::strtoull(s.c_str(), &end, hex ? 16 : 10);
        return digit && errno == 0 && end && *end == '\0'
                   ? ""
                   : "expected an integer in 0..18446744073709551615 (or 0x0..0xffffffffffffffff), "
                     "got " +
                         s;
      },
      "", "uint64_value");
}

/// A check that a number is at least `min` (and finite): "expected E, got V" (E `expected`, the
/// row's text); a value that is not a number is left to the conversion's own error.
inline CLI::Validator at_least(double min, const std::string& expected) {
  return CLI::Validator(
      [min, expected](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (end == s.c_str() || *end != '\0') return "";
        return std::isfinite(v) && v >= min ? "" : "expected " + expected + ", got " + s;
      },
      "", "at_least");
}

/// A check that a text value is not empty (an empty path would silently mean "not given"):
/// "expected E, got an empty string".
inline CLI::Validator non_empty(const std::string& expected) {
  return CLI::Validator(
      [expected](std::string& s) -> std::string {
        return s.empty() ? "expected " + expected + ", got an empty string" : "";
      },
      "", "non_empty");
}

/// Binds the option rows of a component (core/train/options.h) to `app`, in their order: an
/// option (a flag for a bool) writing the row's target, --help's default (show_default), value
/// name and group, the repeatable ones collecting every value, an unsigned one refusing -1 and
/// values past 2^64 - 1, a row's `min` and a text row's non-empty value checked; `expected` gets
/// each row's expected text (for parse_error's conversion messages).
inline void bind_options(CLI::App& app, const ditto::train::OptionTable& rows,
                         std::map<std::string, std::string>& expected) {
  for (const ditto::train::OptionRow& r : rows) {
    bool text = false, flag = false, unsigned_ = false;
    CLI::Option* o = std::visit(
        [&](auto* v) -> CLI::Option* {
          using T = std::remove_pointer_t<decltype(v)>;
          text = std::is_same_v<T, std::string>;
          unsigned_ = std::is_same_v<T, std::uint64_t>;
          if constexpr (std::is_same_v<T, bool>) {
            flag = true;
            return app.add_flag(r.flag, *v, r.help);
          } else {
            return app.add_option(r.flag, *v, r.help);
          }
        },
        r.target);
    if (!r.expected.empty()) expected[r.flag] = r.expected;
    if (r.show_default && !flag) o->capture_default_str();
    if (r.arity > 1) o->expected(r.arity);
    if (!r.type_name.empty()) o->type_name(r.type_name);
    if (r.repeatable) o->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    if (!r.group.empty()) o->group(r.group);
    if (unsigned_) o->check(non_negative())->check(uint64_value());
    if (r.min) o->check(at_least(*r.min, r.expected));
    if (text && !r.expected.empty()) o->check(non_empty(r.expected));
  }
}

}  // namespace ditto_cli
