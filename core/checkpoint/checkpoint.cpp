// Checkpoints: save, verify, fall back, resume (Note [Checkpoint layout] in
// core/checkpoint/checkpoint.h).
#include "core/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <system_error>

#include "core/base/error.h"
#include "core/io/crc32.h"
#include "core/io/file.h"
#include "core/io/safetensors.h"
#include "core/numerics/random.h"

namespace ditto {

std::string checkpoint_step_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

namespace fs = std::filesystem;
using ::ditto::detail::cat;

namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kTrainerFile = "trainer.json";
constexpr const char* kFormat = "ditto-checkpoint";
// Version 2 (Note [Checkpoint layout]): trainer.json records the CRC-32 of each safetensors
// file's header. Version 1 checkpoints (without) still load: their tensor bytes are checked,
// their headers cannot be.
constexpr int kVersion = 2;
constexpr int kOldestVersion = 1;

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

// CRC-32 of the tensors' bytes in order: of the safetensors buffer when the order is the file's.
std::uint32_t tensors_crc(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::uint32_t crc = static_cast<std::uint32_t>(::crc32(0L, Z_NULL, 0));
  for (const auto& [name, t] : tensors) crc = io::crc32_update(crc, t.data_ptr(), t.nbytes());
  return crc;
}

// The step of a "step-N" name, or -1.
std::int64_t parse_step_name(const std::string& name) {
  if (name.size() < 6 || name.compare(0, 5, "step-") != 0 || name.size() > 5 + 18) return -1;
  std::int64_t v = 0;
  for (std::size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

// The safetensors header of `bytes` (the 8-byte length and the JSON), as far as it goes.
std::uint64_t header_length(std::string_view bytes) {  // the first 8 bytes, little-endian
  std::uint64_t n = 0;
  for (int b = 0; b < 8 && b < static_cast<int>(bytes.size()); ++b)
    n |= std::uint64_t(static_cast<unsigned char>(bytes[static_cast<std::size_t>(b)])) << (8 * b);
  return n;
}

std::string_view header_of(std::string_view bytes) {
  if (bytes.size() < 8) return bytes;
  const std::uint64_t n = header_length(bytes);
  return bytes.substr(0, static_cast<std::size_t>(std::min<std::uint64_t>(8 + n, bytes.size())));
}

// Write a safetensors file whose metadata records the step and the CRC-32 of its tensor bytes;
// returns the CRC-32 of its header (trainer.json records it: a header cannot hold its own).
std::string write_tensors(const std::string& path,
                          std::vector<std::pair<std::string, Tensor>> tensors,
                          std::map<std::string, std::string> metadata, std::int64_t step) {
  for (auto& [name, t] : tensors)
    if (!t.device().is_cpu()) t = t.to(Device::cpu());
  metadata["ditto.format"] = kFormat;
  metadata["ditto.step"] = std::to_string(step);
  metadata["ditto.crc32"] = hex32(tensors_crc(tensors));
  const std::string bytes = io::safetensors_serialize(tensors, metadata);
  const std::string_view header = header_of(bytes);
  io::write_file_replace(path, bytes);  // never through a link (Note [Checkpoint layout])
  return hex32(io::crc32_update(0, header.data(), header.size()));
}

// The CRC-32 of the safetensors header of the file `path` (read again: the length and the JSON,
// bounded as load_safetensors bounds them).
std::string header_crc(const std::string& path) {
  io::InputFile in(path, std::numeric_limits<std::uint64_t>::max(), "read_checkpoint");
  std::string bytes;
  in.read(bytes, std::min<std::uint64_t>(8, in.size()));
  const std::uint64_t n = header_length(bytes);
  if (bytes.size() < 8 || n > io::kMaxSafetensorsHeaderBytes || n > in.size() - 8)
    throw ParseError(cat(path, ": the safetensors header's length is out of the file"));
  in.read(bytes, n);
  return hex32(io::crc32_update(0, bytes.data(), bytes.size()));
}

// Read a safetensors file of a checkpoint and verify its CRC-32s (of the header when trainer.json
// records it: `header_crc32` not empty) and step.
io::SafetensorsData read_tensors(const std::string& path, std::int64_t step,
                                 const std::string& want_header_crc) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw ParseError(cat(path, ": missing (an incomplete checkpoint)"));
  io::SafetensorsData d = io::load_safetensors(path);
  auto get = [&](const char* key) {
    auto it = d.metadata.find(key);
    if (it == d.metadata.end())
      throw ParseError(
          cat(path, ": __metadata__: missing '", key, "' (not a file of a ditto checkpoint)"));
    return it->second;
  };
  get("ditto.crc32");  // missing: not a checkpoint's file
  verify_checkpoint_crc(path, d);
  // The header's own bytes (dtypes, shapes, offsets, metadata): the data's CRC cannot see an
  // edit such as F32 -> I32 that keeps every size.
  if (!want_header_crc.empty()) {
    std::string crc;
    try {
      crc = header_crc(path);
    } catch (const Error& e) {
      throw ParseError(e.what());
    }
    if (crc != want_header_crc)
      throw ParseError(cat(path, ": checksum mismatch: the safetensors header has CRC-32 ", crc,
                           ", trainer.json records ", want_header_crc,
                           " (damaged or edited "
                           "file)"));
  }
  if (get("ditto.step") != std::to_string(step))
    throw ParseError(cat(path, ": __metadata__: ditto.step: expected ", step,
                         " (trainer.json's step), got ", get("ditto.step")));
  return d;
}

}  // namespace

bool verify_checkpoint_crc(const std::string& path, const io::SafetensorsData& d) {
  auto it = d.metadata.find("ditto.crc32");
  if (it == d.metadata.end()) return false;
  const std::string crc = hex32(tensors_crc(d.tensors));
  if (it->second != crc)
    throw ParseError(cat(path, ": checksum mismatch: the tensor data has CRC-32 ", crc,
                         ", the file records ", it->second, " (damaged file)"));
  return true;
}

namespace {

nlohmann::json state_to_json(const TrainerState& s) {
  nlohmann::json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["step"] = s.step;
  j["epoch"] = s.epoch;
  j["batch"] = s.batch;
  j["seed"] = s.seed;
  j["epoch_loss_sum"] = optim::exact_str(s.epoch_loss_sum);  // a string: also NaN and inf
  j["epoch_samples"] = s.epoch_samples;
  j["train_loss"] = optim::exact_str(s.train_loss);
  // The random state: ditto's generator is counter-based (Note [Random streams]), so the seed and
  // the stream of the next epoch's shuffle are all there is to it.
  j["rng"] = {{"generator", "philox4x32-10"},
              {"seed", s.seed},
              {"shuffle_stream", stream_id(kStreamShuffle, static_cast<std::uint64_t>(s.epoch))}};
  j["config"] = s.config;
  return j;
}

TrainerState state_from_json(const nlohmann::json& j, const std::string& path) {
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!j.contains(key)) throw ParseError(cat(path, ": missing field '", key, "'"));
    return j.at(key);
  };
  // Counts at most 2^53 (exact as a JSON number in any reader), far below 2^63: a step of
  // 2^63 - 1 made the resumed run's TrainerState::advance overflow (++step, UBSan), an
  // epoch_samples of 2^63 - 1 the epoch's sample count, and 2^64 - 1 was read as -1.
  constexpr std::uint64_t kMaxCount = std::uint64_t(1) << 53;
  auto integer = [&](const char* key) {
    const nlohmann::json& v = field(key);
    if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<std::int64_t>() < 0) ||
        v.get<std::uint64_t>() > kMaxCount)
      throw ParseError(cat(path, ": ", key, ": expected an integer in [0, 2^53], got ", v.dump()));
    return v.get<std::int64_t>();
  };
  const nlohmann::json& version = field("version");
  if (field("format") != kFormat || !version.is_number_integer() ||
      version.get<std::int64_t>() < kOldestVersion || version.get<std::int64_t>() > kVersion)
    throw ParseError(cat(path, ": expected format '", kFormat, "' version ", kOldestVersion, "..",
                         kVersion, ", got ", field("format").dump(), " version ", version.dump()));
  TrainerState s;
  s.step = integer("step");
  s.epoch = integer("epoch");
  s.batch = integer("batch");
  s.epoch_samples = integer("epoch_samples");
  if (!field("seed").is_number_unsigned())
    throw ParseError(cat(path, ": seed: expected an unsigned integer, got ", field("seed").dump()));
  s.seed = field("seed").get<std::uint64_t>();
  if (!field("epoch_loss_sum").is_string())
    throw ParseError(cat(path, ": epoch_loss_sum: expected a number as a string"));
  s.epoch_loss_sum = std::strtod(field("epoch_loss_sum").get<std::string>().c_str(), nullptr);
  // Optional: checkpoints written before it was recorded hold none (NaN: unknown).
  s.train_loss = std::numeric_limits<double>::quiet_NaN();
  if (j.contains("train_loss")) {
    if (!j.at("train_loss").is_string())
      throw ParseError(cat(path, ": train_loss: expected a number as a string"));
    s.train_loss = std::strtod(j.at("train_loss").get<std::string>().c_str(), nullptr);
  }
  const nlohmann::json& c = field("config");
  if (!c.is_object()) throw ParseError(cat(path, ": config: expected an object of strings"));
  for (auto it = c.begin(); it != c.end(); ++it) {
    if (!it.value().is_string())
      throw ParseError(cat(path, ": config: ", it.key(), ": expected a string"));
    s.config[it.key()] = it.value().get<std::string>();
  }
  return s;
}

