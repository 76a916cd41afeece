// The option tables of the Trainer, the MLP's CSV rows and the GPT (core/train/options.h), and
// the settings the ranks of an mpirun job compare, read from the rows.
#include "core/train/options.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "core/base/error.h"
#include "core/distributed/distributed.h"
#include "core/numerics/micro_shards.h"

namespace ditto::train {

OptionRow option(std::string flag, OptionTarget target, std::string help, std::string expected) {
  OptionRow r;
  r.field = flag.rfind("--", 0) == 0 ? flag.substr(2) : flag;
  std::replace(r.field.begin(), r.field.end(), '-', '_');
  r.flag = std::move(flag);
  r.target = target;
  r.help = std::move(help);
  r.expected = std::move(expected);
  return r;
}

std::map<std::string, std::string> field_names(const OptionTable& rows) {
  std::map<std::string, std::string> out;
  for (const OptionRow& r : rows)
    if (!r.field.empty()) out[r.field] = r.flag;
  return out;
}

std::string shortest(double v) {
  char buf[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string shortest(float v) {
  char buf[40];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v) return buf;
  }
  return shortest(static_cast<double>(v));
}

std::string canonical_value(const std::string& v, bool flag) {
  if (flag) {
    if (v.empty() || v == "1" || v == "true" || v == "on" || v == "yes") return "true";
    if (v == "0" || v == "false" || v == "off" || v == "no") return "false";
    return v;
  }
  if (v.empty() || std::isspace(static_cast<unsigned char>(v.front()))) return v;
  char* end = nullptr;
  errno = 0;
  const long long i = std::strtoll(v.c_str(), &end, 10);
  if (*end == '\0' && errno == 0) return std::to_string(i);
  errno = 0;
  const double d = std::strtod(v.c_str(), &end);
  if (*end != '\0' || errno != 0) return v;
  return shortest(d == 0 ? 0.0 : d);  // -0 is 0
}

std::string option_value(const OptionRow& row) {
  struct Text {
    std::string operator()(bool* b) const { return *b ? "true" : "false"; }
    std::string operator()(int* i) const { return std::to_string(*i); }
    std::string operator()(std::int64_t* i) const { return std::to_string(*i); }
    std::string operator()(std::uint64_t* i) const { return std::to_string(*i); }
    std::string operator()(float* f) const { return shortest(*f == 0 ? 0.0f : *f); }
    std::string operator()(double* d) const { return shortest(*d == 0 ? 0.0 : *d); }
    std::string operator()(std::string* s) const { return canonical_value(*s, false); }
    std::string operator()(std::vector<std::string>* list) const {
      std::string out;
      for (const std::string& s : *list)
        out += (out.empty() ? "" : " ") + canonical_value(s, false);
      return list->empty() ? "(none)" : out;
    }
  };
  return std::visit(Text{}, row.target);
}

RankSettings option_settings(const OptionTable& rows,
                             const std::map<std::string, std::string>& effective) {
  RankSettings out;
  for (const Agree pass : {Agree::yes, Agree::last})
    for (const OptionRow& r : rows) {
      if (r.agree != pass) continue;
      const auto it = effective.find(r.flag);
      out.emplace_back(r.flag, it != effective.end() ? it->second : option_value(r));
    }
  return out;
}

namespace {

/// --hidden: "" is no hidden layer; otherwise every comma-separated item must be a size.
std::vector<std::int64_t> parse_sizes(const std::string& text, const std::string& name) {
  std::vector<std::int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (!text.empty() && std::getline(ss, item, ',')) {
    DITTO_CHECK(!item.empty() && text.back() != ',', name,
                ": expected comma-separated positive sizes such as 128 or 256,128 ('' for no "
                "hidden layer), got '",
                text, "' (an empty item)");
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    DITTO_CHECK(*end == '\0' && errno == 0 && v > 0, name,
                ": expected comma-separated positive sizes such as 128 or 256,128, got '", text,
                "'");
    out.push_back(v);
  }
  return out;
}

/// `r`, an option of the MLP only (the GPT's are nanoGPT's: --max-iters, not --epochs).
OptionRow mlp(OptionRow r) {
  r.model = "mlp";
  return r;
}

}  // namespace

void TrainerOptions::apply(const std::set<std::string>& given) {
  TrainerConfig& c = config;
  const auto n = [&](const char* field) { return c.name_of(field); };
  // A dry run predicts a production run: fast mode (llm.c's, nanoGPT's) unless asked otherwise.
  if (c.dry_run && !given.count(n("determinism"))) determinism = "fast";
  c.determinism = parse_determinism(determinism);
  // nanoGPT's spellings of its dtype (torch's names): the same dtypes.
  if (dtype == "float32") dtype = "f32";
  if (dtype == "bfloat16") dtype = "bf16";
  if (dtype == "float16") dtype = "f16";
  DITTO_CHECK(dtype == "f32" || dtype == "bf16" || dtype == "f16", n("dtype"),
              ": expected f32, bf16 or f16 (or nanoGPT's float32, bfloat16, float16), got '", dtype,
              "'");
  c.dtype = dtype == "bf16" ? DType::bf16 : dtype == "f16" ? DType::f16 : DType::f32;
  // The byte count must fit in size_t: converting a larger (or infinite) double is undefined.
  constexpr double kMaxMemoryGib = double(std::uint64_t(1) << 34);  // 2^34 GiB = 2^64 bytes
  DITTO_CHECK(memory_gib > 0 && memory_gib < kMaxMemoryGib, n("memory_capacity"),
              ": expected a size in GiB > 0 and < 17179869184 (16 EiB), got ", memory_gib);
  if (given.count(n("memory_capacity")))
    c.memory_capacity = static_cast<std::size_t>(memory_gib * double(1ull << 30));
  c.hidden = parse_sizes(hidden, n("hidden"));
  if (given.count(n("lr"))) c.lr = lr;
  if (dist::is_initialized() && !given.count(n("trainer"))) trainer = "ddp";  // the default there
  c.trainer = parse_trainer_kind(trainer, n("trainer"));
}

OptionTable trainer_options(TrainerOptions& o) {
  TrainerConfig& c = o.config;
  // In TrainerConfig's order (core/train/trainer_config.h), its sections.
  OptionTable t{
      // ---- backend and devices
      option("--backend", &c.backend, "sim, cuda or auto (cuda when a GPU is usable)"),
      option("--devices", &c.devices, "number of devices (data-parallel replicas)",
             "an integer in 1..65536"),
      option("--sim-memory-gib", &o.memory_gib, "memory capacity of each simulated device",
             "a size in GiB > 0")
          .sets("memory_capacity"),
      // ---- model, optimizer, loss
      mlp(option("--hidden", &o.hidden,
                 "hidden layer sizes, comma-separated (e.g. 256,128; '' for no hidden layer)")),
      mlp(option("--optimizer", &c.optimizer, "sgd or adam")),
      option("--lr", &o.lr,
             "learning rate (default 0.05 for sgd, 0.001 for adam; --model gpt: the peak of "
             "the schedule, default 0.001)",
             "a number > 0")
          .no_default()
          .agree_as(Agree::last),
      mlp(option("--momentum", &c.momentum, "SGD momentum", "a number")),
      option("--weight-decay", &c.weight_decay,
             "SGD weight decay (--model gpt: AdamW's, on the 2-D weights, default 0.1)",
             "a number >= 0"),
      mlp(option("--loss", &c.loss, "cross-entropy or mse (on one-hot targets)")),
      // ---- the loop
      option("--batch-size", &c.batch_size,
             "global batch size: the rows (GPT: windows) of one optimizer step, split over the "
             "devices and their --grad-accum-steps micro-steps (nanoGPT's batch_size is one "
             "rank's micro-batch: its batch_size x gradient_accumulation_steps is this; "
             "--model gpt: default 12)",
             "an integer >= 1")
          .at_least(1),
      mlp(option("--epochs", &c.epochs, "training epochs", "an integer >= 0")),
      option("--seed", &c.seed, "seed for initialisation, split and shuffling", "an integer >= 0"),
      option("--determinism", &o.determinism,
             "bitwise (same bits for any power-of-two device count) or fast"),
      option("--micro-shards", &c.micro_shards,
             "micro-shards K of a batch in bitwise mode (power of two >= devices)",
             "a power of two >= --devices"),
      option(
          "--trainer", &o.trainer,
          "dp (DataParallel, one controller thread) or ddp (DistributedDataParallel, a thread per "
          "rank; under mpirun a process per rank, the default there)"),
      option("--bucket-cap-mb", &c.bucket_cap_mb, "ddp: gradient bucket size cap in MiB",
             "a size in MiB > 0"),
      option("--allow-nonfinite-loss", &c.allow_nonfinite_loss,
             "keep training after a step whose loss is NaN or inf (default: stop with an error "
             "naming the step)"),
      option("--log-interval", &o.log_interval,
             "steps between progress lines 'iter N: loss L, time Tms[, mfu M%]' (nanoGPT's "
             "log_interval; also JSON lines): default 10 for --model gpt; the MLP's default "
             "100 prints only in epochs longer than that; 0: none",
             "an integer >= 0")
          .no_default()
          .agree_as(Agree::no),
      // ---- GPT-2 scale (mixed precision, ZeRO-1, gradient accumulation, dry run)
      option("--dtype", &o.dtype,
             "f32, or mixed precision bf16 / f16 (nanoGPT's float32, bfloat16, float16 too): "
             "parameters, activations and gradients stored in that dtype, f32 master weights and "
             "optimizer state (f16 adds dynamic loss scaling, as torch's GradScaler)"),
      option("--zero-stage", &c.zero_stage,
             "ddp: 1 shards the optimizer state over the ranks (ZeRO-1, llm.c's -z 1; gradients "
             "reduce_scatter, parameters all_gather), 0 none",
             "0 or 1"),
      option("--zero-overlap-comm", &c.zero_overlap_comm,
             "--zero-stage 1: reduce_scatter each gradient chunk during the backward as soon as "
             "its grads are ready, overlapping it (DeepSpeed's overlap_comm, llm.c's behaviour; "
             "the same bits); --zero-overlap-comm=false: all of them after the backward"),
      option(
          "--grad-accum-steps", &c.grad_accum_steps,
          "micro-steps per optimizer step on each device (ddp: no_sync on all but the last): "
          "each takes a contiguous part of --batch-size; nanoGPT's gradient_accumulation_steps "
          "counts all ranks' (train.py divides it by the world size): give it divided by "
          "--devices (docs/llmc_nanogpt.md); bitwise: a power of two with micro-shards divisible "
          "by it x devices (above 1, a power-of-two device count), the same bits as 1",
          "an integer >= 1"),
      option("--dry-run", &c.dry_run,
             "sim: price every kernel, copy and collective and account every allocation "
             "without running them or holding tensor data (predicts a large model's step time "
             "and memory in seconds; fast determinism unless --determinism is given)"),
      option("--allow-tf32", &c.allow_tf32,
             "fast mode: f32 matrix products may run on TF32 tensor cores (cuda: cuBLASLt's "
             "CUBLAS_COMPUTE_32F_FAST_TF32; torch's allow_tf32). Default: strict f32"),
      // ---- checkpoints, communicators
      option("--checkpoint", &c.checkpoint_dir,
             "directory to save checkpoints in (and at the end; created with its parents)",
             "a directory")
          .sets("checkpoint_dir")
          .no_default(),
      option("--checkpoint-every", &c.checkpoint_every, "optimizer steps between checkpoints",
             "an integer >= 0")
          .no_default(),
      option("--resume", &c.resume_dir,
             "resume from the newest usable checkpoint in DIR, or from DIR/step-N exactly; auto: "
             "from --checkpoint's DIR when it holds one, else start fresh (a restart loop's every "
             "run)",
             "a checkpoint directory")
          .sets("resume_dir")
          .no_default(),
      option("--comm-timeout-ms", &c.comm_timeout_ms,
             "timeout of every communicator in ms (0: their own; at most 2^31)",
             "an integer in 0..2147483648")};
  return t;
}

OptionTable gpt_options(GptSettings& g) {
  const std::string group = "GPT (--model gpt; nanoGPT's options and CPU defaults)";
  const auto row = [&](const char* flag, OptionTarget target, const char* help,
                       const char* expected = "") {
    return option(flag, target, help, expected).in_group(group).of_model("gpt");
  };
  OptionTable t{
      row("--n-layer", &g.n_layer, "transformer blocks (at most 21845 with --dropout > 0)",
          "an integer >= 1"),
      row("--n-head", &g.n_head, "attention heads (n_embd % n_head == 0)", "an integer >= 1"),
      row("--n-embd", &g.n_embd, "embedding width", "an integer >= 1"),
      row("--block-size", &g.block_size, "context length in characters", "an integer >= 1"),
      row("--max-iters", &g.max_iters, "optimizer steps", "an integer >= 1"),
      row("--eval-interval", &g.eval_interval, "steps between evaluations (also at 0 and the end)",
          "an integer >= 1"),
      row("--eval-iters", &g.eval_iters, "batches per split per evaluation (fixed windows)",
          "an integer >= 0"),
      row("--min-lr", &g.min_lr, "learning rate at the end of the cosine decay", "a number >= 0"),
      row("--warmup-iters", &g.warmup_iters, "steps of linear warm-up", "an integer >= 0"),
      row("--lr-decay-iters", &g.lr_decay_iters, "step where the cosine decay reaches --min-lr",
          "an integer > --warmup-iters"),
      row("--grad-clip", &g.grad_clip, "clip the gradients' global norm to this (0: off)",
          "a number >= 0"),
      row("--dropout", &g.dropout, "dropout probability of every dropout site",
          "a number in [0, 1)"),
      row("--bias", &g.bias, "biases in the Linears and LayerNorms (default: none)"),
      row("--beta1", &g.beta1, "AdamW beta1", "a number in [0, 1)"),
      row("--beta2", &g.beta2, "AdamW beta2", "a number in [0, 1)"),
      row("--sample", &g.sample, "characters to generate at the end (0: none)", "an integer >= 0"),
      row("--temperature", &g.temperature, "sampling temperature", "a number > 0"),
      row("--top-k", &g.top_k, "sample among the k likeliest characters (0: all)",
          "an integer >= 0"),
      row("--preset", &g.preset,
          "nanoGPT's GPT-2 size: gpt2 (124M), gpt2-medium, gpt2-large, gpt2-xl (block 1024, vocab "
          "50304, biases; explicit --n-layer etc. win)"),
      row("--vocab-size", &g.vocab_size,
          "rows of wte (0: the text's vocabulary, llm.c's tokenizer's 50257 / 128256; --preset: "
          "50304); nanoGPT's .bin tokens need it: meta.pkl's vocab_size, 50304 for GPT-2 BPE",
          "an integer >= 0"),
      row("--data-format", &g.data_format,
          "what --data holds: auto (llm.c shards by their magic 20240520 / 20240801, else nanoGPT "
          "uint16 tokens for a name ending in .bin, else a text), text, llmc or nanogpt"),
      row("--val-data", &g.val_data,
          "validation token files (a file, comma list or glob; default: --data's name with its "
          "last 'train' made 'val' and a shard number any: fineweb_val_*.bin, val.bin beside "
          "train.bin)")};
  const std::string weights = "GPT weights (--model gpt; nanoGPT's init_from and eval_only)";
  t.push_back(option("--init-from", &g.init_from,
                     "start from the weights in FILE, its format told by content: an llm.c "
                     "model file (gpt2_124M.bin, f32 or bf16), Hugging Face GPT-2 safetensors "
                     "(model.safetensors; n_head from a config.json beside it, a GPT-2 size or "
                     "--n-head) or a ditto checkpoint directory (its parameters only); the "
                     "model's configuration is the file's")
                  .no_default()
                  .in_group(weights)
                  .values(1, "FILE")
                  .of_model("gpt"));
  t.push_back(option("--export", &g.export_files,
                     "write the trained model at the end: llmc FILE (llm.c's model file, f32), "
                     "llmc-bf16 FILE (bf16) or hf FILE (Hugging Face GPT-2 safetensors); repeat "
                     "it to write several files")
                  .sets("export_files")
                  .no_default()
                  .in_group(weights)
                  .repeated()
                  .values(2, "FORMAT FILE")
                  .of_model("gpt"));
  t.push_back(option("--eval-only", &g.eval_only,
                     "evaluate --eval-iters batches of each split once and stop: no training, "
                     "no checkpoint (needs --init-from or --resume)")
                  .in_group(weights)
                  .of_model("gpt"));
  return t;
}

OptionTable csv_rows_options(CsvRowsOptions& o) {
  return {
      option(
          "--data", &o.data,
          "CSV file: numeric features, integer class label (--model gpt: a text file, default the "
          "bundled shakespeare.txt, or token files: llm.c shards or nanoGPT's train.bin, one file, a "
          "comma list or a glob; see --data-format)"),
      mlp(option("--label-column", &o.label_column, "label column (negative counts from the end)",
                 "an integer")),
      mlp(option("--classes", &o.classes,
                 "classes of the model's output (every label < N, as CrossEntropyLoss's "
                 "num_classes; default the largest label + 1; at most 65536, labels 0..65535)",
                 "an integer in 1..65536")
              .no_default()
              .at_least(1)),
      mlp(option("--header", &o.header, "first row is a header: auto, yes or no")),
      mlp(option("--val-fraction", &o.val_fraction, "fraction of rows held out for validation",
                 "a number in (0, 1)"))};
}

std::shared_ptr<CsvDataSource> open_csv_rows(const CsvRowsOptions& o, const TrainerConfig& c) {
  data::CsvOptions csv;
  csv.label_column = o.label_column;
  if (o.header == "yes")
    csv.header = data::CsvHeader::yes;
  else if (o.header == "no")
    csv.header = data::CsvHeader::no;
  else
    DITTO_CHECK(o.header == "auto", c.name_of("header"), ": expected auto, yes or no, got '",
                o.header, "'");
  DITTO_CHECK(o.val_fraction > 0 && o.val_fraction < 1, c.name_of("val_fraction"),
              ": expected a value in (0, 1), got ", o.val_fraction);
  auto rows = std::make_shared<CsvDataSource>(o.data, csv, o.val_fraction, c.seed);
  const std::int64_t inferred = rows->num_outputs();  // the largest label + 1
  const std::string classes = c.name_of("classes");
  if (o.classes == 0) {
    DITTO_CHECK(inferred <= kMaxClasses, c.name_of("data"), ": ", o.data, ": the largest label is ",
                inferred - 1, ", which would make a model of ", inferred,
                " classes: expected labels 0..", kMaxClasses - 1,
                " (the most classes ditto-train's model has)");
    return rows;
  }
  DITTO_CHECK(o.classes >= 1 && o.classes <= kMaxClasses, classes, ": expected an integer in 1..",
              kMaxClasses, ", got ", o.classes);
  DITTO_CHECK(o.classes >= inferred, classes,
              ": expected a number of classes greater than every label (the largest in ", o.data,
              " is ", inferred - 1, "), got ", o.classes);
  rows->set_num_classes(o.classes, classes);
  return rows;
}

std::vector<std::string> config_warnings(const TrainerConfig& c,
                                         const std::set<std::string>& given) {
  std::vector<std::string> out;
  const auto n = [&](const char* field) { return c.name_of(field); };
  if (given.count("bucket_cap_mb") && c.trainer != TrainerKind::ddp)
    out.push_back(n("bucket_cap_mb") +
                  ": sizes --trainer ddp's gradient buckets; DataParallel (--trainer dp) has none, "
                  "so it does nothing in this run");
  if (given.count("zero_overlap_comm") && !(c.zero_stage == 1 && c.trainer == TrainerKind::ddp))
    out.push_back(n("zero_overlap_comm") +
                  ": overlaps ZeRO-1's reduce_scatters (--zero-stage 1 with --trainer ddp) with "
                  "the backward; this run has none, so it does nothing");
  if (given.count("micro_shards") && c.determinism != Determinism::bitwise)
    out.push_back(n("micro_shards") +
                  ": splits the batch in --determinism bitwise only; fast mode does not use it, so "
                  "it does nothing in this run");
  const long long devices = run_devices(c);
  if (c.determinism == Determinism::bitwise && (devices & (devices - 1)) != 0)
    out.push_back(devices_name(c, devices) + ": " + std::to_string(devices) +
                  (dist::is_initialized() ? " processes" : " devices") +
                  ", not a power of two: the params_checksum is the same from run to run "
                  "but differs from the one every power-of-two device count (1, 2, 4, ...) gives "
                  "(bitwise mode splits the batch in power-of-two micro-shards, Note "
                  "[Micro-shards])");
  if (given.count("memory_capacity") && c.backend == "cuda")
    out.push_back(n("memory_capacity") +
                  ": the capacity of simulated devices; the cuda backend's devices have their own "
                  "memory, so it does nothing in this run");
  if (given.count("allow_tf32") && c.allow_tf32 && c.determinism == Determinism::bitwise)
    out.push_back(n("allow_tf32") +
                  ": lets fast mode's f32 matrix products run on TF32 tensor cores; bitwise mode "
                  "keeps strict f32 (the simulator's bits), so it does nothing in this run");
  else if (given.count("allow_tf32") && c.allow_tf32 && c.dtype != DType::f32)
    out.push_back(n("allow_tf32") +
                  ": lets fast mode's f32 matrix products run on TF32 tensor cores; " + n("dtype") +
                  " " + dtype_name(c.dtype) + "'s matrix products run on the " +
                  (c.dtype == DType::bf16 ? "BF16" : "FP16") +
                  " tensor cores (TF32 affects only f32 ones), so it does nothing in this run");
  return out;
}

std::string nanogpt_option_hint(const std::string& arg) {
  std::string name = arg.substr(0, arg.find('='));
  name.erase(0, std::min(name.find_first_not_of('-'), name.size()));
  std::replace(name.begin(), name.end(), '-', '_');
  // nanoGPT's train.py settings (its globals, which configurator.py's --key=value overrides) that
  // ditto names otherwise: {name, ditto's option ("" for none), what differs or what to do}.
  struct Hint {
    const char* name;
    const char* flag;
    const char* note;
  };
  static const Hint hints[] = {
      {"out_dir", "--checkpoint", "nanoGPT's out_dir: ditto writes DIR/step-N/ checkpoints there"},
      {"eval_interval", "--eval-interval", ""},
      {"log_interval", "--log-interval", ""},
      {"eval_iters", "--eval-iters", ""},
      {"eval_only", "--eval-only", ""},
      {"init_from", "--init-from",
       "a weights file here; nanoGPT's 'resume' is --resume DIR, 'gpt2*' an llm.c or Hugging Face "
       "file of those weights"},
      {"dataset", "--data",
       "a file here (text, nanoGPT's train.bin, llm.c shards), not a folder "
       "name under data/"},
      {"gradient_accumulation_steps", "--grad-accum-steps",
       "micro-steps per optimizer step of each device: nanoGPT's count divided by --devices, as "
       "train.py divides it by the world size"},
      {"batch_size", "--batch-size",
       "the global batch: nanoGPT's batch_size x gradient_accumulation_steps; nanoGPT's "
       "batch_size is one rank's micro-batch"},
      {"block_size", "--block-size", ""},
      {"n_layer", "--n-layer", ""},
      {"n_head", "--n-head", ""},
      {"n_embd", "--n-embd", ""},
      {"learning_rate", "--lr", "nanoGPT's learning_rate"},
      {"max_iters", "--max-iters", ""},
      {"weight_decay", "--weight-decay", ""},
      {"grad_clip", "--grad-clip", ""},
      {"warmup_iters", "--warmup-iters", ""},
      {"lr_decay_iters", "--lr-decay-iters", ""},
      {"min_lr", "--min-lr", ""},
      {"always_save_checkpoint", "",
       "ditto writes a checkpoint every --checkpoint-every steps and at the end, whatever the "
       "validation loss, into --checkpoint DIR (the two newest are kept)"},
      {"decay_lr", "",
       "the GPT's learning rate always follows the linear warm-up and cosine decay "
       "(--warmup-iters, --lr-decay-iters, --min-lr); decay_lr=False is --warmup-iters 0 with "
       "--min-lr equal to --lr"},
      {"compile", "",
       "ditto has no torch.compile: its kernels are compiled ahead of time; leave it out"},
      {"device", "",
       "--backend picks the devices (cuda, sim or auto) and --devices how many (one process "
       "drives them all; under mpirun, one each)"},
      {"wandb_log", "",
       "ditto logs to no service: --metrics-jsonl FILE writes each step's and evaluation's "
       "metrics as JSON lines"},
      {"wandb_project", "", "ditto logs to no service: see --metrics-jsonl FILE"},
      {"wandb_run_name", "", "ditto logs to no service: see --metrics-jsonl FILE"},
  };
  for (const Hint& h : hints) {
    if (name != h.name) continue;
    if (*h.flag == '\0')
      return detail::cat("nanoGPT's ", h.name, " has no ditto equivalent: ", h.note);
    return detail::cat("did you mean ", h.flag, "?", *h.note ? " (" : "", h.note,
                       *h.note ? ")" : "");
  }
  return "";
}

}  // namespace ditto::train
