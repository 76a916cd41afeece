// Command-line options as data: each component states its options once, one OptionRow each,
// beside its settings (as torchrun's and nanoGPT's configurators keep each part's settings next
// to it): the Trainer's (trainer_options: TrainerConfig), the MLP's CSV rows' (csv_rows_options)
// and the GPT's (gpt_options: GptSettings); the simulator's are sim::sim_options
// (backend_sim/sim_options.h). A row is plain data: the flag, the field it sets (its name, as
// errors name it: TrainerConfig::field_names comes from the rows), a pointer to the value, the
// --help text, what a value must be, its --help group, and whether the ranks of an mpirun job
// compare it. A program binds the rows to its parser (ditto-train: examples/cli_common.h's
// bind_options, CLI11), so the library holds no parser:
//
//   ditto::train::TrainerOptions t;
//   ditto::train::OptionTable rows = ditto::train::trainer_options(t);
//   t.config.field_names = ditto::train::field_names(rows);  // "batch_size" -> "--batch-size"
//   // ... the parser writes the values given, then:
//   t.apply(given);  // the text fields (--determinism, --dtype, --hidden, ...) into t.config
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/data/data_source.h"
#include "core/train/gpt_recipe.h"
#include "core/train/launcher.h"
#include "core/train/trainer_config.h"

namespace ditto::train {

/// The value an option writes (a flag: bool; a repeatable option: the list of its values).
using OptionTarget = std::variant<bool*, int*, std::int64_t*, std::uint64_t*, float*, double*,
                                  std::string*, std::vector<std::string>*>;

/// Whether the ranks of an mpirun job compare an option (option_settings): yes; no (an output
/// only rank 0 writes, e.g. --metrics-jsonl); last (compared after the others: --lr, whose
/// default follows --optimizer and --model, which then differ first).
enum class Agree : std::uint8_t { yes, no, last };

/// One option of a command line.
struct OptionRow {
  std::string flag;     ///< "--batch-size"
  std::string field;    ///< the field it sets ("batch_size"; field_names)
  OptionTarget target;  ///< where the parser writes the value (its default: the value there)
  std::string help;     ///< --help's text
  /// What a value must be ("an integer in 1..65536"), for the parser's errors ("--devices:
  /// expected an integer in 1..65536, got 'abc'"); for a text option, what it names (an empty
  /// value is then refused: "--trace: expected a file name, got an empty string"). "": from the
  /// type ("an integer", "a number").
  std::string expected;
  std::string group;         ///< --help group; "": the general options
  bool show_default = true;  ///< --help shows the default (TYPE=DEFAULT)
  bool repeatable = false;   ///< each use adds a value (--straggler); otherwise the last wins
  int arity = 1;             ///< values per use (--export FORMAT FILE: 2); a bool flag: 0
  std::string type_name;     ///< --help's name of the value ("FILE"); "": from the type
  Agree agree = Agree::yes;
  /// A value below it (or not finite) is refused by the parser: "FLAG: expected EXPECTED, got V".
  std::optional<double> min;
  /// The model whose option it is ("mlp", "gpt"): a program refuses it with another; "": any.
  std::string model;