// Note [Crash test]: DITTO_TEST_KILL_IN_CHECKPOINT=n makes the n-th save_checkpoint of the
// process SIGKILL itself halfway through writing model.safetensors, for the test that a run
// killed while writing a checkpoint resumes from the previous one (tests/CMakeLists.txt).
// The checkpoint directories this process holds the lock of (lock_checkpoint_dir), by canonical
// path; the descriptors stay open until the process exits.
std::mutex& locks_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, int>& held_locks() {
  static std::map<std::string, int> held;
  return held;
}

int kill_at_save() {
  static const int n = [] {
    const char* v = std::getenv("DITTO_TEST_KILL_IN_CHECKPOINT");
    return v ? std::atoi(v) : 0;
  }();
  return n;
}

}  // namespace

void lock_checkpoint_dir(const std::string& dir) {
  const char* call = "checkpoint";
  std::error_code ec;
  const std::string key = fs::weakly_canonical(dir, ec).string();
  const std::string path = dir + "/lock";
  std::lock_guard lk(locks_mutex());
  auto held = held_locks().find(ec ? dir : key);
  if (held != held_locks().end()) {
    // Still the same lock file (not one of a directory removed and made again)?
    struct stat mine {
    }, now{};
    if (::fstat(held->second, &mine) == 0 && ::lstat(path.c_str(), &now) == 0 &&
        mine.st_dev == now.st_dev && mine.st_ino == now.st_ino)
      return;
    ::close(held->second);
    held_locks().erase(held);
  }
  // O_NOFOLLOW: a symbolic link planted at DIR/lock must not get the pid written into its target.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0 && errno == ELOOP)
    throw Error(cat(call, ": the lock file '", path,
                    "' is a symbolic link; ditto creates a "
                    "plain file there and never writes through a link: remove the link"));
  if (fd < 0)
    throw Error(cat(call, ": cannot create the lock file '", path, "': ", std::strerror(errno)));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    std::string pid(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    if (err != EWOULDBLOCK)
      throw Error(cat(call, ": cannot lock '", path, "': ", std::strerror(err)));
    throw Error(cat(call, ": checkpoint directory '", dir, "' is in use: its lock '", path,
                    "' is held by ",
                    pid.empty() ? std::string("another process") : "process " + pid,
                    " (another run writing the same directory); give this run another "
                    "directory, or wait until that one ends"));
  }
  const std::string me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) < 0) {
    const int err = errno;
    ::close(fd);
    throw Error(cat(call, ": cannot write the lock file '", path, "': ", std::strerror(err)));
  }
  held_locks()[ec ? dir : key] = fd;  // held until the process exits
}

