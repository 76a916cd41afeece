// ditto-train --model gpt: --init-from, --export and --eval-only (ditto_train_weights.h).
#include "examples/ditto_train_weights.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/nn/gpt.h"
#include "core/runtime/error.h"

namespace ditto_train {

using namespace ditto;

const std::set<std::string>& weights_options() {
  static const std::set<std::string> names{"--init-from", "--export", "--eval-only"};
  return names;
}

void add_weights_options(CLI::App& app, WeightsOptions& w) {
  const char* group = "GPT weights (--model gpt; nanoGPT's init_from and eval_only)";
  app.add_option("--init-from", w.init_from,
                 "start from the weights in FILE, its format told by content: an llm.c model "
                 "file (gpt2_124M.bin, f32 or bf16), Hugging Face GPT-2 safetensors "
                 "(model.safetensors; n_head from a config.json beside it, a GPT-2 size or "
                 "--n-head) or a ditto checkpoint directory (its parameters only); the model's "
                 "configuration is the file's")
      ->type_name("FILE")
      ->group(group);
  app.add_option("--export", w.export_,
                 "write the trained model at the end: llmc FILE (llm.c's model file, f32), "
                 "llmc-bf16 FILE (bf16) or hf FILE (Hugging Face GPT-2 safetensors); repeat it "
                 "to write several files")
      ->expected(2)
      ->type_name("FORMAT FILE")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->group(group);
  app.add_flag("--eval-only", w.eval_only,
               "evaluate --eval-iters batches of each split once and stop: no training, no "
               "checkpoint (needs --init-from or --resume)")
      ->group(group);
}

namespace {

std::string file_name_key(const std::string& p) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path k = fs::weakly_canonical(fs::absolute(p, ec), ec);
  return ec ? fs::path(p).lexically_normal().string() : k.string();
}

// "a directory", "a FIFO", ... for a file that is not a regular one.
const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe: opening it would block until a reader comes)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

// --export FILE checked at the start, so that a long run is never lost at its end: FILE is a
// regular file or none (a FIFO would block the end of the run, a directory cannot be replaced),
// an existing FILE is writable (the export replaces it: a read-only one is refused rather than
// replaced behind its mode) and its directory exists and takes new files (the export writes
// FILE.tmp there and renames it: io::write_file_atomic).
void check_export_target(const std::string& format, const std::string& file) {
  namespace fs = std::filesystem;
  const std::string opt = "--export " + format;
  DITTO_CHECK(!file.empty(), opt, ": expected a file name, got ''");
  struct stat st {};
  if (::stat(file.c_str(), &st) == 0) {
    DITTO_CHECK(S_ISREG(st.st_mode), opt, ": expected a regular file (or none: it is created), "
                "got '", file, "', ", file_kind(st.st_mode));
    const bool writable = ::geteuid() == 0 ? (st.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)) != 0
                                           : ::access(file.c_str(), W_OK) == 0;
    DITTO_CHECK(writable, opt, ": expected a file it may replace, got '", file, "': Permission "
                "denied / read-only: remove it or chmod u+w");
  }
  fs::path dir = fs::path(file).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  DITTO_CHECK(fs::is_directory(dir, ec), opt, ": expected a file in an existing directory, "
              "got '", file, "' (no directory '", dir.string(), "')");
  DITTO_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, opt, ": expected a file in a directory "
              "it may write, got '", file, "' (directory '", dir.string(), "': ",
              std::strerror(errno), ")");
  // What access() cannot tell (root under /proc, a read-only file system): create the
  // temporary file the export will write, and remove it. One that exists (another rank's probe
  // under mpirun, a crash's leftover that the export removes) proves nothing and is left alone.
  const std::string tmp = file + ".tmp";
  struct stat tst {};
  if (::lstat(tmp.c_str(), &tst) != 0) {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    DITTO_CHECK(fd >= 0 || errno == EEXIST, opt, ": expected a file in a directory it may write, "
                "got '", file, "' (cannot create '", tmp, "': ", std::strerror(errno), ")");
    if (fd >= 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
    }
  }
}

}  // namespace

std::shared_ptr<const io::GptWeights> apply_init_from(const WeightsOptions& w, GptOptions& g,
                                                      const std::set<std::string>& given) {
  DITTO_CHECK(!given.count("--init-from") || !w.init_from.empty(), "--init-from: expected a "
              "model file or a checkpoint directory, got ''");
  if (w.init_from.empty()) return nullptr;
  DITTO_CHECK(!given.count("--preset"), "--preset: expected none with --init-from (the file "
              "gives the model's configuration), got --preset ", g.preset);
  auto weights = std::make_shared<io::GptWeights>();
  try {
    *weights = io::load_gpt_weights(w.init_from, given.count("--n-head") ? g.n_head : 0);
  } catch (const ParseError& e) {
    throw ParseError(detail::cat("--init-from: ", e.what()));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(detail::cat("--init-from: ", e.what()));
  } catch (const Error& e) {
    throw Error(detail::cat("--init-from: ", e.what()));
  }
  const nn::GPTConfig& f = weights->config;
  auto take = [&](const char* opt, std::int64_t& field, std::int64_t v, bool file_says = true) {
    DITTO_CHECK(!given.count(opt) || !file_says || field == v, opt, ": expected the --init-from "
                "file's ", v, " ('", w.init_from, "', ", weights->description, "), got ", field);
    field = v;
  };
  take("--n-layer", g.n_layer, f.n_layer);
  take("--n-head", g.n_head, f.n_head, !weights->n_head_from.empty());
  take("--n-embd", g.n_embd, f.n_embd);
  take("--block-size", g.block_size, f.block_size);
  take("--vocab-size", g.vocab_size, f.vocab_size);
  if (!given.count("--vocab-size"))
    g.vocab_size_from = detail::cat("--init-from '", w.init_from, "' (", weights->description,
                                    ")");
  DITTO_CHECK(!given.count("--bias") || g.bias == f.bias, "--bias: expected the --init-from "
              "file's bias=", f.bias ? "True" : "False", " ('", w.init_from, "', ",
              weights->description, "), got bias=", g.bias ? "True" : "False");
  g.bias = f.bias;
  return weights;
}