  // Setters for a table's rows: option("--lr", ...).no_default().agree_as(Agree::last).
  OptionRow sets(std::string f) && { return field = std::move(f), std::move(*this); }
  OptionRow no_default() && { return show_default = false, std::move(*this); }
  OptionRow in_group(std::string g) && { return group = std::move(g), std::move(*this); }
  OptionRow repeated() && { return repeatable = true, std::move(*this); }
  OptionRow values(int n, std::string name) && {
    return arity = n, type_name = std::move(name), std::move(*this);
  }
  OptionRow agree_as(Agree a) && { return agree = a, std::move(*this); }
  OptionRow at_least(double m) && { return min = m, std::move(*this); }
  OptionRow of_model(std::string m) && { return model = std::move(m), std::move(*this); }
};
using OptionTable = std::vector<OptionRow>;

/// A row of the usual kind: the field named after the flag (--log-interval sets log_interval;
/// .sets() says another), its default shown in --help, the last value wins, compared across
/// ranks, any model; the setters state the others.
OptionRow option(std::string flag, OptionTarget target, std::string help,
                 std::string expected = "");

/// {field, flag} of every row with a field: how errors name the fields (TrainerConfig::
/// field_names, GptSettings::field_names).
std::map<std::string, std::string> field_names(const OptionTable& rows);

/// The shortest %g text that reads back as `v` (0.05, not 0.050000000000000003); of a float,
/// the shortest that reads back as that float.
std::string shortest(double v);
std::string shortest(float v);

/// A value as the ranks compare it: a number in one spelling (8, 8.0 and 8e0 are 8; 0.05 and .05
/// the same double; -0 is 0), a flag's (`flag`) true / false in one spelling ("", 1, on, yes are
/// true), anything else as it is.
std::string canonical_value(const std::string& v, bool flag);

/// The value `row`'s target holds now, canonical_value's spelling; a list's values joined with
/// spaces, "(none)" when empty.
std::string option_value(const OptionRow& row);

/// The settings every process of an mpirun job must agree on (TrainerConfig::rank_settings):
/// {flag, value} of each row with Agree::yes in the table's order, then those with Agree::last;
/// the value `effective[flag]` when listed (a default the program settles elsewhere, e.g. --lr
/// the optimizer's), else option_value (after the program settled its defaults, so an option
/// left at its default and the same value given explicitly agree).
RankSettings option_settings(const OptionTable& rows,
                             const std::map<std::string, std::string>& effective = {});

/// TrainerConfig as a command line sets it: the config, and the fields that are text or have a
/// default of their own there. apply() writes them into `config`.
struct TrainerOptions {
  TrainerConfig config;
  std::string determinism = "bitwise";  ///< --determinism: bitwise or fast
  std::string dtype = "f32";            ///< --dtype: f32, bf16 or f16 (or float32, ...)
  std::string trainer = "dp";           ///< --trainer: dp or ddp
  std::string hidden = "128";           ///< --hidden: "256,128"; "": no hidden layer
  float lr = 0.05f;                     ///< --lr: config.lr when given
  double memory_gib = 80.0;             ///< --sim-memory-gib: config.memory_capacity when given
  std::int64_t log_interval = -1;       ///< --log-interval; -1: the program's default

  /// Writes the text fields into `config` (InvalidArgument naming the option by config.name_of:
  /// expected what, got what). `given`: the flags given. The defaults that depend on the run: a
  /// dry run is fast determinism unless --determinism is given (it predicts a production run:
  /// llm.c's, nanoGPT's); under mpirun (dist::is_initialized) --trainer is ddp unless given.
  void apply(const std::set<std::string>& given);
};

/// The Trainer's options (TrainerConfig's fields, through `o`).
OptionTable trainer_options(TrainerOptions& o);

/// The GPT's options (GptSettings' fields; model "gpt"), in the --help groups "GPT (--model gpt;
/// nanoGPT's options and CPU defaults)" and "GPT weights (...)".
OptionTable gpt_options(GptSettings& g);

/// The MLP's data: a CSV file's rows (data::CsvDataSource).
struct CsvRowsOptions {
  std::string data;                ///< --data: the CSV file
  std::string header = "auto";     ///< --header: auto, yes or no
  std::int64_t label_column = -1;  ///< --label-column (negative counts from the end)
  std::int64_t classes = 0;        ///< --classes; 0: the largest label + 1
  double val_fraction = 0.2;       ///< --val-fraction, in (0, 1)
};

/// The most classes of the MLP, inferred from the labels (the largest + 1) or given: a stray
/// label such as 100000 would otherwise build a 100001-way output layer silently.
inline constexpr std::int64_t kMaxClasses = 65536;

/// The options of the MLP's CSV rows (--data, --label-column, --classes, --header,
/// --val-fraction): model "mlp", but --data, which the GPT reads too.
OptionTable csv_rows_options(CsvRowsOptions& o);

/// The rows of `o.data` split with `seed`, the model's classes o.classes (every label < N, as
/// torch.nn.CrossEntropyLoss's targets < C) or else the largest label + 1, up to kMaxClasses.
/// Errors name the options by `c.name_of` ("data", "header", "classes", "val_fraction").
std::shared_ptr<CsvDataSource> open_csv_rows(const CsvRowsOptions& o, const TrainerConfig& c);

/// What to tell a nanoGPT user who typed one of nanoGPT's train.py settings as an option
/// (configurator.py's --key=value): `arg` is the option as typed ("--out_dir=out", "--max_iters";
/// '_' and '-' alike). Where ditto has the setting: "did you mean --checkpoint? (...)" with what
/// differs; where it has none: "nanoGPT's compile has no ditto equivalent: ..." and what to do
/// instead. "" for a name that is none of train.py's settings, or one ditto spells the same
/// (--dropout, --bias, --beta1, --beta2, --dtype, --backend: ditto's own options take them).
std::string nanogpt_option_hint(const std::string& arg);

/// What a config's settings do not do in this run, said once at its start (as PyTorch warns for
/// an ignored setting): --bucket-cap-mb without ddp, --micro-shards in fast mode, a device count
/// not a power of two in bitwise mode. `given`: the fields given explicitly.
std::vector<std::string> config_warnings(const TrainerConfig& c,
                                         const std::set<std::string>& given);

}  // namespace ditto::train