std::string save_checkpoint(const std::string& dir, nn::Module& model, const optim::Optimizer& opt,
                            const TrainerState& state, int keep, const ParamAliases& aliases) {
  const char* call = "save_checkpoint";
  DITTO_CHECK(keep >= 1, call, ": keep: expected >= 1, got ", keep);
  std::vector<std::pair<std::string, Tensor>> params;
  for (nn::Parameter* p : model.parameters()) params.emplace_back(p->name, p->data);
  std::string alias_list;  // "alias=name,..." (Note [Checkpoint layout])
  const std::size_t n_params = params.size();
  for (const auto& [alias, of] : aliases) {
    auto named = [&](const std::string& n) {
      return std::find_if(params.begin(), params.begin() + static_cast<std::ptrdiff_t>(n_params),
                          [&](const auto& e) { return e.first == n; });
    };
    auto it = named(of);
    DITTO_CHECK(it != params.begin() + static_cast<std::ptrdiff_t>(n_params), call, ": aliases: '",
                alias, "' names '", of, "', expected a parameter of the model");
    DITTO_CHECK(named(alias) == params.begin() + static_cast<std::ptrdiff_t>(n_params) &&
                    alias.find_first_of("=,") == std::string::npos,
                call, ": aliases: expected a new name without '=' or ',', got '", alias, "'");
    params.emplace_back(alias, it->second);
    alias_list += (alias_list.empty() ? "" : ",") + alias + "=" + of;
  }
  DITTO_CHECK(state.step >= 0 && state.epoch >= 0 && state.batch >= 0 && state.epoch_samples >= 0,
              call, ": state: expected non-negative step, epoch, batch and epoch_samples, got ",
              state.step, ", ", state.epoch, ", ", state.batch, ", ", state.epoch_samples);
  static std::atomic<int> saves{0};
  const bool crash = ++saves == kill_at_save();

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(cat(call, ": cannot create directory '", dir, "': ", ec.message()));
  lock_checkpoint_dir(dir);
  const std::string name = checkpoint_step_name(state.step);
  const std::string final_path = dir + "/" + name, tmp_path = final_path + ".tmp";
  fs::remove_all(tmp_path, ec);  // a stray one from a crashed attempt
  if (!fs::create_directory(tmp_path, ec) || ec)
    throw Error(cat(call, ": cannot create directory '", tmp_path, "': ", ec.message()));

  if (crash)
    io::set_write_hook_for_testing(
        [](const std::string&, std::size_t, std::size_t) { std::raise(SIGKILL); });
  // A failed write (a full disk, EFBIG under `ulimit -f`) removes the temporary directory: no
  // stray step-N.tmp is left behind (the next save would remove it, but a run may not come).
  try {
    std::map<std::string, std::string> model_meta;
    if (!alias_list.empty()) model_meta["ditto.aliases"] = alias_list;
    nlohmann::json headers;  // trainer.json's CRC-32 of each file's header (version 2)
    headers[kModelFile] =
        write_tensors(tmp_path + "/" + kModelFile, std::move(params), model_meta, state.step);
    optim::OptimizerState os = opt.state_dict();
    std::map<std::string, std::string> meta{{"optimizer.type", os.type}};
    for (const auto& [k, v] : os.options) meta["optimizer." + k] = v;
    headers[kOptimizerFile] =
        write_tensors(tmp_path + "/" + kOptimizerFile, std::move(os.tensors), meta, state.step);
    nlohmann::json j = state_to_json(state);
    j["header_crc32"] = headers;
    j["crc32"] = hex32(io::crc32_update(0, j.dump().data(), j.dump().size()));  // of the rest
    io::write_file_replace(tmp_path + "/" + kTrainerFile, j.dump(1) + "\n");
  } catch (...) {
    fs::remove_all(tmp_path, ec);
    throw;
  }

  // Publish: rename the complete directory, then point `latest` at it.
  fs::remove_all(final_path, ec);  // the same step saved again (a run resumed and re-saved)
  fs::rename(tmp_path, final_path, ec);
  if (ec)
    throw Error(
        cat(call, ": cannot rename '", tmp_path, "' to '", final_path, "': ", ec.message()));
  io::fsync_dir(dir);
  io::write_file_replace(dir + "/latest", name + "\n");  // a link there is replaced

  // Keep the `keep` newest complete checkpoints; drop older ones and stray temporaries.
  std::vector<std::pair<std::int64_t, fs::path>> steps;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory()) continue;
    if (n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0 &&
        parse_step_name(n.substr(0, n.size() - 4)) >= 0)
      fs::remove_all(e.path(), ec);
    else if (parse_step_name(n) >= 0)
      steps.emplace_back(parse_step_name(n), e.path());
  }
  std::sort(steps.begin(), steps.end());
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < steps.size(); ++i) {
    if (steps[i].second.filename() == name) continue;
    fs::remove_all(steps[i].second, ec);
    if (ec)  // the new checkpoint is complete; the disk keeps filling: say so
      std::cerr << "ditto: " << call << ": warning: cannot remove the old checkpoint '"
                << steps[i].second.string() << "' (keeping the " << keep
                << " newest): " << ec.message() << "\n";
  }
  return final_path;
}

