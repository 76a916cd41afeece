// Checkpoints (core/checkpoint/checkpoint.h) and the safetensors format (core/io/safetensors.h):
// round trips, every malformed file refused with a ParseError naming the problem, damaged and
// truncated checkpoints refused with a fall-back to the previous one, a crash in the middle of a
// write leaving the previous checkpoint usable, and resumed training equal bit for bit to training
// that never stopped (SGD with momentum and Adam; at an epoch boundary and mid-epoch).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/checkpoint/checkpoint.h"
#include "core/data/data_loader.h"
#include "core/data/dataset.h"
#include "core/io/file.h"
#include "core/io/safetensors.h"
#include "core/nn/loss.h"
#include "core/nn/sequential.h"
#include "core/numerics/random.h"
#include "core/optim/adam.h"
#include "core/optim/sgd.h"
#include "core/runtime/backend.h"
#include "temp_files.h"
#include "test_util.h"

namespace ditto {
namespace {

namespace fs = std::filesystem;

template <typename Exc, typename F>
void expect_throw(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an exception containing: " << parts.front();
  } catch (const Exc& e) {
    for (const std::string& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "'" << part << "' not in: " << e.what();
  }
}

std::string fresh_dir(const std::string& name) { return test::fresh_dir("ckpt", name); }

// A safetensors file from a raw header text and buffer (no padding unless given).
std::string raw_file(const std::string& header, const std::string& buffer) {
  std::string out;
  const std::uint64_t n = header.size();
  for (int b = 0; b < 8; ++b) out.push_back(static_cast<char>((n >> (8 * b)) & 0xff));
  return out + header + buffer;
}

using test::tensor_bytes;

// ---- safetensors ----------------------------------------------------------------------------

TEST(Safetensors, RoundTripF32I64ScalarsAndEmpty) {
  Tensor w =
      Tensor::from_vector(std::vector<float>{1.5f, -2.0f, 0.0f, 3.25f, 1e-30f, -0.0f}, {2, 3});
  Tensor idx = Tensor::from_vector(std::vector<std::int64_t>{-1, 0, 1LL << 40}, {3});
  Tensor scalar = Tensor::from_vector(std::vector<float>{7.5f}, {});
  Tensor iscalar = Tensor::from_vector(std::vector<std::int64_t>{-9}, {});
  Tensor empty = Tensor::empty({0, 4}, DType::f32, Device::cpu());
  std::vector<std::pair<std::string, Tensor>> in{
      {"w", w}, {"idx", idx}, {"scalar", scalar}, {"iscalar", iscalar}, {"empty", empty}};
  std::string bytes = io::safetensors_serialize(in, {{"k", "v"}, {"ü", "é"}});

  // Layout: u64 little-endian header length, a multiple of 8, JSON padded with spaces.
  std::uint64_t n = 0;
  for (int b = 0; b < 8; ++b) n |= std::uint64_t(static_cast<unsigned char>(bytes[b])) << (8 * b);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
  EXPECT_EQ(bytes.size(), 8 + n + 24 + 24 + 4 + 8 + 0);
  const std::string header = bytes.substr(8, n);
  for (const char* entry : {R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})",
                            R"("idx":{"dtype":"I64","shape":[3],"data_offsets":[24,48]})",
                            R"("scalar":{"dtype":"F32","shape":[],"data_offsets":[48,52]})",
                            R"("empty":{"dtype":"F32","shape":[0,4],"data_offsets":[60,60]})"})
    EXPECT_NE(header.find(entry), std::string::npos) << entry << " not in " << header;
  // The first tensor's bytes right after the header, little-endian f32 1.5 = 0x3fc00000.
  EXPECT_EQ(static_cast<unsigned char>(bytes[8 + n + 2]), 0xc0);
  EXPECT_EQ(static_cast<unsigned char>(bytes[8 + n + 3]), 0x3f);

  io::SafetensorsData d = io::safetensors_parse(bytes, "mem");
  ASSERT_EQ(d.tensors.size(), 5u);
  for (const auto& [name, t] : in) {
    const Tensor* got = d.find(name);
    ASSERT_NE(got, nullptr) << name;
    EXPECT_EQ(got->shape(), t.shape()) << name;
    EXPECT_EQ(got->dtype(), t.dtype()) << name;
    EXPECT_EQ(tensor_bytes(*got), tensor_bytes(t)) << name;
  }
  EXPECT_EQ(d.find("nope"), nullptr);
  EXPECT_EQ(d.metadata, (std::map<std::string, std::string>{{"k", "v"}, {"ü", "é"}}));

  // Through a file, from device tensors.
  BackendOptions o;
  o.device_count = 4;
  init_backend("sim", o);
  const std::string path = fresh_dir("st") + "/t.safetensors";
  io::save_safetensors(path, {{"a", w.to(Device("sim", 1))}});
  io::SafetensorsData f = io::load_safetensors(path);
  EXPECT_EQ(tensor_bytes(*f.find("a")), tensor_bytes(w));
  EXPECT_TRUE(f.metadata.empty());
  EXPECT_TRUE(test::temp_leftovers(fs::path(path).parent_path().string()).empty());
}

// Written by Python's safetensors.numpy.save_file (tools/safetensors_interop.py --write-fixture).
TEST(Safetensors, ReadsFileWrittenByPythonSafetensors) {
  io::SafetensorsData d =
      io::load_safetensors(std::string(DITTO_TEST_DATA_DIR) + "/python_written.safetensors");
  ASSERT_EQ(d.tensors.size(), 5u);
  EXPECT_EQ(d.find("w")->shape(), (Shape{2, 3}));
  EXPECT_EQ(d.find("w")->to_vector<float>(),
            (std::vector<float>{-0.5f, -0.25f, 0.0f, 0.25f, 0.5f, 0.75f}));  // arange(6)/4 - 0.5
  EXPECT_EQ(d.find("idx")->to_vector<std::int64_t>(), (std::vector<std::int64_t>{-2, -1, 0, 1, 2}));
  EXPECT_EQ(d.find("scalar")->dim(), 0);
  EXPECT_EQ(d.find("scalar")->item(), 3.5f);
  EXPECT_EQ(d.find("iscalar")->to_vector<std::int64_t>(), (std::vector<std::int64_t>{-7}));
  EXPECT_EQ(d.find("empty")->shape(), (Shape{0, 4}));
  EXPECT_EQ(d.metadata.at("source"), "python safetensors");
  EXPECT_EQ(d.metadata.at("note"), "é ünïcode");
}

