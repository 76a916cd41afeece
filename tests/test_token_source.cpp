// train::TokenDataSource and llm.c / nanoGPT token files (core/data/token_source.h, Note [Token
// files]): the windows of a step, shards read as one sequence, the detection rule, the val files
// beside --data, and every malformed file refused naming the file, the offset and the value
// expected (issue 32). The files are written here (llm.c's write_datafile layout).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/data/token_source.h"
#include "core/nn/gpt.h"
#include "core/numerics/random.h"
#include "core/optim/adamw.h"
#include "core/train/trainer.h"
#include "test_util.h"
#include "trainer_test_util.h"

namespace ditto::train {
namespace {

using test::expect_error;
using test::expect_invalid;

std::string bytes_of(const void* p, std::size_t n) {
  return std::string(static_cast<const char*>(p), n);
}

/// llm.c's write_datafile: 256 int32 (magic, version, count, zeros), then the tokens as uint16
/// (magic 20240520) or uint32 (20240801). `count` < 0: tokens.size().
std::string llmc_bytes(const std::vector<std::uint32_t>& tokens,
                       std::int32_t magic = kLlmcMagicGpt2, std::int32_t version = -1,
                       std::int64_t count = -1) {
  std::vector<std::int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version >= 0 ? version : magic == kLlmcMagicLlama3 ? 7 : 1;
  header[2] = static_cast<std::int32_t>(count >= 0 ? count : std::int64_t(tokens.size()));
  std::string out = bytes_of(header.data(), 1024);
  for (std::uint32_t t : tokens) {
    if (magic == kLlmcMagicLlama3) {
      out += bytes_of(&t, 4);
    } else {
      const auto v = static_cast<std::uint16_t>(t);
      out += bytes_of(&v, 2);
    }
  }
  return out;
}

/// nanoGPT's np.array(ids, dtype=np.uint16).tofile(...).
std::string raw_bytes(const std::vector<std::uint32_t>& tokens) {
  std::string out;
  for (std::uint32_t t : tokens) {
    const auto v = static_cast<std::uint16_t>(t);
    out += bytes_of(&v, 2);
  }
  return out;
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::vector<std::uint32_t> ramp(std::int64_t n, std::uint32_t from = 0, std::uint32_t mod = 500) {
  std::vector<std::uint32_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = (from + i) % mod;
  return v;
}

class TokenFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = test::fresh_dir("TokenFiles", info->name());
  }
  std::string at(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
};

TEST_F(TokenFiles, StepWindowsArePhiloxDrawsOfTheShardsTokens) {
  const std::vector<std::uint32_t> tokens = ramp(3000, 7);
  write(at("d_train.bin"), llmc_bytes(tokens));
  const std::int64_t T = 16, B = 5;
  TokenDataSource s({at("d_train.bin")}, {}, DataFormat::llmc, 512, T, 42);
  EXPECT_EQ(s.train_tokens(), 3000);
  EXPECT_EQ(s.val_tokens(), 0);
  EXPECT_EQ(s.num_outputs(), 512);
  for (std::int64_t step : {0, 1, 29}) {
    data::Batch b = s.step_batch(step, B);
    ASSERT_EQ(b.x.shape(), (Shape{B, T}));
    const auto x = b.x.to_vector<std::int64_t>(), y = b.y.to_vector<std::int64_t>();
    for (std::int64_t j = 0; j < B; ++j) {
      const std::uint64_t i =
          philox_u64(42, stream_id(kStreamBatch, std::uint64_t(step)), std::uint64_t(j)) %
          (3000 - T);
      for (std::int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(x[std::size_t(j * T + t)], tokens[i + t]);
        EXPECT_EQ(y[std::size_t(j * T + t)], tokens[i + t + 1]);
      }
    }
  }
}

// Three shards are one sequence: the same batches as one shard of their tokens, and as nanoGPT's
// raw file of the same tokens (a window may run from one shard into the next).
TEST_F(TokenFiles, ShardsInOrderAreOneSequenceAsOneFileOrNanoGptRaw) {
  const std::vector<std::uint32_t> all = ramp(900, 3, 97);
  std::vector<std::string> shards;
  for (int k = 0; k < 3; ++k) {
    shards.push_back(at("s_train_00000" + std::to_string(k) + ".bin"));
    write(shards.back(), llmc_bytes({all.begin() + k * 300, all.begin() + (k + 1) * 300}));
  }
  write(at("one.bin"), llmc_bytes(all));
  write(at("train.bin"), raw_bytes(all));
  const std::int64_t T = 64, B = 32;  // 32 windows of 65 over 900 tokens: several cross a seam
  TokenDataSource three(shards, {}, DataFormat::llmc, 97, T, 5);
  TokenDataSource one({at("one.bin")}, {}, DataFormat::llmc, 97, T, 5);
  TokenDataSource raw({at("train.bin")}, {}, DataFormat::nanogpt, 97, T, 5);
  EXPECT_EQ(three.train_tokens(), 900);
  for (std::int64_t step : {0, 3}) {
    const auto a = three.step_batch(step, B), b = one.step_batch(step, B),
               c = raw.step_batch(step, B);
    EXPECT_EQ(a.x.to_vector<std::int64_t>(), b.x.to_vector<std::int64_t>());
    EXPECT_EQ(a.y.to_vector<std::int64_t>(), b.y.to_vector<std::int64_t>());
    EXPECT_EQ(a.x.to_vector<std::int64_t>(), c.x.to_vector<std::int64_t>());
    EXPECT_EQ(a.y.to_vector<std::int64_t>(), c.y.to_vector<std::int64_t>());
  }
  // The glob in sorted order and the comma list give those shards, in that order.
  EXPECT_EQ(expand_data_paths(at("s_train_*.bin"), "--data"), shards);
  EXPECT_EQ(expand_data_paths(shards[2] + "," + shards[0], "--data"),
            (std::vector<std::string>{shards[2], shards[0]}));
  EXPECT_NE(TokenDataSource({shards[2], shards[0], shards[1]}, {}, DataFormat::llmc, 97, T, 5)
                .step_batch(0, B)
                .x.to_vector<std::int64_t>(),
            three.step_batch(0, B).x.to_vector<std::int64_t>());
}

// A DDP rank asks for its rows only: they are step_batch's, the other rows are not read (zeros).
TEST_F(TokenFiles, StepBatchRowsReadsOnlyTheRanksRows) {
  write(at("r.bin"), llmc_bytes(ramp(2000, 1)));
  TokenDataSource s({at("r.bin")}, {}, DataFormat::llmc, 512, 8, 9);
  const auto whole = s.step_batch(4, 8).x.to_vector<std::int64_t>();
  const auto part = s.step_batch_rows(4, 8, 2, 6).x.to_vector<std::int64_t>();
  for (std::size_t r = 0; r < 8; ++r)
    for (std::size_t t = 0; t < 8; ++t)
      EXPECT_EQ(part[r * 8 + t], r >= 2 && r < 6 ? whole[r * 8 + t] : 0) << r << " " << t;
  expect_invalid([&] { s.step_batch_rows(0, 8, 6, 9); }, "expected 0 <= lo <= hi <= batch_size");
}

TEST_F(TokenFiles, Llama3ShardsHoldUint32Tokens) {
  std::vector<std::uint32_t> t = ramp(400, 100000, 128256);  // past 2^16
  write(at("l.bin"), llmc_bytes(t, kLlmcMagicLlama3));
  TokenDataSource s({at("l.bin")}, {at("l.bin")}, DataFormat::llmc,
                    llmc_tokenizer_vocab_size(kLlmcMagicLlama3), 8, 1);
  EXPECT_EQ(s.vocab_size(), 128256);  // llm.c's LLaMA 3 tokenizer
  EXPECT_EQ(s.train().files()[0]->token_bytes(), 4);
  const auto x = s.eval_batch(EvalSplit::val, 0, 4).x.to_vector<std::int64_t>();
  for (std::int64_t v : x) EXPECT_GE(v, 100000);
  write(at("g.bin"), llmc_bytes(ramp(400)));
  EXPECT_EQ(TokenDataSource({at("g.bin")}, {}, DataFormat::llmc, 50257, 8, 1).vocab_size(), 50257);
  // One token width per dataset: a GPT-2 shard after a LLaMA 3 one is refused.
  expect_error<Error>(
      [&] {
        TokenDataSource({at("l.bin"), at("g.bin")}, {}, DataFormat::llmc, 128256, 8, 1);
      },
      "'" + at("g.bin") + "': offset 0: expected magic 20240801 as '" + at("l.bin"));
}

TEST_F(TokenFiles, DetectionByMagicThenDotBinThenText) {
  write(at("shard.txt"), llmc_bytes(ramp(10)));  // the magic wins over the name
  write(at("raw.bin"), raw_bytes(ramp(10)));
  write(at("text.txt"), "hello world\n");
  write(at("tiny"), "ab");
  EXPECT_EQ(detect_data_format(at("shard.txt")), DataFormat::llmc);
  EXPECT_EQ(detect_data_format(at("raw.bin")), DataFormat::nanogpt);
  EXPECT_EQ(detect_data_format(at("text.txt")), DataFormat::text);
  EXPECT_EQ(detect_data_format(at("tiny")), DataFormat::text);
  // A file it cannot open is refused as the reader its name goes to refuses it, not taken for
  // text (or, named .bin, for nanoGPT tokens, which then asked for --vocab-size).
  expect_error<Error>(
      [&] { detect_data_format(at("missing.txt")); },
      "TextDataSource: cannot open '" + at("missing.txt") + "': No such file or directory");
  expect_error<Error>(
      [&] { detect_data_format(at("missing.bin")); },
      "TokenDataSource: cannot open '" + at("missing.bin") + "': No such file or directory");
  EXPECT_EQ(parse_data_format("nanogpt", "--data-format"), DataFormat::nanogpt);
  expect_invalid([] { parse_data_format("npy", "--data-format"); },
                 "--data-format: expected auto, text, llmc or nanogpt, got 'npy'");
  // An llm.c shard read as raw tokens would train on its header: refused.
  expect_error<Error>([&] { TokenFile(at("shard.txt"), DataFormat::nanogpt); },
                      "offset 0: expected nanoGPT's raw uint16 tokens (--data-format nanogpt), got "
                      "an llm.c shard (magic 20240520, version 1, 10 tokens)");
}

// Issue 32 P01 / D34: detection that cannot read the magic says so (it took a shard it could not
// read for nanoGPT tokens by its name), and it refuses what is not a regular file before reading
// (the FIFO cases, which hung, are DittoTrainGpt.TokenDataRefusalsNameTheirSource's, under a
// timeout).
TEST_F(TokenFiles, DetectionRefusesWhatItCannotRead) {
  std::filesystem::create_directories(at("dir.bin"));  // opens, but every read fails (EISDIR)
  expect_error<Error>(
      [&] { detect_data_format(at("dir.bin")); },
      "TokenDataSource: '" + at("dir.bin") + "' is a directory, expected a regular file");
}

TEST_F(TokenFiles, DetectionRefusesAFileItMayNotRead) {
  write(at("locked_train_000001.bin"), llmc_bytes(ramp(10)));
  std::filesystem::permissions(at("locked_train_000001.bin"), std::filesystem::perms::none);
  if (::geteuid() == 0)
    GTEST_SKIP() << "running as root, which reads a file of mode 000: the permission case is "
                    "tests/ditto_train_gpt_token_refusals.sh's, run as nobody";
  expect_error<Error>(
      [&] { detect_data_format(at("locked_train_000001.bin")); },
      "TokenDataSource: cannot open '" + at("locked_train_000001.bin") + "': Permission denied");
}

TEST_F(TokenFiles, ValFilesBesideByLlmcAndNanoGptNaming) {
  write(at("fw_train_000001.bin"), "x");
  write(at("fw_train_000002.bin"), "x");
  write(at("fw_val_000000.bin"), "x");
  write(at("train.bin"), "x");
  write(at("val.bin"), "x");
  EXPECT_EQ(val_paths_beside(at("fw_train_*.bin")),
            (std::vector<std::string>{at("fw_val_000000.bin")}));
  EXPECT_EQ(val_paths_beside(at("train.bin")), (std::vector<std::string>{at("val.bin")}));
  // A shard number is any val shard's (llm.c numbers them apart), each file once.
  EXPECT_EQ(val_paths_beside(at("fw_train_000001.bin") + "," + at("fw_train_000002.bin")),
            (std::vector<std::string>{at("fw_val_000000.bin")}));
  write(at("tiny_shakespeare_train.bin"), "x");
  EXPECT_TRUE(val_paths_beside(at("tiny_shakespeare_train.bin")).empty());
  write(at("tiny_shakespeare_val.bin"), "x");
  EXPECT_EQ(val_paths_beside(at("tiny_shakespeare_train.bin")),
            (std::vector<std::string>{at("tiny_shakespeare_val.bin")}));
  EXPECT_TRUE(val_paths_beside(at("other.bin")).empty());
  EXPECT_TRUE(val_paths_beside(at("fw_train_000001.bin") + "," + at("other.bin")).empty());
  // Issue 32 D48: the shard number spelled as any glob (? * [..]) finds the val shards as the
  // same files given as a list do.
  for (const char* pattern :
       {"fw_train_00000[12].bin", "fw_train_00000?.bin", "fw_train_0000[0-9][12].bin",
        "fw_train_[0-9]*.bin", "fw_train_00000[!3].bin", "fw_train_00000[]12].bin"})
    EXPECT_EQ(val_paths_beside(at(pattern)), (std::vector<std::string>{at("fw_val_000000.bin")}))
        << pattern;
  // "train" in a directory's name is not the file's.
  std::filesystem::create_directories(at("train"));
  write(at("train/data.bin"), "x");
  EXPECT_TRUE(val_paths_beside(at("train/data.bin")).empty());
}

// Each malformed case of issue 32, refused naming the file, the offset and the value expected.
TEST_F(TokenFiles, MalformedFilesAreRefusedNamingFileOffsetAndExpectedValue) {
  auto refused = [&](const std::string& name, const std::string& bytes, DataFormat f,
                     const std::string& part) {
    write(at(name), bytes);
    expect_error<Error>([&] { TokenFile(at(name), f); }, "'" + at(name) + "'" + part);
  };
  refused("magic.bin", llmc_bytes(ramp(10), 20240521), DataFormat::llmc,
          ": offset 0: expected llm.c's magic 20240520 (GPT-2, uint16 tokens) or 20240801 "
          "(LLaMA 3, uint32 tokens), got 20240521");
  refused("version.bin", llmc_bytes(ramp(10), kLlmcMagicGpt2, 2), DataFormat::llmc,
          ": offset 4: expected version 1 for magic 20240520, got 2");
  refused("version7.bin", llmc_bytes(ramp(10), kLlmcMagicLlama3, 1), DataFormat::llmc,
          ": offset 4: expected version 7 for magic 20240801, got 1 (if it holds nanoGPT's raw "
          "uint16 tokens, whose first two, 55713 and 308, spell the magic: --data-format "
          "nanogpt)");
  // nanoGPT's raw tokens whose first two spell llm.c's magic (tester hB, 11a): the hint the
  // reverse case has, for the version and for the count.
  std::vector<std::uint32_t> raw = ramp(1000, 0, 4000);
  raw[0] = 55432;
  raw[1] = 308;
  refused("raw_magic_train.bin", raw_bytes(raw), DataFormat::llmc,
          ": offset 4: expected version 1 for magic 20240520, got 196610 (if it holds nanoGPT's "
          "raw uint16 tokens, whose first two, 55432 and 308, spell the magic: --data-format "
          "nanogpt)");
  raw[2] = 1;  // version 1, then the count: tokens 4, 5
  raw[3] = 0;
  refused("raw_magic_count.bin", raw_bytes(raw), DataFormat::llmc,
          ": offset 8: the header's token count 327684 needs 1024 + 327684 x 2 = 656392 bytes, "
          "got a file of 2000 bytes (the count runs past the file's end) (if it holds nanoGPT's "
          "raw uint16 tokens, whose first two, 55432 and 308, spell the magic: --data-format "
          "nanogpt)");
  refused("past_end.bin", llmc_bytes(ramp(100), kLlmcMagicGpt2, -1, 900), DataFormat::llmc,
          ": offset 8: the header's token count 900 needs 1024 + 900 x 2 = 2824 bytes, got a file "
          "of 1224 bytes (the count runs past the file's end)");
  refused("trailing.bin", llmc_bytes(ramp(100), kLlmcMagicGpt2, -1, 99), DataFormat::llmc,
          ": offset 8: the header's token count 99 needs 1024 + 99 x 2 = 1222 bytes, got a file "
          "of 1224 bytes (bytes after the last token)");
  refused("odd_llmc.bin", llmc_bytes(ramp(100)) + "x", DataFormat::llmc,
          ": offset 8: the header's token count 100 needs 1024 + 100 x 2 = 1224 bytes, got a "
          "file of 1225 bytes");
  refused("negative.bin", llmc_bytes(ramp(10), kLlmcMagicGpt2, -1, 0x80000000u), DataFormat::llmc,
          ": offset 8: token count: expected > 0, got -2147483648");
  refused("empty_shard.bin", llmc_bytes({}), DataFormat::llmc,
          ": offset 8: token count: expected > 0, got 0 (an empty shard)");
  refused("empty.bin", "", DataFormat::llmc,
          ": expected an llm.c shard (a header of 256 int32, then tokens), got an empty file");
  refused("short_header.bin", llmc_bytes(ramp(10)).substr(0, 100), DataFormat::llmc,
          ": offset 0: expected an llm.c header of 1024 bytes (256 int32), got a file of 100 "
          "bytes");
  refused("odd.bin", raw_bytes(ramp(10)) + "x", DataFormat::nanogpt,
          ": offset 20: expected an even number of bytes (nanoGPT's uint16 tokens), got 21 bytes "
          "(an odd byte count)");
  refused("empty_raw.bin", "", DataFormat::nanogpt,
          ": expected nanoGPT's uint16 tokens, got an empty file");
  // A missing file of a list, a glob that matches nothing, an empty item.
  write(at("a.bin"), llmc_bytes(ramp(100)));
  expect_error<Error>(
      [&] {
        TokenDataSource(expand_data_paths(at("a.bin") + "," + at("gone.bin"), "--data"), {},
                        DataFormat::llmc, 512, 8, 1);
      },
      "TokenDataSource: cannot open '" + at("gone.bin") + "': No such file or directory");
  expect_error<Error>([&] { expand_data_paths(at("none_*.bin"), "--data"); },
                      "--data: the pattern '" + at("none_*.bin") + "' matches no file");
  expect_error<Error>([&] { expand_data_paths(at("a.bin") + ",", "--data"); }, "(an empty item)");
  expect_error<Error>([&] { TokenFile(dir_, DataFormat::llmc); },
                      "'" + dir_ + "' is a directory, expected a regular file");
}

// TokenFile::token(i) checks i (tester hB, 4): token(-1) and token(tokens()) read the header's
// last bytes and past the tokens, token(1 << 40) faulted. Inside, it returns the token written.
TEST_F(TokenFiles, TokenOutsideTheFileIsRefusedNamingTheRange) {
  write(at("t.bin"), llmc_bytes(ramp(100, 7)));
  write(at("train.bin"), raw_bytes(ramp(50, 3)));
  const TokenFile f(at("t.bin"), DataFormat::llmc), r(at("train.bin"), DataFormat::nanogpt);
  EXPECT_EQ(f.token(0), 7u);
  EXPECT_EQ(f.token(99), 106u);
  EXPECT_EQ(r.token(49), 52u);
  const std::string range = "TokenFile::token: i: expected an index in [0, 100) (the tokens of '" +
                            at("t.bin") + "'), got ";
  expect_invalid([&] { f.token(-1); }, range + "-1");
  expect_invalid([&] { f.token(100); }, range + "100");
  expect_invalid([&] { f.token(std::int64_t(1) << 40); }, range + "1099511627776");
  expect_invalid([&] { f.token(std::numeric_limits<std::int64_t>::min()); },
                 range + "-9223372036854775808");
  expect_invalid([&] { r.token(50); },
                 "expected an index in [0, 50) (the tokens of '" + at("train.bin") + "'), got 50");
}

// A token >= vocab_size is refused when a window reads it, naming its byte offset; opening the
// data does not read the tokens (Note [Mapped shards]).
TEST_F(TokenFiles, ATokenPastTheVocabularyIsRefusedWhereAWindowReadsIt) {
  std::vector<std::uint32_t> t(200, 3);
  t[150] = 600;
  write(at("v.bin"), llmc_bytes(t));
  TokenDataSource s({at("v.bin")}, {}, DataFormat::llmc, 512, 190, 1);  // every window has 150
  expect_error<Error>([&] { s.step_batch(0, 1); }, "TokenDataSource: '" + at("v.bin") +
                                                       "': offset 1324: expected a token < "
                                                       "vocab_size = 512, got 600");
  write(at("train.bin"), raw_bytes(t));
  TokenDataSource r({at("train.bin")}, {}, DataFormat::nanogpt, 512, 190, 1);
  expect_error<Error>([&] { r.step_batch(0, 1); }, "offset 300: expected a token < vocab_size "
                                                   "= 512, got 600");
}

TEST_F(TokenFiles, SplitsMustBeLongerThanABlockAndValIsNeededToEvaluate) {
  write(at("t.bin"), llmc_bytes(ramp(64)));
  write(at("v.bin"), llmc_bytes(ramp(20)));
  expect_invalid([&] { TokenDataSource({at("t.bin")}, {}, DataFormat::llmc, 512, 64, 1); },
                 "'" + at("t.bin") +
                     "': expected more than block_size = 64 tokens of training "
                     "data, got 64");
  expect_invalid(
      [&] { TokenDataSource({at("t.bin")}, {at("v.bin")}, DataFormat::llmc, 512, 32, 1); },
      "'" + at("v.bin") +
          "': expected more than block_size = 32 tokens of validation "
          "data, got 20");
  TokenDataSource s({at("t.bin")}, {}, DataFormat::llmc, 512, 8, 1);
  EXPECT_EQ(s.eval_batch(EvalSplit::train, 1, 2).x.size(0), 2);
  expect_invalid([&] { s.eval_batch(EvalSplit::val, 0, 2); }, "expected validation data");
  write(at("train.bin"), raw_bytes(ramp(64)));
  expect_invalid([&] { TokenDataSource({at("train.bin")}, {}, DataFormat::nanogpt, 0, 8, 1); },
                 "vocab_size: expected >= 1, got 0");
  // llm.c shards too (tester hB, 10: 0 became 50257 without a word, against the header); the
  // tokenizer's vocabulary is llmc_tokenizer_vocab_size's, which ditto-train asks itself.
  expect_invalid([&] { TokenDataSource({at("t.bin")}, {}, DataFormat::llmc, 0, 8, 1); },
                 "TokenDataSource: vocab_size: expected >= 1, got 0");
  expect_invalid([&] { TokenDataSource({at("t.bin")}, {}, DataFormat::llmc, -5, 8, 1); },
                 "TokenDataSource: vocab_size: expected >= 1, got -5");
  EXPECT_EQ(llmc_tokenizer_vocab_size(kLlmcMagicGpt2), 50257);
  EXPECT_EQ(llmc_tokenizer_vocab_size(kLlmcMagicLlama3), 128256);
  expect_invalid([&] { llmc_tokenizer_vocab_size(7); },
                 "llmc_tokenizer_vocab_size: magic: expected 20240520 (GPT-2) or 20240801 (LLaMA "
                 "3), got 7");
}

// The checkpoint's fingerprint reads the files' ends only; it changes with the tokens there.
TEST_F(TokenFiles, CheckpointConfigFingerprintsTheFiles) {
  std::vector<std::uint32_t> t = ramp(5000);
  write(at("a.bin"), llmc_bytes(t));
  t[1] = 9;
  write(at("b.bin"), llmc_bytes(t));
  const auto a =
      TokenDataSource({at("a.bin")}, {}, DataFormat::llmc, 512, 8, 1).checkpoint_config();
  const auto b =
      TokenDataSource({at("b.bin")}, {}, DataFormat::llmc, 512, 8, 1).checkpoint_config();
  EXPECT_EQ(a.at("data_format"), "llmc");
  EXPECT_EQ(a.at("train_tokens"), "5000");
  EXPECT_EQ(a.at("val_tokens"), "0");
  EXPECT_EQ(a.at("block_size"), "8");
  EXPECT_NE(a.at("data_fingerprint"), b.at("data_fingerprint"));
  EXPECT_EQ(a.at("data_fingerprint"),
            TokenDataSource({at("a.bin")}, {}, DataFormat::llmc, 512, 8, 1)
                .checkpoint_config()
                .at("data_fingerprint"));
}

// What a Trainer asks its data for, step by step (the rows of each call).
class RowSpy final : public test::ForwardingSource {
 public:
  explicit RowSpy(std::shared_ptr<TokenDataSource> s) : ForwardingSource(std::move(s)) {}
  data::Batch step_batch(std::int64_t step, std::int64_t b) override {
    std::lock_guard lk(mu_);
    rows.insert({-1, -1});  // every row
    return inner_->step_batch(step, b);
  }
  data::Batch step_batch_rows(std::int64_t step, std::int64_t b, std::int64_t lo,
                              std::int64_t hi) override {
    {
      std::lock_guard lk(mu_);
      rows.insert({lo, hi});
    }
    return inner_->step_batch_rows(step, b, lo, hi);
  }
  std::set<std::pair<std::int64_t, std::int64_t>> rows;