namespace {

// Remove the aliases listed in `meta` ("ditto.aliases") from `params`, each checked to hold its
// parameter's bits (Note [Checkpoint layout]).
void drop_aliases(const std::string& path, const std::map<std::string, std::string>& meta,
                  std::vector<std::pair<std::string, Tensor>>& params) {
  auto it = meta.find("ditto.aliases");
  if (it == meta.end()) return;
  std::size_t pos = 0;
  const std::string& list = it->second;
  while (pos < list.size()) {
    std::size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(pos, end - pos);
    pos = end + 1;
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos)
      throw ParseError(
          cat(path, ": __metadata__: ditto.aliases: expected alias=name, got '", item, "'"));
    const std::string alias = item.substr(0, eq), of = item.substr(eq + 1);
    auto find = [&](const std::string& n) {
      return std::find_if(params.begin(), params.end(),
                          [&](const auto& e) { return e.first == n; });
    };
    auto a = find(alias), p = find(of);
    if (a == params.end() || p == params.end() || a->second.shape() != p->second.shape() ||
        a->second.dtype() != p->second.dtype() || a->second.nbytes() != p->second.nbytes() ||
        std::memcmp(a->second.data_ptr(), p->second.data_ptr(), a->second.nbytes()) != 0)
      throw ParseError(cat(path, ": alias '", alias, "' of '", of,
                           "': expected both tensors, with the same bits (damaged file)"));
    params.erase(a);
  }
}

}  // namespace