struct Malformed {
  const char* what;
  std::string bytes;
  std::vector<std::string> message;
};

TEST(Safetensors, EachMalformedFileRefusedNamingTheProblem) {
  const std::string b8(8, '\0'), b12(12, '\0');
  auto one = [](const std::string& fields) { return "{\"t\":{" + fields + "}}"; };
  // Tensor `name`'s entry: F32 of shape [n] at data_offsets [begin, end].
  auto f32 = [](const char* name, int n, int begin, int end) {
    return detail::cat("\"", name, "\":{\"dtype\":\"F32\",\"shape\":[", n, "],\"data_offsets\":[",
                       begin, ",", end, "]}");
  };
  std::string too_long = raw_file(one(R"("dtype":"F32","shape":[2],"data_offsets":[0,8])"), b8);
  too_long[0] = static_cast<char>(0xff);  // header length 255 + the rest: past the end
  std::string truncated = raw_file(one(R"("dtype":"F32","shape":[2],"data_offsets":[0,8])"), b8);
  truncated.resize(truncated.size() - 3);
  const std::vector<Malformed> cases = {
      {"too short", std::string(5, '\0'), {"f.st: file too short: 5 bytes"}},
      {"header past end", too_long, {"f.st: header length: ", "truncated"}},
      {"truncated buffer",
       truncated,
       {"f.st: tensor 't': data_offsets: expected begin <= end <= 5"}},
      {"not json", raw_file("{\"t\": [1, 2", ""), {"f.st: header: not a well-formed JSON"}},
      {"not an object", raw_file("[1, 2]  ", ""), {"header: expected a JSON object"}},
      {"trailing garbage", raw_file("{} x", ""), {"header: not a well-formed JSON"}},
      {"bad utf-8", raw_file("{\"\xff\":1}", ""), {"not a well-formed JSON object (or not UTF-8)"}},
      {"repeated key",
       raw_file("{" + f32("t", 1, 0, 4) + "," + f32("t", 1, 4, 8) + "}", b8),
       {"key 't' appears more than once"}},
      {"repeated field",
       raw_file(one(R"("dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8])"), b8),
       {"key 'dtype' appears more than once"}},
      {"entry not object", raw_file(R"({"t":[1]})", ""), {"tensor 't': expected an object"}},
      {"missing offsets",
       raw_file(one(R"("dtype":"F32","shape":[2])"), b8),
       {"tensor 't': missing field 'data_offsets'"}},
      {"unexpected field",
       raw_file(one(R"("dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1)"), b8),
       {"tensor 't': unexpected field 'x'"}},
      {"dtype ditto lacks",
       raw_file(one(R"("dtype":"I16","shape":[4],"data_offsets":[0,8])"), b8),
       {"tensor 't': dtype: I16 is a safetensors dtype ditto cannot hold"}},
      {"huge shape",
       raw_file(one(R"("dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8])"), b8),
       {"tensor 't': shape: ", "more than 2^63 - 1 elements"}},
      {"begin after end",
       raw_file(one(R"("dtype":"F32","shape":[0],"data_offsets":[8,4])"), b8),
       {"got [8, 4]"}},
      {"size mismatch",
       raw_file(one(R"("dtype":"F32","shape":[3],"data_offsets":[0,8])"), b8),
       {"tensor 't': data_offsets: [0, 8] hold 8 bytes, but shape [3] x F32 needs 3 x 4 bytes"}},
      {"overlap",
       raw_file("{" + f32("a", 2, 0, 8) + "," + f32("b", 2, 4, 12) + "}", b12),
       {"tensor 'b': data_offsets: [4, 12] overlap tensor 'a'"}},
      {"gap",
       raw_file("{" + f32("a", 1, 0, 4) + "," + f32("b", 1, 8, 12) + "}", b12),
       {"tensor 'b': data_offsets: begin 8 leaves a gap in the buffer after byte 4"}},
      {"buffer not covered",
       raw_file("{" + f32("t", 1, 0, 4) + "}", b8),
       {"buffer: the tensors cover 4 bytes, but the buffer after the header has 8 bytes"}},
      {"metadata not strings",
       raw_file(R"({"__metadata__":{"a":1}})", ""),
       {"__metadata__: key 'a': expected a string value, got 1"}},
      {"metadata not object",
       raw_file(R"({"__metadata__":[]})", ""),
       {"__metadata__: expected an object of strings"}},
  };
  for (const Malformed& c : cases) {
    SCOPED_TRACE(c.what);
    expect_throw<ParseError>([&] { io::safetensors_parse(c.bytes, "f.st"); }, c.message);
  }
  // The valid entry of tensor 't' (F32, shape [2], data_offsets [0,8] of an 8-byte buffer) with
  // one field's value replaced: refused naming the tensor, the field and the problem.
  struct BadValue {
    const char* field;
    const char* value;
    const char* problem;
  };
  const BadValue bad_values[] = {
      {"dtype", R"("F33")", "unknown dtype 'F33'"},
      {"dtype", "4", "expected a string"},
      {"shape", "[-2]", "expected non-negative integer sizes, got [-2]"},
      {"shape", "[2.0]", "expected non-negative integer sizes"},
      {"data_offsets", "[0]", "expected [begin, end]"},
      {"data_offsets", "[0,16]", "expected begin <= end <= 8 (the buffer size), got [0, 16]"},
  };
  for (const BadValue& b : bad_values) {
    const std::string field = b.field;
    std::map<std::string, std::string> entry = {
        {"dtype", R"("F32")"}, {"shape", "[2]"}, {"data_offsets", "[0,8]"}};
    entry[field] = b.value;
    SCOPED_TRACE(field + " " + b.value);
    const std::string fields = R"("dtype":)" + entry["dtype"] + R"(,"shape":)" + entry["shape"] +
                               R"(,"data_offsets":)" + entry["data_offsets"];
    expect_throw<ParseError>([&] { io::safetensors_parse(raw_file(one(fields), b8), "f.st"); },
                             {"tensor 't': " + field + ": " + b.problem});
  }
  // Valid edge cases: header padded with spaces, no tensors, an empty tensor.
  EXPECT_TRUE(io::safetensors_parse(raw_file("{}      ", ""), "f").tensors.empty());
  EXPECT_EQ(io::safetensors_parse(
                raw_file(one(R"("dtype":"I64","shape":[0,3],"data_offsets":[0,0])"), ""), "f")
                .tensors.at(0)
                .second.shape(),
            (Shape{0, 3}));
}

// No input makes the parser crash or throw anything but ParseError: every truncation of a valid
// file is refused, every single-byte change of its header is parsed or refused.
TEST(Safetensors, EveryTruncationRefusedEveryHeaderByteFlipParsedOrRefused) {
  const std::string good =
      io::safetensors_serialize({{"w", Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2})},
                                 {"i", Tensor::from_vector(std::vector<std::int64_t>{5}, {})}},
                                {{"k", "v"}});
  for (std::size_t n = 0; n < good.size(); ++n) {
    SCOPED_TRACE(n);
    EXPECT_THROW(io::safetensors_parse(std::string_view(good).substr(0, n), "f"), ParseError);
  }
  std::uint64_t header = 0;
  for (int b = 0; b < 8; ++b)
    header |= std::uint64_t(static_cast<unsigned char>(good[b])) << (8 * b);
  int refused = 0;
  for (std::size_t at = 0; at < 8 + header; ++at) {
    for (unsigned char flip : {0x01, 0x20, 0x80}) {
      std::string bad = good;
      bad[at] = static_cast<char>(bad[at] ^ flip);
      try {
        io::safetensors_parse(bad, "f");
      } catch (const ParseError&) {
        ++refused;
      }
    }
  }
  EXPECT_GT(refused, static_cast<int>(header));  // most changes break the header
}

