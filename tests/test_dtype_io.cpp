// Every dtype through safetensors and checkpoints: a file holding one tensor of each of the 12
// dtypes (safetensors' names F32, I64, F64, F16, BF16, I8, U8, I32, U32, U64, F8_E4M3, F8_E5M2)
// reads back with the same dtypes, shapes and bytes and carries those names in its header;
// dtypes ditto cannot hold are still refused naming the tensor; a checkpoint of a model with a
// parameter of every dtype restores every dtype and its bytes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/checkpoint/checkpoint.h"
#include "core/io/safetensors.h"
#include "core/nn/module.h"
#include "core/optim/sgd.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;
using DtypeIo = test::SimSuite<2>;
namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) { return test::fresh_dir("dtype_io", name); }

// [2, k] of dtype t with varied bit patterns (every byte differs).
Tensor patterned(DType t, std::int64_t k, unsigned seed) {
  Tensor h = Tensor::empty({2, k}, t, Device::cpu());
  auto* p = static_cast<std::uint8_t*>(h.data_ptr());
  for (std::size_t i = 0; i < h.nbytes(); ++i) p[i] = static_cast<std::uint8_t>(seed * 31 + i * 7);
  return h;
}

TEST_F(DtypeIo, SafetensorsRoundTripEveryDtype) {
  std::vector<std::pair<std::string, Tensor>> ts;
  unsigned seed = 1;
  for (DType t : kAllDTypes)
    ts.emplace_back(std::string("t_") + dtype_name(t),
                    patterned(t, 3, seed++).to(Device("sim", 1)));
  const std::string bytes = io::safetensors_serialize(ts);
  for (DType t : kAllDTypes)
    EXPECT_NE(bytes.find(std::string("\"dtype\":\"") + io::safetensors_dtype(t) + "\""),
              std::string::npos)
        << io::safetensors_dtype(t);
  EXPECT_STREQ(io::safetensors_dtype(DType::bf16), "BF16");
  EXPECT_STREQ(io::safetensors_dtype(DType::f8_e4m3), "F8_E4M3");
  const io::SafetensorsData d = io::safetensors_parse(bytes, "mem");
  ASSERT_EQ(d.tensors.size(), ts.size());
  for (std::size_t i = 0; i < ts.size(); ++i) {
    EXPECT_EQ(d.tensors[i].first, ts[i].first);
    EXPECT_EQ(d.tensors[i].second.dtype(), ts[i].second.dtype());
    EXPECT_EQ(d.tensors[i].second.shape(), (Shape{2, 3}));
    EXPECT_EQ(tensor_bytes(d.tensors[i].second), tensor_bytes(ts[i].second)) << ts[i].first;
  }
  for (DType t : kAllDTypes) {
    DType back = DType::f32;
    ASSERT_TRUE(io::dtype_from_safetensors(io::safetensors_dtype(t), back));
    EXPECT_EQ(back, t);
  }
  DType unused = DType::f32;
  EXPECT_FALSE(io::dtype_from_safetensors("BOOL", unused));
  // Still refused: a dtype of the format that ditto has no DType for.
  const std::string header = R"({"t":{"dtype":"U16","shape":[2],"data_offsets":[0,4]}})";
  std::string file(8, '\0');
  const std::uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  file += header + std::string(4, '\0');
  EXPECT_THROW_MSG(io::safetensors_parse(file, "f.safetensors"), ParseError,
                   "f.safetensors: tensor 't': dtype: U16 is a safetensors dtype ditto cannot hold "
                   "(expected one of F32, I64, F64, F16, BF16, I8, U8, I32, U32, U64, F8_E4M3, "
                   "F8_E5M2)");
}