Checkpoint read_checkpoint(const std::string& path) {
  const std::string tpath = path + "/" + kTrainerFile;
  std::string text;
  try {
    text = io::read_file(tpath, io::kMaxJsonBytes, "read_checkpoint");
  } catch (const Error& e) {
    throw ParseError(cat(tpath, ": missing or unreadable (an incomplete checkpoint): ", e.what()));
  }
  // The nesting is bounded before anything walks the value: dump() (the CRC below, messages)
  // recurses once per level, so a trainer.json nested 100,000 deep overflowed the stack
  // (SIGSEGV instead of a ParseError; reproduced with tools/fuzz/fuzz_checkpoint). A
  // checkpoint's trainer.json is 2 deep.
  constexpr int kMaxDepth = 64;
  int depth = 0;
  nlohmann::json j = nlohmann::json::parse(
      text,
      [&](int d, nlohmann::json::parse_event_t, nlohmann::json&) {
        depth = std::max(depth, d);
        return true;
      },
      /*allow_exceptions=*/false);
  if (depth > kMaxDepth)
    throw ParseError(cat(tpath, ": JSON nested ", depth, " levels deep, expected at most ",
                         kMaxDepth, " (damaged file)"));
  if (j.is_discarded() || !j.is_object())
    throw ParseError(cat(tpath, ": not a well-formed JSON object (damaged or truncated file)"));
  if (!j.contains("crc32") || !j["crc32"].is_string())
    throw ParseError(cat(tpath, ": missing field 'crc32'"));
  const std::string saved = j["crc32"].get<std::string>();
  j.erase("crc32");
  const std::string body = j.dump();
  const std::string crc = hex32(io::crc32_update(0, body.data(), body.size()));
  if (crc != saved)
    throw ParseError(cat(tpath, ": checksum mismatch: the content has CRC-32 ", crc,
                         ", the file records ", saved, " (damaged file)"));
  Checkpoint c;
  c.path = path;
  c.state = state_from_json(j, tpath);
  // Version 2: the CRC-32 of each safetensors header; version 1 recorded none.
  auto want_header = [&](const char* file) -> std::string {
    if (j.at("version").get<std::int64_t>() < 2) return "";
    const auto h = j.find("header_crc32");
    if (h == j.end() || !h->is_object() || !h->contains(file) || !h->at(file).is_string())
      throw ParseError(cat(tpath, ": header_crc32: expected the CRC-32 of ", file,
                           "'s header "
                           "(version 2)"));
    return h->at(file).get<std::string>();
  };
  const std::string mpath = path + "/" + kModelFile;
  io::SafetensorsData model = read_tensors(mpath, c.state.step, want_header(kModelFile));
  c.params = std::move(model.tensors);
  drop_aliases(mpath, model.metadata, c.params);
  const std::string opath = path + "/" + kOptimizerFile;
  io::SafetensorsData opt = read_tensors(opath, c.state.step, want_header(kOptimizerFile));
  for (const auto& [k, v] : opt.metadata) {
    if (k == "optimizer.type")
      c.optimizer.type = v;
    else if (k.compare(0, 10, "optimizer.") == 0)
      c.optimizer.options[k.substr(10)] = v;
  }
  if (c.optimizer.type.empty())
    throw ParseError(cat(opath, ": __metadata__: missing 'optimizer.type'"));
  c.optimizer.tensors = std::move(opt.tensors);
  return c;
}

std::string pytorch_file_hint(const std::string& path) {
  unsigned char m[4] = {};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return "";
  struct stat st {};
  ssize_t got = -1;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) got = ::read(fd, m, sizeof m);
  ::close(fd);
  const bool zip = got == 4 && std::memcmp(m, "PK\x03\x04", 4) == 0;
  const bool legacy = got >= 2 && m[0] == 0x80 && m[1] == 0x02;
  if (!zip && !legacy) return "";
  return cat(
      "'", path, "' is a PyTorch file (torch.save's ",
      zip ? "zip archive" : "legacy pickle, torch < 1.6",
      ", as nanoGPT's ckpt.pt), which ditto does not read: convert its model with "
      "`/usr/bin/python3 tools/nanogpt_to_safetensors.py ",
      path,
      " model.safetensors` (needs torch) and start from it with --init-from "
      "model.safetensors (its parameters only: nanoGPT's optimizer state and iter_num do not "
      "come over; docs/llmc_nanogpt.md)");
}