TEST(Safetensors, LoadNamesTheFile) {
  const std::string dir = fresh_dir("load");
  expect_throw<ParseError>([&] { io::load_safetensors(dir + "/none.safetensors"); },
                           {"cannot open '" + dir + "/none.safetensors'"});
  std::ofstream(dir + "/bad.safetensors") << "xyz";
  expect_throw<ParseError>([&] { io::load_safetensors(dir + "/bad.safetensors"); },
                           {dir + "/bad.safetensors: file too short: 3 bytes"});
}

TEST(Safetensors, SerializeRefusesBadNames) {
  Tensor t = Tensor::from_vector(std::vector<float>{1}, {1});
  expect_throw<InvalidArgument>(
      [&] {
        io::safetensors_serialize({{"a", t}, {"a", t}});
      },
      {"tensors[1] ('a'): the name appears more than once"});
  expect_throw<InvalidArgument>(
      [&] {
        io::safetensors_serialize({{"__metadata__", t}});
      },
      {"'__metadata__' is reserved"});
  expect_throw<InvalidArgument>(
      [&] {
        io::safetensors_serialize({{"", t}});
      },
      {"tensors[0]: expected a non-empty name"});
  expect_throw<InvalidArgument>(
      [&] {
        io::safetensors_serialize({{"u", Tensor()}});
      },
      {"tensors[0] ('u'): expected a defined tensor"});
}

// ---- checkpoints --------------------------------------------------------------------------

class CheckpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    BackendOptions o;
    o.device_count = 4;
    init_backend("sim", o);
  }
  void TearDown() override { io::set_write_hook_for_testing({}); }
  static Device dev(int i = 0) { return Device("sim", i); }
};

enum class Opt { sgd_momentum, sgd_nesterov, adam, adam_amsgrad };

std::unique_ptr<optim::Optimizer> make_opt(Opt k, nn::Module& m) {
  if (k == Opt::adam || k == Opt::adam_amsgrad) {
    optim::AdamOptions o;
    o.lr = 0.01;
    o.weight_decay = 0.001;
    o.amsgrad = k == Opt::adam_amsgrad;
    return std::make_unique<optim::Adam>(m.parameters(), o);
  }
  optim::SGDOptions o;
  o.lr = 0.05f;
  o.momentum = 0.9f;
  o.weight_decay = 0.001f;
  o.nesterov = k == Opt::sgd_nesterov;
  return std::make_unique<optim::SGD>(m.parameters(), o);
}

data::Dataset synthetic(std::int64_t n, std::int64_t f, std::int64_t classes) {
  return test::synthetic_classes(n, f, classes, /*seed=*/9, /*sub=*/30, /*shift=*/1.0f);
}

// A small training run: MLP 6-10-3 on 45 samples, batch 8 (6 batches per epoch, the last one of
// 5), 3 epochs, bitwise. It stops after `stop_at` steps (-1: never) with a checkpoint in `dir`,
// or starts from `dir`'s checkpoint when `resume`. Returns every parameter's bytes.
struct RunSpec {
  Opt opt = Opt::sgd_momentum;
  std::int64_t stop_at = -1;
  std::string dir = {};
  bool resume = false;
  bool params_only = false;  // resume the parameters and position, not the optimizer state
};

