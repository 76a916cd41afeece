// libFuzzer target: a checkpoint directory (core/checkpoint/checkpoint.h) read back:
// read_checkpoint, read_latest_checkpoint, resume_checkpoint into a model and optimizer, and a
// Trainer resumed from it (core/train/trainer.cpp: Trainer::resume and the loop that continues at
// the saved step, epoch and batch).
//
// Input: one flags byte, then up to four files separated by kSep: trainer.json,
// model.safetensors, optimizer.safetensors, latest (a part left out: that file is missing).
// Flags: bit 0: the harness rewrites trainer.json's "crc32" to match (when it is a JSON object
// nested less than 64 deep), bit 1: it rewrites each safetensors file's "ditto.crc32" to match
// and its "ditto.step" to trainer.json's step (when the file parses); without them almost every
// mutation would stop at a checksum or at the files' steps that differ. bit 2:
// resume_checkpoint into a 2-3-2 MLP and SGD (with the config the checkpoint records); bit 3: a
// Trainer run resumed from it (the model, data and settings of make_config: corpus/checkpoint/
// comes from a run of that Trainer). Every input also goes through read_checkpoint and
// read_latest_checkpoint.
// DITTO_FUZZ_MAKE_SEEDS=DIR: write the seed inputs to DIR (from a real Trainer run) and exit.
// A ditto::Error is the expected refusal; any other exception or a crash is a finding.
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "core/base/error.h"
#include "core/checkpoint/checkpoint.h"
#include "core/data/data_source.h"
#include "core/io/file.h"
#include "core/io/safetensors.h"
#include "core/nn/sequential.h"
#include "core/optim/sgd.h"
#include "core/runtime/backend.h"
#include "core/train/trainer.h"
#include "tools/fuzz/fuzz_util.h"

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kSep = "\n--8<--\n";
const char* const kFiles[] = {"trainer.json", "model.safetensors", "optimizer.safetensors"};

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}
std::uint32_t crc_of(std::string_view s) {
  return static_cast<std::uint32_t>(
      ::crc32(0L, reinterpret_cast<const Bytef*>(s.data()), static_cast<uInt>(s.size())));
}

// trainer.json with its "crc32" made to match (as save_checkpoint computes it), or as it is.
std::string fix_trainer_crc(std::string_view text) {
  int max_depth = 0;
  nlohmann::json j = nlohmann::json::parse(
      text.begin(), text.end(),
      [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
        max_depth = std::max(max_depth, depth);
        return true;
      },
      /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || max_depth >= 64) return std::string(text);
  j.erase("crc32");
  const std::string body = j.dump();
  j["crc32"] = hex32(crc_of(body));
  return j.dump(1);
}

// trainer.json's "step" as written (a number), or "" (none: the files keep theirs).
std::string trainer_step(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer())
    return "";
  return j["step"].dump();
}

// A safetensors file with its "ditto.crc32" made to match its tensors and its "ditto.step" set
// to `step` (unless empty), or as it is.
std::string fix_tensors_crc(std::string_view bytes, const std::string& step) {
  try {
    ditto::io::SafetensorsData d = ditto::io::safetensors_parse(bytes, "fix");
    if (!d.metadata.count("ditto.crc32")) return std::string(bytes);
    if (!step.empty()) d.metadata["ditto.step"] = step;
    std::uint32_t crc = static_cast<std::uint32_t>(::crc32(0L, Z_NULL, 0));
    for (const auto& [name, t] : d.tensors)
      crc = static_cast<std::uint32_t>(
          ::crc32(crc, static_cast<const Bytef*>(t.data_ptr()), static_cast<uInt>(t.nbytes())));
    d.metadata["ditto.crc32"] = hex32(crc);
    return ditto::io::safetensors_serialize(d.tensors, d.metadata);
  } catch (const ditto::Error&) {
    return std::string(bytes);
  }
}

std::shared_ptr<ditto::train::DataSource> make_data() {
  ditto::data::Dataset d;
  d.features = ditto::Tensor::from_vector(
      std::vector<float>{0, 1, 1, 0, 2, 1, 1, 2, 0, 0, 3, 1, 1, 3, 2, 2}, {8, 2});
  d.labels = ditto::Tensor::from_vector(std::vector<std::int64_t>{0, 1, 0, 1, 0, 1, 0, 1}, {8});
  return std::make_shared<ditto::train::DatasetSource>(d, ditto::data::Dataset{}, 5,
                                                       /*shuffle=*/true);
}

ditto::train::TrainerConfig make_config() {
  ditto::train::TrainerConfig c;
  c.devices = 1;
  c.hidden = {3};
  c.batch_size = 4;
  c.epochs = 3;
  c.seed = 7;
  return c;
}