void print_init_from(const WeightsOptions& w, const io::GptWeights& weights) {
  const nn::GPTConfig& f = weights.config;
  std::printf("ditto-train: init_from=%s (%s): n_layer=%" PRId64 " n_head=%" PRId64
              " (from %s) n_embd=%" PRId64 " block_size=%" PRId64 " vocab_size=%" PRId64,
              w.init_from.c_str(), weights.description.c_str(), f.n_layer, f.n_head,
              weights.n_head_from.empty() ? "--n-head" : weights.n_head_from.c_str(),
              f.n_embd, f.block_size, f.vocab_size);
  if (weights.padded_vocab_size != f.vocab_size)
    std::printf(" (the file's padded rows %" PRId64 "..%" PRId64 " dropped: llm.c never reads "
                "them)", f.vocab_size, weights.padded_vocab_size - 1);
  std::printf(" bias=%s\n", f.bias ? "True" : "False");
  std::fflush(stdout);
}

void configure_weights(const WeightsOptions& w, std::shared_ptr<const io::GptWeights> weights,
                       GptOptions& g, const std::set<std::string>& given,
                       const std::string& data, train::TrainerConfig& c) {
  DITTO_CHECK(w.export_.size() % 2 == 0, "--export: expected FORMAT FILE, got ",
              w.export_.size(), " values");
  std::set<std::string> targets;
  for (std::size_t i = 0; i < w.export_.size(); i += 2) {
    const std::string& format = w.export_[i];
    const std::string& file = w.export_[i + 1];
    DITTO_CHECK(format == "llmc" || format == "llmc-bf16" || format == "hf",
                "--export: expected a format llmc, llmc-bf16 or hf, got '", format, "'");
    DITTO_CHECK(g.bias, "--export ", format, ": expected a GPT with biases (llm.c's and Hugging "
                "Face's GPT-2 have every bias: --bias, or --init-from a GPT-2 file), got "
                "bias=False");
    DITTO_CHECK(!file.empty(), "--export: expected a file name, got ''");
    DITTO_CHECK(!c.dry_run, "--export: expected a run that trains (a dry run holds no tensor "
                "data: the file would be zeros), got --dry-run");
    const std::string key = file_name_key(file);
    DITTO_CHECK(w.init_from.empty() || key != file_name_key(w.init_from), "--export: expected a "
                "file other than --init-from's, got '", file, "', which it would overwrite");
    DITTO_CHECK(key != file_name_key(data), "--export: expected a file other than --data's, got '",
                file, "', which it would overwrite");
    DITTO_CHECK(targets.insert(key).second, "--export: expected a different file for each "
                "--export, got '", file, "' twice");
    check_export_target(format, file);
  }
  DITTO_CHECK(!w.eval_only || !w.init_from.empty() || !c.resume_dir.empty(), "--eval-only: "
              "expected a model to evaluate, --init-from FILE or --resume DIR, got neither (it "
              "would evaluate a randomly initialised model)");
  c.eval_only = w.eval_only;
  if (w.eval_only) {
    c.field_names["eval_only"] = "--eval-only";
    if (!given.count("--sample")) g.sample = 0;  // nanoGPT's eval_only samples nothing
  }
  if (!weights) return;
  const train::ModelFactory base = c.make_model;
  const bool dry = c.dry_run;
  c.make_model = [base, weights, dry](const Device& d) {
    std::unique_ptr<nn::Module> m = base(d);
    if (!dry) io::load_gpt_params(*m, *weights);  // a dry run holds no tensor data
    return m;
  };
}

void export_model(const WeightsOptions& w, train::Replica& rep, const nn::GPTConfig& m) {
  if (w.export_.empty()) return;
  const auto params = io::gpt_params_f32(rep.model());
  for (std::size_t i = 0; i + 1 < w.export_.size(); i += 2) {
    const std::string& format = w.export_[i];
    const std::string& file = w.export_[i + 1];
    struct stat st {};  // an existing file keeps its mode (the write makes a new 0644 file)
    const bool had = ::stat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode);
    const char* what = nullptr;
    if (format == "hf") {
      io::save_hf_gpt2(file, m, params);
      what = "Hugging Face GPT-2 safetensors, f32";
    } else {
      const bool bf16 = format == "llmc-bf16";
      io::save_llmc_model(file, m, params, bf16 ? DType::bf16 : DType::f32);
      what = bf16 ? "llm.c model file, bf16 (version 5)" : "llm.c model file, f32 (version 3)";
    }
    if (had) ::chmod(file.c_str(), st.st_mode & 07777);
    std::printf("ditto-train: exported %s (%s)\n", file.c_str(), what);
    std::fflush(stdout);
  }
}

}  // namespace ditto_train