std::vector<unsigned char> train(const RunSpec& r) {
  data::Dataset ds = synthetic(45, 6, 3);
  auto model = nn::mlp({6, 10, 3}, Device("sim", 0), 11);
  model->set_determinism(Determinism::bitwise);
  nn::CrossEntropyLoss loss;
  loss.set_determinism(Determinism::bitwise);
  auto opt = make_opt(r.opt, *model);
  data::DataLoader loader(ds, 8, /*shuffle=*/true, /*seed=*/4);
  TrainerState ts;
  ts.seed = 4;
  ts.config = {{"model", "1"}};
  std::ostringstream log;
  if (r.resume) ts = resume_checkpoint(r.dir, *model, *opt, ts.config, {}, log);
  if (r.params_only) {
    Checkpoint c = read_latest_checkpoint(r.dir, log);
    for (std::size_t i = 0; i < c.params.size(); ++i)
      model->parameters()[i]->data.copy_(c.params[i].second);
    ts = c.state;
  }
  for (std::int64_t e = ts.epoch; e < 3; ++e) {
    loader.set_epoch(e, ts.batch);
    for (std::int64_t i = ts.batch; i < loader.size(); ++i) {
      data::Batch b = loader.batch(i);
      test::train_step(*model, loss, b.x.to(Device("sim", 0)), b.y, opt.get());
      ts.advance(loader.size(), 0, 0);
      if (ts.step == r.stop_at) {
        save_checkpoint(r.dir, *model, *opt, ts);
        return {};
      }
    }
  }
  std::vector<unsigned char> out;
  for (nn::Parameter* p : model->parameters()) {
    auto b = tensor_bytes(p->data);
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

class ResumeEqualsUninterrupted : public CheckpointTest,
                                  public ::testing::WithParamInterface<std::tuple<Opt, int>> {};

// verify_checkpoint_crc (also used by safetensors-info): true for a checkpoint's file as written,
// false for a file without "ditto.crc32", ParseError naming the file when the data changed.
TEST(Checkpoint, VerifyCrcAcceptsAWrittenFileRefusesAChangedOneIgnoresOtherFiles) {
  BackendOptions o;
  o.device_count = 1;
  init_backend("sim", o);
  auto model = nn::mlp({3, 4, 2}, Device("sim", 0), 2);
  auto opt = make_opt(Opt::sgd_momentum, *model);
  TrainerState ts;
  ts.step = 3;
  const std::string ck = save_checkpoint(fresh_dir("crc"), *model, *opt, ts);
  const std::string path = ck + "/model.safetensors";
  io::SafetensorsData d = io::load_safetensors(path);
  EXPECT_TRUE(verify_checkpoint_crc(path, d));

  float* w = d.tensors.front().second.data<float>();
  w[0] += 1.0f;
  expect_throw<ParseError>(
      [&] { verify_checkpoint_crc(path, d); },
      {path + ": checksum mismatch: the tensor data has CRC-32 ",
       ", the file records " + d.metadata.at("ditto.crc32") + " (damaged file)"});
  d.metadata.erase("ditto.crc32");
  EXPECT_FALSE(verify_checkpoint_crc(path, d));
}

TEST_P(ResumeEqualsUninterrupted, SameParameterBits) {
  const auto [opt, stop_at] = GetParam();
  const std::vector<unsigned char> whole = train({.opt = opt});
  ASSERT_FALSE(whole.empty());
  const std::string dir =
      fresh_dir("resume" + std::to_string(int(opt)) + "_" + std::to_string(stop_at));
  train({.opt = opt, .stop_at = stop_at, .dir = dir});
  const std::vector<unsigned char> resumed = train({.opt = opt, .dir = dir, .resume = true});
  EXPECT_EQ(resumed, whole);
  // The comparison can fail: without the optimizer's state the bits differ.
  EXPECT_NE(train({.opt = opt, .dir = dir, .params_only = true}), whole);
}

std::string resume_case_name(const ::testing::TestParamInfo<std::tuple<Opt, int>>& info) {
  static const char* const names[] = {"SgdMomentum", "SgdNesterov", "Adam", "AdamAmsgrad"};
  return std::string(names[static_cast<int>(std::get<0>(info.param))]) +
         (std::get<1>(info.param) == 6 ? "_EpochBoundary" : "_MidEpoch");
}

// 6 steps: the end of epoch 1; 9: mid-epoch 2 (its batch 3 of 6).
INSTANTIATE_TEST_SUITE_P(Checkpoint, ResumeEqualsUninterrupted,
                         ::testing::Combine(::testing::Values(Opt::sgd_momentum, Opt::sgd_nesterov,
                                                              Opt::adam, Opt::adam_amsgrad),
                                            ::testing::Values(6, 9)),
                         resume_case_name);

TEST_F(CheckpointTest, OptimizerStateRoundTripsExactly) {
  for (Opt k : {Opt::sgd_momentum, Opt::adam_amsgrad}) {
    auto model = nn::mlp({3, 4, 2}, dev(1), 2);
    auto opt = make_opt(k, *model);
    EXPECT_TRUE(opt->state_dict().tensors.empty());  // no step yet, no state
    for (int s = 0; s < 3; ++s) {
      for (nn::Parameter* p : model->parameters())
        p->grad = Tensor::full(p->data.shape(), 0.25f * (s + 1), dev(1));
      opt->step();
    }
    optim::OptimizerState st = opt->state_dict();
    EXPECT_EQ(st.tensors.size(), k == Opt::adam_amsgrad ? 4u * 4u : 4u);
    auto model2 = nn::mlp({3, 4, 2}, dev(1), 2);
    auto opt2 = make_opt(k, *model2);
    opt2->load_state_dict(st);
    optim::OptimizerState st2 = opt2->state_dict();
    ASSERT_EQ(st2.tensors.size(), st.tensors.size());
    for (std::size_t i = 0; i < st.tensors.size(); ++i) {
      EXPECT_EQ(st2.tensors[i].first, st.tensors[i].first);
      EXPECT_EQ(tensor_bytes(st2.tensors[i].second), tensor_bytes(st.tensors[i].second));
    }
    EXPECT_EQ(st2.options, st.options);
    if (k == Opt::adam_amsgrad) {
      EXPECT_EQ(static_cast<optim::Adam&>(*opt2).step_count(0), 3);
      EXPECT_EQ(st.options.at("lr"), "0.01");
    } else {
      EXPECT_EQ(st.tensors[0].first, "state.0.momentum_buffer");
      EXPECT_EQ(st.options.at("momentum"), "0.899999976");  // 0.9f, exactly
    }
  }
}

TEST_F(CheckpointTest, OptimizerLoadRefusesMismatches) {
  auto model = nn::mlp({3, 4, 2}, dev(0), 2);
  optim::SGD sgd(model->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  for (nn::Parameter* p : model->parameters()) p->grad = Tensor::full(p->data.shape(), 1, dev(0));
  sgd.step();
  optim::OptimizerState st = sgd.state_dict();
  optim::Adam adam(model->parameters());
  expect_throw<InvalidArgument>([&] { adam.load_state_dict(st); },
                                {"optim::Adam::load_state_dict: state: expected the state of a "
                                 "Adam optimizer, got one of SGD"});
  optim::SGD other_lr(model->parameters(), {.lr = 0.2f, .momentum = 0.9f});
  expect_throw<InvalidArgument>([&] { other_lr.load_state_dict(st); },
                                {"option lr differs: saved lr=0.100000001, this SGD has "
                                 "lr=0.200000003"});
  optim::SGD same(model->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  optim::OptimizerState bad = st;
  bad.tensors[0].second = Tensor::zeros({5}, DType::f32, Device::cpu());
  expect_throw<InvalidArgument>([&] { same.load_state_dict(bad); },
                                {"tensor 'state.0.momentum_buffer': expected [4, 3] f32 "
                                 "(the shape of parameter 0 '0.weight'), got [5] f32"});
  bad = st;
  bad.tensors[0].first = "state.7.momentum_buffer";
  expect_throw<InvalidArgument>([&] { same.load_state_dict(bad); },
                                {"unexpected tensor 'state.7.momentum_buffer'"});
  bad = st;
  bad.tensors[0].first = "state.0.exp_avg";
  expect_throw<InvalidArgument>([&] { same.load_state_dict(bad); },
                                {"unexpected tensor 'state.0.exp_avg'"});
  EXPECT_FALSE(same.momentum_buffer(0).defined());  // refused: nothing changed
}

// A checkpoint directory with two checkpoints (steps 6 and 9) of the SGD run.
std::string two_checkpoints(const std::string& name) {
  const std::string dir = fresh_dir(name);
  train({.stop_at = 6, .dir = dir});
  train({.stop_at = 9, .dir = dir});
  return dir;
}

void flip_byte(const std::string& path, std::int64_t from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(from_end, std::ios::end);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x01);
  f.seekp(from_end, std::ios::end);
  f.write(&c, 1);
}

TEST_F(CheckpointTest, LayoutAndKeepLastTwo) {
  const std::string dir = fresh_dir("keep");
  train({.stop_at = 3, .dir = dir});
  train({.stop_at = 6, .dir = dir});
  train({.stop_at = 9, .dir = dir});
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "lock", "step-00000006", "step-00000009"}));
  EXPECT_EQ(io::read_file(dir + "/latest"), "step-00000009\n");
  Checkpoint c = read_checkpoint(dir + "/step-00000009");
  EXPECT_EQ(c.state.step, 9);
  EXPECT_EQ(c.state.epoch, 1);
  EXPECT_EQ(c.state.batch, 3);
  EXPECT_EQ(c.state.seed, 4u);
  EXPECT_EQ(c.optimizer.type, "SGD");
  ASSERT_EQ(c.params.size(), 4u);
  EXPECT_EQ(c.params[0].first, "0.weight");
  EXPECT_EQ(c.params[0].second.shape(), (Shape{10, 6}));
  EXPECT_EQ(c.params[3].first, "2.bias");
  io::SafetensorsData m = io::load_safetensors(dir + "/step-00000009/model.safetensors");
  EXPECT_EQ(m.metadata.at("ditto.step"), "9");
  EXPECT_EQ(m.metadata.at("ditto.crc32").size(), 8u);
}