Checkpoint read_latest_checkpoint(const std::string& dir, std::ostream& log) {
  const char* call = "resume";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) == 0) {  // a file given where the directory was meant
      const std::string torch = pytorch_file_hint(dir);
      throw Error(cat(call, ": checkpoint directory '", dir, "' is ",
                      io::file_type_name(st.st_mode),
                      ", expected a directory of checkpoints (the directory a run's checkpoints "
                      "were saved in: DIR/latest, DIR/step-N)",
                      torch.empty() ? "" : "; " + torch));
    }
    throw Error(cat(call, ": checkpoint directory '", dir, "' does not exist"));
  }
  // One checkpoint, DIR/step-N (as --init-from takes it, and as Lightning's ckpt_path names one
  // checkpoint): exactly that step, no fallback (it was asked for).
  fs::path named = fs::path(dir).lexically_normal();
  if (named.filename().empty()) named = named.parent_path();  // "ck/step-N/"
  if (parse_step_name(named.filename().string()) >= 0 &&
      fs::exists(fs::path(dir) / kTrainerFile, ec)) {
    try {
      return read_checkpoint(dir);
    } catch (const ParseError& e) {
      throw Error(cat(call, ": checkpoint '", dir, "' is unusable: ", e.what(),
                      " (to fall back to an older one, pass its directory '",
                      named.parent_path().string(), "')"));
    }
  }
  std::vector<std::int64_t> steps;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
    if (e.is_directory() && parse_step_name(e.path().filename().string()) >= 0)
      steps.push_back(parse_step_name(e.path().filename().string()));
  std::sort(steps.rbegin(), steps.rend());
  // nanoGPT's out_dir (train.py writes out_dir/ckpt.pt): not a ditto checkpoint; say what it is.
  if (steps.empty())
    if (const std::string torch = pytorch_file_hint(dir + "/ckpt.pt"); !torch.empty())
      throw Error(cat(call, ": '", dir,
                      "' holds no ditto checkpoint (no step-N directory) but nanoGPT's: ", torch,
                      "; --resume takes only the checkpoints of ditto's --checkpoint DIR"));
  // DIR/latest first (when it names one), then the newest down.
  // DIR/latest is a plain file ditto writes; a symbolic link there (not ditto's) is ignored, as a
  // damaged DIR/latest is: the step directories are tried from the newest down.
  std::string latest;
  struct stat lst {};
  const bool link = ::lstat((dir + "/latest").c_str(), &lst) == 0 && S_ISLNK(lst.st_mode);
  if (!link) {
    try {
      latest = io::read_file(dir + "/latest", 4096, "resume");
      while (!latest.empty() && (latest.back() == '\n' || latest.back() == ' ')) latest.pop_back();
    } catch (const Error&) {
      latest.clear();
    }
  }
  const std::int64_t latest_step = parse_step_name(latest);
  if (latest_step < 0) {
    log << "ditto: " << call << ": '" << dir << "/latest' is "
        << (link ? "a symbolic link, not the file ditto writes (ignored)" : "missing or damaged")
        << "; trying the checkpoints in '" << dir << "' from the newest down\n";
  } else {
    auto it = std::find(steps.begin(), steps.end(), latest_step);
    if (it != steps.end()) steps.erase(it);
    steps.insert(steps.begin(), latest_step);
  }
  std::string reasons;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const std::string path = dir + "/" + checkpoint_step_name(steps[i]);
    try {
      return read_checkpoint(path);
    } catch (const ParseError& e) {
      reasons += cat("\n  ", e.what());
      log << "ditto: " << call << ": checkpoint '" << path << "' is unusable: " << e.what()
          << (i + 1 < steps.size()
                  ? "; falling back to '" + dir + "/" + checkpoint_step_name(steps[i + 1]) + "'"
                  : std::string("; no older checkpoint left"))
          << "\n";
    }
  }
  throw Error(cat(call, ": no usable checkpoint in '", dir, "'",
                  steps.empty() ? std::string(" (no step-N directory)") : ":" + reasons));
}

namespace {

// "gpt(n_layer=1,dropout=0)" -> {"gpt", {{"n_layer", "1"}, {"dropout", "0"}}}; false when
// `v` is not of that form.
bool split_fields(const std::string& v, std::string& head,
                  std::vector<std::pair<std::string, std::string>>& fields) {
  const std::size_t open = v.find('(');
  if (open == std::string::npos || v.empty() || v.back() != ')') return false;
  head = v.substr(0, open);
  std::size_t pos = open + 1;
  while (pos < v.size() - 1) {
    std::size_t end = v.find(',', pos);
    if (end == std::string::npos || end > v.size() - 1) end = v.size() - 1;
    const std::string item = v.substr(pos, end - pos);
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos) return false;
    fields.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    pos = end + 1;
  }
  return true;
}