// Found by a newcomer: a metadata value nested 100,000 deep crashed the parser's error message
// (recursive dump(), SIGSEGV) and a long one made a message of hundreds of kilobytes; a shape
// nested likewise too. Now the message names the value's kind and size.
TEST_F(DtypeIo, DeeplyNestedHeaderValuesGiveAShortParseError) {
  auto file_of = [](const std::string& header) {
    std::string file(8, '\0');
    const std::uint64_t n = header.size();
    std::memcpy(file.data(), &n, 8);
    return file + header;
  };
  const int depth = 100000;
  const std::string nested = std::string(depth, '[') + std::string(depth, ']');
  const std::string m = expect_error<ParseError>(
      [&] {
        io::safetensors_parse(file_of(R"({"__metadata__":{"k":)" + nested + "}}"), "m.safetensors");
      },
      "key 'k': expected a string value, got an array of 1 elements");
  EXPECT_LT(m.size(), 300u);
  EXPECT_THROW_MSG(
      io::safetensors_parse(
          file_of(R"({"t":{"dtype":"F32","shape":[)" + nested + R"(],"data_offsets":[0,0]}})"),
          "s.safetensors"),
      ParseError, "shape: expected non-negative integer sizes, got an array of 1 elements");
}

// Invalid UTF-8 in a name or metadata made nlohmann's type_error escape (std::terminate for a
// caller that catches ditto::Error); now an InvalidArgument.
TEST_F(DtypeIo, InvalidUtf8NamesAreAnInvalidArgument) {
  Tensor t = Tensor::zeros({2}, DType::bf16, Device::cpu());
  EXPECT_THROW_MSG(io::safetensors_serialize({{"a\xff", t}}, {}), InvalidArgument,
                   "io::safetensors_serialize: tensors / metadata: expected names, keys and values "
                   "in valid UTF-8");
  EXPECT_THROW_MSG(io::safetensors_serialize({{"a", t}}, {{"k", "\xc3"}}), InvalidArgument,
                   "valid UTF-8");
}

// A module whose parameters are one tensor of each dtype (a mixed-precision model's state).
class EveryDtype final : public nn::Module {
 public:
  explicit EveryDtype(unsigned seed) {
    for (DType t : kAllDTypes)
      params_.push_back(
          {std::string("w_") + dtype_name(t), patterned(t, 4, seed++).to(Device("sim", 0)), {}});
  }
  std::string name() const override { return "EveryDtype"; }
  Tensor backward(const Tensor&) override { return {}; }
  std::vector<nn::Parameter*> parameters() override {
    std::vector<nn::Parameter*> out;
    for (auto& p : params_) out.push_back(&p);
    return out;
  }
  std::unique_ptr<Module> clone() const override { return std::make_unique<EveryDtype>(0); }

 private:
  std::vector<nn::Parameter> params_;
};

TEST_F(DtypeIo, CheckpointKeepsEveryParametersDtypeAndBytes) {
  EveryDtype saved(5), restored(50);
  // The optimizer holds the f32 parameter (optimizers are f32-only); the others ride along.
  std::vector<nn::Parameter*> f32s = {saved.parameters()[0]};
  optim::SGD opt(f32s, optim::SGDOptions{});
  TrainerState ts;
  ts.step = 3;
  const std::string dir = fresh_dir("ckpt");
  const std::string path = save_checkpoint(dir, saved, opt, ts);
  const Checkpoint c = read_checkpoint(path);
  ASSERT_EQ(c.params.size(), kNumDTypes);
  for (std::size_t i = 0; i < c.params.size(); ++i) {
    EXPECT_EQ(c.params[i].first, saved.parameters()[i]->name);
    EXPECT_EQ(c.params[i].second.dtype(), kAllDTypes[i]);
    EXPECT_EQ(tensor_bytes(c.params[i].second), tensor_bytes(saved.parameters()[i]->data));
  }
  std::vector<nn::Parameter*> f32r = {restored.parameters()[0]};
  optim::SGD opt2(f32r, optim::SGDOptions{});
  std::ostringstream log;
  resume_checkpoint(dir, restored, opt2, {}, {}, log);
  for (std::size_t i = 0; i < kNumDTypes; ++i) {
    EXPECT_EQ(restored.parameters()[i]->data.dtype(), kAllDTypes[i]);
    EXPECT_EQ(tensor_bytes(restored.parameters()[i]->data),
              tensor_bytes(saved.parameters()[i]->data))
        << restored.parameters()[i]->name;
  }
}

}  // namespace
}  // namespace ditto