TEST_F(CheckpointTest, FlippedByteRefusedWithChecksumMismatch) {
  const std::string dir = two_checkpoints("flip");
  const std::string model = dir + "/step-00000009/model.safetensors";
  flip_byte(model, -1);  // the last byte of the last tensor
  expect_throw<ParseError>(
      [&] { read_checkpoint(dir + "/step-00000009"); },
      {model + ": checksum mismatch: the tensor data has CRC-32 ", "(damaged file)"});
  const std::string trainer = dir + "/step-00000006/trainer.json";
  std::string text = io::read_file(trainer);
  text.replace(text.find("\"step\": 6"), 9, "\"step\": 7");
  std::ofstream(trainer, std::ios::trunc) << text;
  expect_throw<ParseError>([&] { read_checkpoint(dir + "/step-00000006"); },
                           {trainer + ": checksum mismatch"});
}

TEST_F(CheckpointTest, TruncatedFileRefused) {
  const std::string dir = two_checkpoints("trunc");
  const std::string opt = dir + "/step-00000009/optimizer.safetensors";
  fs::resize_file(opt, fs::file_size(opt) - 10);
  expect_throw<ParseError>([&] { read_checkpoint(dir + "/step-00000009"); }, {opt + ": "});
  fs::resize_file(opt, 4);
  expect_throw<ParseError>([&] { read_checkpoint(dir + "/step-00000009"); },
                           {opt + ": file too short: 4 bytes"});
  fs::remove(dir + "/step-00000006/model.safetensors");
  expect_throw<ParseError>([&] { read_checkpoint(dir + "/step-00000006"); },
                           {"model.safetensors: missing (an incomplete checkpoint)"});
}