 private:
  std::mutex mu_;
};

TrainerConfig tiny_gpt(int devices, TrainerKind kind) {
  return test::tiny_gpt_trainer(
      {.block_size = 16, .vocab_size = 128, .n_layer = 1, .n_head = 2, .n_embd = 16}, devices, kind,
      {.max_iters = 3, .eval_interval = 3, .eval_iters = 1, .nanogpt_recipe = false});
}

// Issue 32: each DDP rank reads only the windows of its rows (the Trainer asked every rank for
// the whole global batch and narrowed it), and the bits are those of one device.
TEST_F(TokenFiles, ADdpRankReadsOnlyItsRowsAndTheChecksumIsOneDevices) {
  write(at("t_train_1.bin"), llmc_bytes(ramp(3000, 0, 128)));
  write(at("t_val_1.bin"), llmc_bytes(ramp(500, 5, 128)));
  auto src = std::make_shared<TokenDataSource>(std::vector<std::string>{at("t_train_1.bin")},
                                               val_paths_beside(at("t_train_1.bin")),
                                               DataFormat::llmc, 128, 16, 3);
  ASSERT_EQ(src->val_tokens(), 500);
  auto one = std::make_shared<RowSpy>(src), four = std::make_shared<RowSpy>(src);
  const std::uint64_t sum = Trainer(tiny_gpt(1, TrainerKind::dp), one).fit().params_checksum;
  EXPECT_EQ(one->rows, (std::set<std::pair<std::int64_t, std::int64_t>>{{0, 8}}));
  EXPECT_EQ(Trainer(tiny_gpt(4, TrainerKind::ddp), four).fit().params_checksum, sum);
  EXPECT_EQ(four->rows,
            (std::set<std::pair<std::int64_t, std::int64_t>>{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  EXPECT_EQ(Trainer(tiny_gpt(2, TrainerKind::dp), src).fit().params_checksum, sum);
}

}  // namespace
}  // namespace ditto::train