// A recorded value as the user would type it: a float's or double's exact_str ("%.9g" /
// "%.17g": 0.0020000000949949026, 0.10000000000000001, 0.0500000007) by its shortest
// round-trip (0.002, 0.1, 0.05); any other value (an integer, a fingerprint, a model) as it is.
std::string typed_value(const std::string& v) {
  if (v.find('.') == std::string::npos ||
      v.find_first_not_of("0123456789.eE+-") != std::string::npos)
    return v;
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (end != v.c_str() + v.size() || !std::isfinite(d)) return v;
  const float f = std::strtof(v.c_str(), nullptr);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(f));
  const bool is_float = static_cast<double>(f) == d || v == buf;  // widened, or exact_str(float)
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, is_float ? static_cast<double>(f) : d);
    if (is_float ? std::strtof(buf, nullptr) == f : std::strtod(buf, nullptr) == d) break;
  }
  return buf;
}

// The data keys of a text run (TextDataSource::checkpoint_config) and of a token run
// (TokenDataSource's): a checkpoint of one resumed by the other is refused saying so.
bool text_data_key(const std::string& k) { return k == "text_fnv1a" || k == "text_bytes"; }
bool token_data_key(const std::string& k) {
  return k == "data_fingerprint" || k == "data_format" || k == "train_tokens" || k == "val_tokens";
}

}  // namespace