TEST_F(CheckpointTest, DamagedLatestFallsBackToPreviousThenFailsClearly) {
  const std::string dir = two_checkpoints("fallback");
  flip_byte(dir + "/step-00000009/model.safetensors", -5);
  std::ostringstream log;
  Checkpoint c = read_latest_checkpoint(dir, log);
  EXPECT_EQ(c.state.step, 6);
  EXPECT_NE(log.str().find("checkpoint '" + dir + "/step-00000009' is unusable: "),
            std::string::npos)
      << log.str();
  EXPECT_NE(log.str().find("checksum mismatch"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("falling back to '" + dir + "/step-00000006'"), std::string::npos)
      << log.str();
  // Resuming from the previous checkpoint still gives the uninterrupted run's bits.
  EXPECT_EQ(train({.dir = dir, .resume = true}), train({}));

  fs::resize_file(dir + "/step-00000006/optimizer.safetensors", 100);
  std::ostringstream log2;
  expect_throw<Error>(
      [&] { read_latest_checkpoint(dir, log2); },
      {"resume: no usable checkpoint in '" + dir + "':", "step-00000009", "step-00000006"});
  expect_throw<Error>([&] { read_latest_checkpoint(dir + "/nope", log2); },
                      {"resume: checkpoint directory '" + dir + "/nope' does not exist"});
}

// Symbolic links planted in a checkpoint directory are replaced (or refused), never followed: a
// `latest`, `latest.tmp`, `step-N` or `lock` link pointing at a decoy file outside the directory
// left the decoy overwritten with "step-00000003" or a pid (issue 31's newcomer report).
TEST_F(CheckpointTest, SymlinksInTheDirectoryAreReplacedNeverFollowed) {
  const std::string decoys = fresh_dir("links-decoys");
  fs::create_directories(decoys + "/old-step");
  for (const char* f : {"/decoy", "/decoy2", "/old-step/keep"})
    std::ofstream(decoys + f) << "precious\n";
  const std::string dir = fresh_dir("links");
  fs::create_directories(dir);
  fs::create_symlink(decoys + "/decoy", dir + "/latest");
  fs::create_symlink(decoys + "/decoy2", dir + "/latest.tmp");
  fs::create_symlink(decoys + "/old-step", dir + "/step-00000003");
  fs::create_symlink(decoys + "/decoy2", dir + "/step-00000003.tmp");
  train({.stop_at = 3, .dir = dir});
  for (const char* f : {"/decoy", "/decoy2", "/old-step/keep"})
    EXPECT_EQ(io::read_file(decoys + f), "precious\n") << f;
  EXPECT_EQ(fs::symlink_status(dir + "/latest").type(), fs::file_type::regular);
  EXPECT_EQ(io::read_file(dir + "/latest"), "step-00000003\n");
  EXPECT_EQ(fs::symlink_status(dir + "/step-00000003").type(), fs::file_type::directory);
  // Not ditto's: left as it is (Note [Atomic write]), the decoy it points at untouched.
  EXPECT_TRUE(fs::is_symlink(dir + "/latest.tmp"));
  EXPECT_TRUE(test::temp_leftovers(dir).empty());

  // Reading: a `latest` link is ignored (said so), and the step directories are scanned.
  fs::remove(dir + "/latest");
  std::ofstream(decoys + "/names-nothing") << "step-00000099\n";
  fs::create_symlink(decoys + "/names-nothing", dir + "/latest");
  std::ostringstream log;
  EXPECT_EQ(read_latest_checkpoint(dir, log).state.step, 3);
  EXPECT_NE(log.str().find("'" + dir +
                           "/latest' is a symbolic link, not the file ditto writes "
                           "(ignored); trying the checkpoints in"),
            std::string::npos)
      << log.str();

  // The lock file: a link there is refused, naming it, and its target keeps its content.
  const std::string locked = fresh_dir("links-lock");
  fs::create_directories(locked);
  fs::create_symlink(decoys + "/decoy", locked + "/lock");
  expect_throw<Error>([&] { train({.stop_at = 3, .dir = locked}); },
                      {"checkpoint: the lock file '" + locked + "/lock' is a symbolic link"});
  EXPECT_EQ(io::read_file(decoys + "/decoy"), "precious\n");
}

// --resume DIR/step-N (tester4: "no step-N directory"; --init-from took that path): that
// checkpoint, not DIR/latest's, and no fallback when it is unusable (it was asked for).
TEST_F(CheckpointTest, AStepDirectoryIsReadAsThatCheckpointOnly) {
  const std::string dir = fresh_dir("step_dir");
  train({.stop_at = 3, .dir = dir});
  train({.stop_at = 6, .dir = dir});
  std::ostringstream log;
  EXPECT_EQ(read_latest_checkpoint(dir, log).state.step, 6);
  EXPECT_EQ(read_latest_checkpoint(dir + "/step-00000003", log).state.step, 3);
  EXPECT_EQ(read_latest_checkpoint(dir + "/step-00000003/", log).state.step, 3);
  EXPECT_EQ(log.str(), "");
  fs::resize_file(dir + "/step-00000003/model.safetensors", 10);
  expect_throw<Error>([&] { read_latest_checkpoint(dir + "/step-00000003", log); },
                      {"resume: checkpoint '" + dir + "/step-00000003' is unusable: ",
                       "(to fall back to an older one, pass its directory '" + dir + "')"});
}

TEST_F(CheckpointTest, CrashInTheMiddleOfAWriteLeavesThePreviousCheckpoint) {
  const std::string dir = fresh_dir("crash");
  train({.stop_at = 6, .dir = dir});
  // The next checkpoint dies halfway through its model file (as SIGKILL would stop it; the
  // ditto-train test in tests/CMakeLists.txt really kills the process).
  int calls = 0;
  io::set_write_hook_for_testing(
      [&](const std::string& path, std::size_t written, std::size_t total) {
        ++calls;
        EXPECT_LT(written, total);
        if (path.find("model.safetensors") != std::string::npos) throw std::runtime_error("crash");
      });
  EXPECT_THROW(train({.stop_at = 9, .dir = dir}), std::runtime_error);
  io::set_write_hook_for_testing({});
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(fs::exists(dir + "/step-00000009"));  // no partial checkpoint under a final name
  EXPECT_FALSE(fs::exists(dir + "/step-00000009.tmp/model.safetensors"));
  EXPECT_EQ(io::read_file(dir + "/latest"), "step-00000006\n");
  std::ostringstream log;
  EXPECT_EQ(read_latest_checkpoint(dir, log).state.step, 6);
  EXPECT_EQ(log.str(), "");
  EXPECT_EQ(train({.dir = dir, .resume = true}), train({}));
  // The next save replaces the stray temporary directory.
  train({.stop_at = 9, .dir = dir});
  EXPECT_TRUE(fs::exists(dir + "/step-00000009/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/step-00000009.tmp"));
}

TEST_F(CheckpointTest, ResumeRefusesAnotherModelOrOptimizerBeforeChangingAnything) {
  const std::string dir = two_checkpoints("mismatch");
  auto model = nn::mlp({6, 12, 3}, dev(0), 11);
  auto opt = make_opt(Opt::sgd_momentum, *model);
  const auto before = tensor_bytes(model->parameters()[0]->data);
  std::ostringstream log;
  expect_throw<InvalidArgument>(
      [&] {
        resume_checkpoint(dir, *model, *opt, {{"model", "1"}}, {}, log);
      },
      {"resume: ", "model.safetensors: parameter '0.weight': expected [12, 6] f32 (the model's), "
                   "got [10, 6] f32"});
  expect_throw<InvalidArgument>(
      [&] {
        resume_checkpoint(dir, *model, *opt, {{"model", "6-12-3"}}, {}, log);
      },
      {"resume: checkpoint '" + dir +
       "/step-00000009' was saved with model=1, this run has "
       "model=6-12-3"});
  auto model2 = nn::mlp({6, 10, 3}, dev(0), 11);
  auto adam = make_opt(Opt::adam, *model2);
  const auto before2 = tensor_bytes(model2->parameters()[0]->data);
  expect_throw<InvalidArgument>(
      [&] {
        resume_checkpoint(dir, *model2, *adam, {{"model", "1"}}, {}, log);
      },
      {"expected the state of a Adam optimizer, got one of SGD"});
  EXPECT_EQ(tensor_bytes(model->parameters()[0]->data), before);
  EXPECT_EQ(tensor_bytes(model2->parameters()[0]->data), before2);
  // A key the checkpoint has but this run does not, and one allowed to differ.
  expect_throw<InvalidArgument>([&] { resume_checkpoint(dir, *model2, *adam, {}, {}, log); },
                                {"was saved with model=1, a setting this run does not have"});
  auto sgd = make_opt(Opt::sgd_momentum, *model2);
  EXPECT_EQ(resume_checkpoint(dir, *model2, *sgd, {{"model", "2"}}, {"model"}, log).step, 9);
}

// Issue 31 item 10: an edited header (a dtype F32 -> I32, every size kept) passes the tensor
// bytes' CRC; trainer.json's CRC-32 of each header (format version 2) makes it unusable as
// flipped data bits do, so the resume falls back to the previous checkpoint (it was a hard
// error: the model's parameter had the wrong dtype).
TEST_F(CheckpointTest, EditedHeaderFallsBackToThePreviousCheckpoint) {
  const std::string dir = two_checkpoints("header");
  const std::string model = dir + "/step-00000009/model.safetensors";
  std::string bytes = io::read_file(model);
  const std::size_t at = bytes.find("\"F32\"");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 1] = 'I';  // "I32": same length, same byte size per element
  std::ofstream(model, std::ios::binary | std::ios::trunc) << bytes;
  expect_throw<ParseError>([&] { read_checkpoint(dir + "/step-00000009"); },
                           {model + ": checksum mismatch: the safetensors header has CRC-32 ",
                            "trainer.json records", "(damaged or edited file)"});
  std::ostringstream log;
  EXPECT_EQ(read_latest_checkpoint(dir, log).state.step, 6);
  EXPECT_NE(log.str().find("falling back to '" + dir + "/step-00000006'"), std::string::npos)
      << log.str();
  EXPECT_EQ(train({.dir = dir, .resume = true}), train({}));
  // The optimizer's header too.
  const std::string opt = dir + "/step-00000006/optimizer.safetensors";
  bytes = io::read_file(opt);
  const std::size_t type = bytes.find("\"SGD\"");
  ASSERT_NE(type, std::string::npos);
  bytes[type + 1] = 'T';
  std::ofstream(opt, std::ios::binary | std::ios::trunc) << bytes;
  expect_throw<ParseError>([&] { read_checkpoint(dir + "/step-00000006"); },
                           {opt + ": checksum mismatch: the safetensors header has CRC-32 "});
}

