// Inputs that crashed a parser under its fuzz target of tools/fuzz/, kept in tests/data/fuzz/
// (gzip'd: they are large and repetitive) and fed to that parser, which must refuse each one
// with a clear ditto::Error naming the file.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend_sim/profiles.h"
#include "core/checkpoint/checkpoint.h"
#include "test_util.h"

namespace ditto {
namespace {

namespace fs = std::filesystem;

// The bytes of tests/data/fuzz/<name> (a .gz file), decompressed.
std::string fuzz_input(const std::string& name) {
  const std::string path = std::string(DITTO_TEST_DATA_DIR) + "/fuzz/" + name;
  gzFile f = gzopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  if (!f) return {};
  std::string out;
  char buf[65536];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  EXPECT_EQ(n, 0) << path;
  gzclose(f);
  return out;
}

std::string fuzz_dir(const std::string& name) { return test::fresh_dir("fuzz", name); }

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// fuzz_checkpoint: a trainer.json holding an array nested 100,000 deep. read_checkpoint's
// j.dump() (the CRC-32 of the content) recursed once per level and overflowed the stack
// (SIGSEGV); it is now refused by its depth before anything walks it.
TEST(FuzzRegression, CheckpointTrainerJsonNested100000DeepRefused) {
  const std::string text = fuzz_input("trainer_json_nested_100000_deep.json.gz");
  ASSERT_EQ(text.size(), 200025u);
  const std::string dir = fuzz_dir("ckpt") + "/step-00000003";
  fs::create_directories(dir);
  write_bytes(dir + "/trainer.json", text);
  test::expect_error<ParseError>([&] { (void)read_checkpoint(dir); },
                                 dir + "/trainer.json: JSON nested 100000 levels deep, expected "
                                       "at most 64 (damaged file)");
  // A checkpoint directory that holds only it: no usable checkpoint, the reason given.
  std::ostringstream log;
  test::expect_error<Error>([&] { (void)read_latest_checkpoint(fs::path(dir).parent_path(), log); },
                            "JSON nested 100000 levels deep");
}

// fuzz_checkpoint (inputs made by hand for it): trainer.json counts near 2^63 or 2^64, each
// checkpoint otherwise consistent (CRC-32s and ditto.step match). A step of 2^63 - 1 made the
// resumed run's TrainerState::advance overflow (signed ++step: UBSan), an epoch_samples of
// 2^63 - 1 the epoch's sample count (trainer.cpp: seen += rows), and a step of 2^64 - 1 was read
// as -1. Each is refused when read.
TEST(FuzzRegression, CheckpointCountsPast2p53Refused) {
  for (const auto& [name, field] : std::vector<std::pair<std::string, std::string>>{
           {"checkpoint_step_2p63m1", "step: expected an integer in [0, 2^53], got "
                                      "9223372036854775807"},
           {"checkpoint_epoch_samples_2p63m1", "epoch_samples: expected an integer in [0, 2^53], "
                                               "got 9223372036854775807"},
           {"checkpoint_step_2p64m1", "step: expected an integer in [0, 2^53], got "
                                      "18446744073709551615"}}) {
    SCOPED_TRACE(name);
    const std::string dir = std::string(DITTO_TEST_DATA_DIR) + "/fuzz/" + name + "/step-00000003";
    test::expect_error<ParseError>([&] { (void)read_checkpoint(dir); },
                                   dir + "/trainer.json: " + field);
  }
}

// fuzz_profile: "fp32_tflops" an array nested 100,000 deep. The message "expected a number,
// got <v.dump()>" recursed once per level and overflowed the stack (SIGSEGV); it now names the
// value's type.
TEST(FuzzRegression, ProfileFieldNested100000DeepRefused) {
  const std::string text = fuzz_input("profile_nested_100000_deep.json.gz");
  ASSERT_EQ(text.size(), 200059u);
  const std::string path = fuzz_dir("profile") + "/deep.json";
  write_bytes(path, text);
  test::expect_invalid(
      [&] { (void)sim::device_profile(path); },
      "device_profile: " + path + ": field 'fp32_tflops': expected a number, got array");
}

}  // namespace
}  // namespace ditto
