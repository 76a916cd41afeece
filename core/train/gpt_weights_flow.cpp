// The GPT run's weights in and out (core/train/gpt_recipe.h): init_from's file sets the model
// (nanoGPT's init_from), export_files are written at the end, eval_only evaluates and stops.
#include <sys/stat.h>

#include <cinttypes>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <vector>

#include "core/base/error.h"
#include "core/io/file.h"
#include "core/nn/gpt.h"
#include "core/train/gpt_recipe.h"

namespace ditto::train {

// Reads g.init_from and sets g's model fields from it; a field in g.given that contradicts the
// file is refused naming both values, and a preset is refused with it. `vocab_from`: what a
// refusal of the file's vocab_size names. Null without init_from.
std::shared_ptr<const io::GptWeights> apply_init_from(GptSettings& g, std::string& vocab_from) {
  const std::string init_from = g.name_of("init_from");
  DITTO_CHECK(!g.given.count("init_from") || !g.init_from.empty(), init_from,
              ": expected a "
              "model file or a checkpoint directory, got ''");
  if (g.init_from.empty()) return nullptr;
  DITTO_CHECK(!g.given.count("preset"), g.name_of("preset"), ": expected none with ", init_from,
              " (the file gives the model's configuration), got ", g.name_of("preset"), " ",
              g.preset);
  auto weights = std::make_shared<io::GptWeights>();
  try {
    *weights = io::load_gpt_weights(g.init_from, g.given.count("n_head") ? g.n_head : 0);
  } catch (const ParseError& e) {
    throw ParseError(detail::cat(init_from, ": ", e.what()));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(detail::cat(init_from, ": ", e.what()));
  } catch (const Error& e) {
    throw Error(detail::cat(init_from, ": ", e.what()));
  }
  const nn::GPTConfig& f = weights->config;
  auto take = [&](const char* field, std::int64_t& v, std::int64_t file, bool file_says = true) {
    DITTO_CHECK(!g.given.count(field) || !file_says || v == file, g.name_of(field),
                ": expected "
                "the ",
                init_from, " file's ", file, " ('", g.init_from, "', ", weights->description,
                "), got ", v);
    v = file;
  };
  take("n_layer", g.n_layer, f.n_layer);
  take("n_head", g.n_head, f.n_head, !weights->n_head_from.empty());
  take("n_embd", g.n_embd, f.n_embd);
  take("block_size", g.block_size, f.block_size);
  take("vocab_size", g.vocab_size, f.vocab_size);
  if (!g.given.count("vocab_size"))
    vocab_from = detail::cat(init_from, " '", g.init_from, "' (", weights->description, ")");
  DITTO_CHECK(!g.given.count("bias") || g.bias == f.bias, g.name_of("bias"), ": expected the ",
              init_from, " file's bias=", f.bias ? "True" : "False", " ('", g.init_from, "', ",
              weights->description, "), got bias=", g.bias ? "True" : "False");
  g.bias = f.bias;
  return weights;
}

std::string format_init_from(const std::string& prog, const GptSettings& g,
                             const io::GptWeights& weights) {
  const nn::GPTConfig& f = weights.config;
  char buf[1024];
  std::string s = prog + ": init_from=" + g.init_from + " (" + weights.description + ")";
  std::snprintf(
      buf, sizeof buf,
      ": n_layer=%" PRId64 " n_head=%" PRId64 " (from %s) n_embd=%" PRId64 " block_size=%" PRId64
      " vocab_size=%" PRId64,
      f.n_layer, f.n_head,
      weights.n_head_from.empty() ? g.name_of("n_head").c_str() : weights.n_head_from.c_str(),
      f.n_embd, f.block_size, f.vocab_size);
  s += buf;
  if (weights.padded_vocab_size != f.vocab_size) {
    std::snprintf(buf, sizeof buf,
                  " (the file's padded rows %" PRId64 "..%" PRId64 " dropped: "
                  "llm.c never reads them)",
                  f.vocab_size, weights.padded_vocab_size - 1);
    s += buf;
  }
  s += std::string(" bias=") + (f.bias ? "True" : "False");
  if (!weights.vocab.empty())  // Note [Checkpoint vocabulary]: the text is encoded with it
    s += detail::cat(" vocab=", weights.vocab.size(), " characters (", weights.vocab_from, ")");
  return s + "\n";
}

RunInputs gpt_inputs(const GptSettings& g, const GptRun& run, const TrainerConfig& c) {
  RunInputs in;
  const std::string data = g.name_of("data");
  // Validation files found beside the data are named as open_data's errors name them: the user
  // gave no --val-data.
  const std::string val_data = g.given.count("val_data")
                                   ? g.name_of("val_data")
                                   : data + " (validation file found beside it)";
  if (run.text) in.files.emplace_back(data, run.text->name());
  if (const TokenDataSource* t = run.tokens.get()) {
    for (const auto& f : t->train().files()) in.files.emplace_back(data, f->path());
    if (t->val())
      for (const auto& f : t->val()->files()) in.files.emplace_back(val_data, f->path());
  }
  if (!g.init_from.empty()) {
    std::error_code ec;  // a ditto checkpoint directory: each file in it
    (std::filesystem::is_directory(g.init_from, ec) ? in.dirs : in.files)
        .emplace_back(g.name_of("init_from"), g.init_from);
  }
  in.dirs.emplace_back(c.name_of("checkpoint_dir"), c.checkpoint_dir);
  in.dirs.emplace_back(c.name_of("resume_dir"), c.resume_dir);
  return in;
}

std::vector<io::NamedPath> gpt_exports(const GptSettings& g) {
  std::vector<io::NamedPath> out;
  for (std::size_t i = 0; i + 1 < g.export_files.size(); i += 2)
    out.emplace_back(g.name_of("export_files") + " " + g.export_files[i], g.export_files[i + 1]);
  return out;
}

// Checks export_files (format llmc, llmc-bf16 or hf; a model with biases; a file in an existing
// directory that is none of gpt_inputs' files and outside its directories) and eval_only, sets
// c.eval_only (and g.sample 0 unless given), and makes c.make_model load run.init_weights into
// every replica's GPT.
void configure_weights(GptSettings& g, const GptRun& run, TrainerConfig& c) {
  const std::string export_ = g.name_of("export_files"), init_from = g.name_of("init_from");
  DITTO_CHECK(g.export_files.size() % 2 == 0, export_, ": expected FORMAT FILE, got ",
              g.export_files.size(), " values");
  std::set<std::string> targets;
  for (std::size_t i = 0; i < g.export_files.size(); i += 2) {
    const std::string& format = g.export_files[i];
    const std::string& file = g.export_files[i + 1];
    DITTO_CHECK(format == "llmc" || format == "llmc-bf16" || format == "hf", export_,
                ": expected a format llmc, llmc-bf16 or hf, got '", format, "'");
    DITTO_CHECK(g.bias, export_, " ", format,
                ": expected a GPT with biases (llm.c's and Hugging "
                "Face's GPT-2 have every bias: ",
                g.name_of("bias"), ", or ", init_from,
                " a "
                "GPT-2 file), got bias=False");
    DITTO_CHECK(!file.empty(), export_, ": expected a file name, got ''");
    DITTO_CHECK(!c.dry_run, export_,
                ": expected a run that trains (a dry run holds no tensor "
                "data: the file would be zeros), got ",
                c.name_of("dry_run"));
    DITTO_CHECK(targets.insert(io::same_file_key(file)).second, export_,
                ": expected a different file for each ", export_, ", got '", file, "' twice");
  }
  // Not over a file the run reads (each of a --data list or glob, a validation file, init_from)
  // nor inside a checkpoint directory, by identity where the files exist.
  const RunInputs in = gpt_inputs(g, run, c);
  const std::vector<io::NamedPath> outputs = gpt_exports(g);
  io::check_outputs_are_not_inputs(outputs, in.files, in.dirs);
  for (const auto& [what, file] : outputs) io::check_replaceable_output(file, what);
  DITTO_CHECK(!g.eval_only || !g.init_from.empty() || !c.resume_dir.empty(), g.name_of("eval_only"),
              ": expected a model to evaluate, ", init_from, " FILE or ", c.name_of("resume_dir"),
              " DIR, got neither (it would evaluate a randomly "
              "initialised model)");
  c.eval_only = g.eval_only;
  if (g.eval_only) {
    c.field_names["eval_only"] = g.name_of("eval_only");
    if (!g.given.count("sample")) g.sample = 0;  // nanoGPT's eval_only samples nothing
  }
  if (!run.init_weights) return;
  const ModelFactory base = c.make_model;
  const bool dry = c.dry_run;
  c.make_model = [base, weights = run.init_weights, dry](const Device& d) {
    std::unique_ptr<nn::Module> m = base(d);
    if (!dry) io::load_gpt_params(*m, *weights);  // a dry run holds no tensor data
    return m;
  };
}

void export_gpt(const GptSettings& g, Replica& rep, const nn::GPTConfig& m,
                const std::function<void(const std::string& file, const char* what)>& written) {
  if (g.export_files.empty()) return;
  const auto params = io::gpt_params_f32(rep.model());
  // Each file is tried: one that cannot be written (a full disk) does not cost the others.
  std::vector<std::exception_ptr> failed;
  std::string messages;
  for (std::size_t i = 0; i + 1 < g.export_files.size(); i += 2) {
    const std::string& format = g.export_files[i];
    const std::string& file = g.export_files[i + 1];
    try {
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
      if (written) written(file, what);
    } catch (const std::exception& e) {
      failed.push_back(std::current_exception());
      messages += detail::cat(messages.empty() ? "" : "; ", e.what());
    }
  }
  if (failed.size() == 1) std::rethrow_exception(failed.front());
  if (!failed.empty()) throw Error(messages);
}

}  // namespace ditto::train