// zlib's CRC-32 (the polynomial 0xEDB88320), bit by bit, for the trainer.json rewritten below.
std::string crc32_hex(const std::string& s) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", c ^ 0xFFFFFFFFu);
  return buf;
}

// Format version 1 (before the header CRCs) still loads, its headers unchecked; a version this
// ditto does not know is refused, naming the versions it reads.
TEST_F(CheckpointTest, VersionOneCheckpointsStillLoad) {
  const std::string dir = two_checkpoints("version1");
  const std::string trainer = dir + "/step-00000009/trainer.json";
  auto rewrite = [&](int version) {
    nlohmann::json j = nlohmann::json::parse(io::read_file(trainer));
    EXPECT_EQ(j.at("version"), 2);
    EXPECT_TRUE(j.at("header_crc32").contains("model.safetensors"));
    j.erase("crc32");
    j.erase("header_crc32");
    j["version"] = version;
    j["crc32"] = crc32_hex(j.dump());
    return j;
  };
  const std::string v2 = io::read_file(trainer);
  const std::string v1 = rewrite(1).dump(1) + "\n";  // read before the stream truncates it
  std::ofstream(trainer, std::ios::trunc) << v1;
  Checkpoint c = read_checkpoint(dir + "/step-00000009");
  EXPECT_EQ(c.state.step, 9);
  EXPECT_EQ(train({.dir = dir, .resume = true}), train({}));
  std::ofstream(trainer, std::ios::trunc) << v2;
  const std::string v3 = rewrite(3).dump(1) + "\n";
  std::ofstream(trainer, std::ios::trunc) << v3;
  expect_throw<ParseError>([&] { read_checkpoint(dir + "/step-00000009"); },
                           {"expected format 'ditto-checkpoint' version 1..2, got "
                            "\"ditto-checkpoint\" version 3"});
}