TrainerState resume_checkpoint(const std::string& dir, nn::Module& model, optim::Optimizer& opt,
                               const std::map<std::string, std::string>& run_config,
                               const std::set<std::string>& may_differ, std::ostream& log,
                               const std::map<std::string, std::string>& may_be_missing,
                               const std::map<std::string, std::string>& implied,
                               const std::map<std::string, std::string>& names) {
  Checkpoint c = read_latest_checkpoint(dir, log);
  const char* call = "resume";
  // A key one side does not record has its implied value there (f32 records no dtype), so that
  // a mismatch names both values.
  std::map<std::string, std::string> config = run_config;
  for (const auto& [key, value] : implied) {
    const bool mine = config.count(key), theirs = c.state.config.count(key);
    if (mine && !theirs) c.state.config[key] = value;
    if (theirs && !mine) config[key] = value;
  }
  auto name = [&](const std::string& key) {
    auto it = names.find(key);
    return it == names.end() ? key : it->second;
  };
  // Every check before the first change, so that a refused checkpoint leaves model and opt alone.
  std::vector<std::string> unchecked;  // the warnings, written once every check passed
  // "model" first: a GPT checkpoint resumed as an MLP is refused for its model, not for the
  // first other setting (batch_size) that differs in the keys' order.
  std::vector<std::pair<std::string, std::string>> ordered(config.begin(), config.end());
  std::stable_partition(ordered.begin(), ordered.end(),
                        [](const auto& kv) { return kv.first == "model"; });
  // Trained on a text, resumed on token files (nanoGPT's train.bin of the same text too), or the
  // other way round: not "data_fingerprint=(not recorded)" but what changed and what to do.
  {
    bool run_text = false, run_tokens = false, ck_text = false, ck_tokens = false;
    for (const auto& kv : config)
      run_text |= text_data_key(kv.first), run_tokens |= token_data_key(kv.first);
    for (const auto& kv : c.state.config)
      ck_text |= text_data_key(kv.first), ck_tokens |= token_data_key(kv.first);
    if ((ck_text && run_tokens && !ck_tokens) || (ck_tokens && run_text && !ck_text)) {
      auto kind = [](bool text) {
        return text ? "a text file (--data, a token per byte, the vocabulary its sorted distinct "
                      "bytes)"
                    : "token files (--data: llm.c shards or nanoGPT's .bin)";
      };
      throw InvalidArgument(cat(
          call, ": checkpoint '", c.path, "' was trained on ", kind(ck_text), ", this run reads ",
          kind(run_text),
          ": a resume continues on the checkpoint's own data (the same tokens in another format "
          "have another fingerprint and vocabulary), so it is refused; to train the checkpoint's "
          "model on this data, start a new run from its parameters with --init-from ",
          c.path, " (its optimizer state and step start fresh)"));
    }
  }
  for (const auto& [key, value] : ordered) {
    if (may_differ.count(key)) continue;
    auto it = c.state.config.find(key);
    const auto m = may_be_missing.find(key);
    if (it == c.state.config.end() && m != may_be_missing.end()) {
      unchecked.push_back(cat("ditto: ", call, ": warning: checkpoint '", c.path, "' has no ", key,
                              " (written before it was recorded): ", m->second,
                              " cannot be checked"));
      continue;
    }
    if (it != c.state.config.end() && it->second != value) {
      // A structured value ("gpt(n_layer=4,...,dropout=0)"): the first field that differs, by
      // the name the user set it with ("--dropout: checkpoint 0, this run 0.1").
      std::string head_a, head_b;
      std::vector<std::pair<std::string, std::string>> a, b;
      if (split_fields(it->second, head_a, a) && split_fields(value, head_b, b) &&
          head_a == head_b && a.size() == b.size())
        for (std::size_t i = 0; i < a.size(); ++i)
          DITTO_CHECK(a[i].first != b[i].first || a[i].second == b[i].second, call,
                      ": checkpoint '", c.path, "' does not match this run's ", key, ": ",
                      name(a[i].first), ": checkpoint ", a[i].second, ", this run ", b[i].second);
    }
    // A setting recorded under another name than its flag's (learning_rate: --lr), or as a
    // float's exact digits (min_lr=0.00010000000000000000479): named by the flag, with the
    // values as typed ("--lr: checkpoint 0.001, this run 0.002"). Others (batch_size=12, whose
    // key is its flag's name) keep the key=value form.
    if (it != c.state.config.end() && it->second != value && names.count(key)) {
      std::string flag = "--" + key;
      std::replace(flag.begin(), flag.end(), '_', '-');
      const std::string was = typed_value(it->second), now = typed_value(value);
      DITTO_CHECK(name(key) == flag && was == it->second && now == value, call, ": checkpoint '",
                  c.path, "' does not match this run's ", name(key), ": checkpoint ", was,
                  ", this run ", now);
    }
    DITTO_CHECK(it != c.state.config.end() && it->second == value, call, ": checkpoint '", c.path,
                "' was saved with ", key, "=",
                it == c.state.config.end() ? std::string("(not recorded)") : it->second,
                ", this run has ", key, "=", value);
  }
  for (const auto& [key, value] : c.state.config)
    DITTO_CHECK(config.count(key) || may_differ.count(key), call, ": checkpoint '", c.path,
                "' was saved with ", key, "=", value, ", a setting this run does not have");
  std::vector<nn::Parameter*> params = model.parameters();
  const std::string mpath = c.path + "/" + kModelFile;
  DITTO_CHECK(params.size() == c.params.size(), call, ": ", mpath, ": expected ", params.size(),
              " parameters (the model's), got ", c.params.size());
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : c.params) by_name[name] = &t;
  for (nn::Parameter* p : params) {
    auto it = by_name.find(p->name);
    DITTO_CHECK(it != by_name.end(), call, ": ", mpath, ": parameter '", p->name,
                "' of the model is missing");
    DITTO_CHECK(it->second->shape() == p->data.shape() && it->second->dtype() == p->data.dtype(),
                call, ": ", mpath, ": parameter '", p->name, "': expected ",
                shape_str(p->data.shape()), " ", dtype_name(p->data.dtype()),
                " (the model's), got ", it->second->str());
  }
  try {
    opt.load_state_dict(c.optimizer);  // checks, then loads: the last check
  } catch (const InvalidArgument& e) {
    // A hyper-parameter that differs (Optimizer::check_state's "option K differs: saved K=A,
    // this T has K=B"), by the name the user set it with when there is one ("--lr: checkpoint
    // 0.05, this run 0.1"); any other refusal as it is.
    const std::string m = e.what(), tag = ": state: option ", diff = " differs: saved ";
    const std::size_t o = m.find(tag), d = o == std::string::npos ? o : m.find(diff, o);
    if (d == std::string::npos) throw;
    const std::string key = m.substr(o + tag.size(), d - o - tag.size());
    const std::size_t a = d + diff.size() + key.size() + 1, t = m.find(", this ", a),
                      h = t == std::string::npos ? t : m.find(" has " + key + "=", t);
    // AdamW's per-group decay ("param_groups.0.weight_decay"): the --weight-decay the user set.
    const bool group_decay =
        key.rfind("param_groups.", 0) == 0 && key.size() > 13 && key.ends_with(".weight_decay");
    const std::string field = group_decay ? "weight_decay" : key;
    if (!names.count(field) || h == std::string::npos) throw;
    throw InvalidArgument(cat(call, ": checkpoint '", c.path, "' does not match this run's ",
                              "optimizer: ", name(field), ": checkpoint ",
                              typed_value(m.substr(a, t - a)), ", this run ",
                              typed_value(m.substr(h + key.size() + 6))));
  }
  for (nn::Parameter* p : params) p->data.copy_(*by_name[p->name]);
  for (const std::string& line : unchecked) log << line << "\n";
  return c.state;
}

}  // namespace ditto