void make_seeds(const std::string& out) {
  const std::string dir = ditto_fuzz::scratch_dir() + "/seedrun";
  ditto::train::TrainerConfig c = make_config();
  c.epochs = 2;
  c.checkpoint_dir = dir;
  c.checkpoint_every = 3;  // step 3 is mid-epoch (2 batches per epoch), step 4 at the end
  (void)ditto::train::Trainer(c, make_data()).fit();
  fs::create_directories(out);
  int n = 0;
  for (const char* step : {"step-00000003", "step-00000004"}) {
    std::string parts[3];
    for (int i = 0; i < 3; ++i) parts[i] = ditto::io::read_file(dir + "/" + step + "/" + kFiles[i]);
    const std::string body = parts[0] + std::string(kSep) + parts[1] + std::string(kSep) +
                             parts[2] + std::string(kSep) + step + "\n";
    for (unsigned flags : {0x0fu, 0x00u, 0x07u})
      ditto_fuzz::write_bytes(out + "/seed-" + std::to_string(n++),
                              std::string(1, char(flags)) + body);
    // Truncated: trainer.json cut in half; model.safetensors cut in half.
    ditto_fuzz::write_bytes(out + "/seed-" + std::to_string(n++),
                            std::string(1, char(0x0f)) + parts[0].substr(0, parts[0].size() / 2));
    ditto_fuzz::write_bytes(out + "/seed-" + std::to_string(n++),
                            std::string(1, char(0x0f)) + parts[0] + std::string(kSep) +
                                parts[1].substr(0, parts[1].size() / 2));
  }
  std::printf("fuzz_checkpoint: wrote %d seeds to %s\n", n, out.c_str());
}

// DITTO_FUZZ_VERBOSE=1: print each refusal (to see how far an input gets).
void refused(const char* what, const ditto::Error& e) {
  static const bool verbose = std::getenv("DITTO_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "fuzz_checkpoint: %s: %s\n", what, e.what());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ditto::BackendOptions o;
  o.device_count = 1;
  ditto::init_backend("sim", o);
  if (const char* out = std::getenv("DITTO_FUZZ_MAKE_SEEDS")) {
    make_seeds(out);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const unsigned flags = data[0];
  const std::vector<std::string_view> parts =
      ditto_fuzz::split(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), kSep);
  const std::string dir = ditto_fuzz::scratch_dir() + "/ckpt";
  const std::string step_dir = dir + "/step-00000003";
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(step_dir);
  std::string step;
  for (std::size_t i = 0; i < parts.size() && i < 3; ++i) {
    std::string bytes(parts[i]);
    if (i == 0 && (flags & 1)) bytes = fix_trainer_crc(bytes);
    if (i == 0 && (flags & 2)) step = trainer_step(bytes);
    if (i > 0 && (flags & 2)) bytes = fix_tensors_crc(bytes, step);
    ditto_fuzz::write_bytes(step_dir + "/" + kFiles[i], bytes);
  }
  if (parts.size() > 3) ditto_fuzz::write_bytes(dir + "/latest", parts[3]);
  std::ostringstream log;
  bool readable = false;
  std::map<std::string, std::string> config;
  try {
    ditto::Checkpoint c = ditto::read_checkpoint(step_dir);
    readable = true;
    config = c.state.config;
    if (c.state.step < 0 || c.state.epoch < 0 || c.state.batch < 0) std::abort();
  } catch (const ditto::Error& e) {
    refused("read_checkpoint", e);
  }
  try {
    (void)ditto::read_latest_checkpoint(dir, log);
  } catch (const ditto::Error& e) {
    refused("read_latest_checkpoint", e);
  }
  if (readable && (flags & 4)) {
    try {
      auto model = ditto::nn::mlp({2, 3, 2}, ditto::Device("sim", 0), 1);
      // The Trainer's MLP and SGD (make_config); the config the checkpoint records, so that
      // the parameter and optimizer checks and the load are reached.
      ditto::optim::SGD opt(model->parameters(), {.lr = 0.05f, .momentum = 0.9f});
      (void)ditto::resume_checkpoint(dir, *model, opt, config, {}, log);
    } catch (const ditto::Error& e) {
      refused("resume_checkpoint", e);
    }
  }
  if (readable && (flags & 8)) {
    try {
      ditto::train::TrainerConfig c = make_config();
      c.resume_dir = dir;
      c.log = &log;
      (void)ditto::train::Trainer(c, make_data()).fit();
    } catch (const ditto::Error& e) {
      refused("Trainer::fit", e);
    }
  }
  return 0;
}