// Issue 31 item 11: rotation that cannot remove an old checkpoint says so on stderr (it said
// nothing while the disk filled). An immutable file (chattr +i) stops even root's removal.
TEST_F(CheckpointTest, RotationThatCannotDeleteWarns) {
  const std::string dir = fresh_dir("rotate");
  train({.stop_at = 3, .dir = dir});
  train({.stop_at = 6, .dir = dir});
  const std::string old = dir + "/step-00000003", pinned = old + "/trainer.json";
  const bool immutable = std::system(("chattr +i '" + pinned + "' 2>/dev/null").c_str()) == 0;
  if (!immutable) {
    if (::geteuid() == 0) GTEST_SKIP() << "chattr +i is not available and root removes anything";
    fs::permissions(old, fs::perms::owner_read | fs::perms::owner_exec);
  }
  testing::internal::CaptureStderr();
  train({.stop_at = 9, .dir = dir});
  const std::string err = testing::internal::GetCapturedStderr();
  if (immutable)
    EXPECT_EQ(std::system(("chattr -i '" + pinned + "'").c_str()), 0);
  else
    fs::permissions(old, fs::perms::owner_all);
  EXPECT_NE(err.find("ditto: save_checkpoint: warning: cannot remove the old checkpoint '" + old +
                     "' (keeping the 2 newest): "),
            std::string::npos)
      << err;
  EXPECT_TRUE(fs::exists(dir + "/step-00000009/trainer.json"));
  EXPECT_EQ(io::read_file(dir + "/latest"), "step-00000009\n");
}

// The value a side does not record (an f32 run records no dtype) is named as implied, and a
// model's name "gpt(k=v,...)" that differs names the first differing field by its option.
TEST_F(CheckpointTest, ResumeNamesImpliedValuesAndModelFields) {
  const std::string dir = two_checkpoints("implied");
  auto model = nn::mlp({6, 10, 3}, dev(0), 11);
  auto opt = make_opt(Opt::sgd_momentum, *model);
  std::ostringstream log;
  expect_throw<InvalidArgument>(
      [&] {
        resume_checkpoint(dir, *model, *opt, {{"model", "1"}, {"dtype", "bf16"}}, {}, log, {},
                          {{"dtype", "f32"}});
      },
      {"was saved with dtype=f32, this run has dtype=bf16"});
  // The checkpoint's model "1" against a structured one: the whole values.
  expect_throw<InvalidArgument>(
      [&] {
        resume_checkpoint(dir, *model, *opt, {{"model", "m(a=1,dropout=0)"}}, {}, log);
      },
      {"was saved with model=1, this run has model=m(a=1,dropout=0)"});
}

TEST_F(CheckpointTest, SaveRefusesBadArguments) {
  auto model = nn::mlp({2, 2}, dev(0), 1);
  auto opt = make_opt(Opt::sgd_momentum, *model);
  const std::string dir = fresh_dir("args");
  expect_throw<InvalidArgument>([&] { save_checkpoint(dir, *model, *opt, {}, 0); },
                                {"save_checkpoint: keep: expected >= 1, got 0"});
  TrainerState ts;
  ts.batch = -1;
  expect_throw<InvalidArgument>([&] { save_checkpoint(dir, *model, *opt, ts); },
                                {"save_checkpoint: state: expected non-negative"});
  std::ofstream(dir + "/file") << "x";
  expect_throw<Error>([&] { save_checkpoint(dir + "/file/sub", *model, *opt, {}); },
                      {"save_checkpoint: cannot create directory '" + dir + "/file/sub'"});
}

TEST(TrainerStateTest, AdvanceMovesToTheNextBatchAndEpoch) {
  TrainerState ts;
  ts.advance(3, 1.5, 8);
  EXPECT_EQ(ts.step, 1);
  EXPECT_EQ(ts.epoch, 0);
  EXPECT_EQ(ts.batch, 1);
  EXPECT_EQ(ts.epoch_loss_sum, 1.5);
  EXPECT_EQ(ts.epoch_samples, 8);
  ts.advance(3, 2.5, 16);
  ts.advance(3, 3.5, 20);  // the epoch's last batch
  EXPECT_EQ(ts.step, 3);
  EXPECT_EQ(ts.epoch, 1);
  EXPECT_EQ(ts.batch, 0);
  EXPECT_EQ(ts.epoch_loss_sum, 0.0);
  EXPECT_EQ(ts.epoch_samples, 0);
}

TEST(DataLoaderResume, StartBatchContinuesTheSameShuffle) {
  data::Dataset ds = synthetic(45, 6, 3);
  data::DataLoader a(ds, 8, true, 4), b(ds, 8, true, 4);
  a.set_epoch(2);
  b.set_epoch(2, 4);
  EXPECT_EQ(b.start_batch(), 4);
  std::vector<std::vector<float>> from_a, from_b;
  std::int64_t i = 0;
  for (data::Batch x : a)
    if (i++ >= 4) from_a.push_back(x.x.to_vector<float>());
  for (data::Batch x : b) from_b.push_back(x.x.to_vector<float>());
  EXPECT_EQ(from_b.size(), 2u);
  EXPECT_EQ(from_b, from_a);
  b.set_epoch(3);
  EXPECT_EQ(b.start_batch(), 0);
  b.set_epoch(3, 6);  // past the last batch: an empty rest of the epoch
  EXPECT_TRUE(b.begin() == b.end());
  expect_throw<InvalidArgument>([&] { b.set_epoch(3, 7); },
                                {"data::DataLoader::set_epoch: start_batch: expected a batch in "
                                 "[0, 6] (batches per epoch), got 7"});
}

}  // namespace
}  // namespace ditto
