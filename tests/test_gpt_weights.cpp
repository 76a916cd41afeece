// io::gpt_weights (issue 32, weights): llm.c model files, Hugging Face GPT-2 safetensors and ditto
// checkpoints read into nn::GPT, checked against PyTorch; llm.c / Hugging Face files written and
// read back; every malformed file refused with a ParseError naming the file and what was
// expected. tests/data/gpt2_tiny/ is written by `tools/gpt2_fixtures.py make`: a tiny GPT-2 (2
// layers, 4 heads, n_embd 32, block_size 64, vocab 512, biases) as model_f32.bin /
// model_bf16.bin (llm.c) and hf/model.safetensors (+ hf/config.json), and expected.safetensors:
// a fixed batch and PyTorch's logits and loss (f32 weights; and computed in f32 with the weights
// rounded to bf16, what model_bf16.bin holds). Within 1e-5 relative: max |logits - torch's| <=
// 1e-5 x max |torch's logits|, |loss - torch's| <= 1e-5 x torch's loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/gpt_weights.h"
#include "core/io/file.h"
#include "core/io/safetensors.h"
#include "core/nn/gpt.h"
#include "core/nn/loss.h"
#include "core/optim/sgd.h"
#include "core/train/trainer.h"
#include "tests/test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;
namespace fs = std::filesystem;

const std::string kDir = std::string(DITTO_TEST_DATA_DIR) + "/gpt2_tiny";

std::string read_bytes(const std::string& path) { return io::read_file(path); }

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// The f32 values of a tensor (host copy); not `values`: test_mixed_precision.cpp has one, and
/// the unity batches of the check build may put both files in one translation unit.
std::vector<float> f32_values(const Tensor& t) {
  return t.to(Device::cpu(), DType::f32).to_vector<float>();
}

class GptWeights : public SimSuite<1> {
 protected:
  void SetUp() override {
    dev_ = devices("sim", 1)[0];
    expected_ = io::load_safetensors(kDir + "/expected.safetensors");
    dir_ = fresh_dir("GptWeights", ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  const Tensor& want(const std::string& name) const {
    const Tensor* t = expected_.find(name);
    if (t == nullptr) throw std::runtime_error("expected.safetensors has no " + name);
    return *t;
  }
  /// nn::GPT of w's config with w's parameters, on the sim device.
  std::unique_ptr<nn::GPT> model(const io::GptWeights& w) {
    auto gpt = std::make_unique<nn::GPT>(w.config, dev_, 0);
    io::load_gpt_params(*gpt, w);
    return gpt;
  }
  /// Forward of the fixed batch against logits_<which> / loss_<which>.
  void check_against_torch(const io::GptWeights& w, const std::string& which) {
    auto gpt = model(w);
    const Tensor logits = gpt->forward(want("idx").to(dev_));
    nn::CrossEntropyLoss ce;
    const float loss = ce.forward(logits, want("targets").to(dev_)).item();
    const std::vector<float> got = f32_values(logits), ref = f32_values(want("logits_" + which));
    ASSERT_EQ(got.size(), ref.size());
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(got[i]) - ref[i]));
      scale = std::max(scale, std::abs(static_cast<double>(ref[i])));
    }
    EXPECT_LE(worst, 1e-5 * scale)
        << which << ": max |logits - torch's| " << worst << ", max |torch's| " << scale;
    const float ref_loss = want("loss_" + which).item();
    EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss) << which;
  }
  /// A ditto checkpoint under dir_/ck of the fixture's model_f32.bin at step 3, its model
  /// described as ditto-train describes it (st: the state saved); returns the step's directory.
  std::string save_tiny_checkpoint(TrainerState& st) {
    auto gpt = model(io::load_gpt_weights(kDir + "/model_f32.bin"));
    optim::SGD opt(gpt->parameters(), optim::SGDOptions{});
    st.step = 3;
    st.config["model"] =
        "gpt(n_layer=2,n_head=4,n_embd=32,block_size=64,vocab_size=512,bias=True,dropout=0)";
    return save_checkpoint(dir_ + "/ck", *gpt, opt, st, 2,
                           {{"lm_head.weight", "transformer.wte.weight"}});
  }
  void expect_tiny_config(const io::GptWeights& w) {
    EXPECT_EQ(w.config.n_layer, 2);
    EXPECT_EQ(w.config.n_head, 4);
    EXPECT_EQ(w.config.n_embd, 32);
    EXPECT_EQ(w.config.block_size, 64);
    EXPECT_EQ(w.config.vocab_size, 512);
    EXPECT_TRUE(w.config.bias);
  }
  Device dev_;
  io::SafetensorsData expected_;
  std::string dir_;
};

TEST_F(GptWeights, SpecsAreNnGptsParametersInOrder) {
  for (bool bias : {false, true}) {
    const nn::GPTConfig c{
        .block_size = 8, .vocab_size = 11, .n_layer = 2, .n_head = 2, .n_embd = 8, .bias = bias};
    nn::GPT gpt(c, dev_, 0);
    const auto specs = io::gpt_param_specs(c);
    const auto ps = gpt.parameters();
    ASSERT_EQ(specs.size(), ps.size());
    for (std::size_t i = 0; i < ps.size(); ++i) {
      EXPECT_EQ(specs[i].first, ps[i]->name);
      EXPECT_EQ(specs[i].second, ps[i]->data.shape()) << ps[i]->name;
    }
  }
}

// io::gpt_param_specs of n_layer -1 returned specs (of no block): nn::check_config refuses it.
TEST_F(GptWeights, SpecsOfAConfigNoGptCanHaveAreRefused) {
  nn::GPTConfig c{.block_size = 8, .vocab_size = 11, .n_layer = -1, .n_head = 2, .n_embd = 8};
  expect_invalid(
      [&] { io::gpt_param_specs(c); },
      "io::gpt_param_specs: GPTConfig: n_layer: expected in [1, 2^46) (the init streams' "
      "layer ids fit in 48 bits), got -1");
  c.n_layer = 0;
  expect_invalid([&] { io::gpt_param_specs(c); }, "n_layer: expected in [1, 2^46)");
  c.n_layer = 1, c.n_embd = -8;
  expect_invalid([&] { io::gpt_param_specs(c); },
                 "io::gpt_param_specs: GPTConfig: n_embd: expected a positive multiple of n_head");
  c.n_embd = 8, c.vocab_size = 0;
  expect_invalid([&] { io::gpt_param_specs(c); },
                 "io::gpt_param_specs: GPTConfig: vocab_size: expected >= 1, got 0");
}

// NaN / inf weights loaded and trained silently: every format is refused naming the file, the
// parameter by nanoGPT's key and the first bad element's index (nanoGPT's layout, also for
// Hugging Face's transposed Conv1D weights), whatever the file's dtype.
TEST_F(GptWeights, NonFiniteWeightsAreRefusedNamingTheFileTheParameterAndTheIndex) {
  const io::GptWeights w = io::load_gpt_weights(kDir + "/model_f32.bin");
  // A copy of w's parameters with `v` at [row, col] of parameter `k` (and a later one too).
  auto with = [&](std::size_t k, std::int64_t row, std::int64_t col, float v) {
    auto ps = w.params;
    for (auto& [n, t] : ps) t = t.clone();
    const Tensor& t = ps[k].second;
    t.data<float>()[row * (t.dim() == 2 ? t.size(1) : 1) + col] = v;
    t.data<float>()[t.numel() - 1] = v;
    return ps;
  };
  const std::string finite =
      ": expected finite weights (the parameter by nanoGPT's state_dict key, the index of its "
      "first non-finite element in nanoGPT's layout)";
  std::size_t c_fc = 0, qkv = 0, ln_f_bias = 0;
  for (std::size_t k = 0; k < w.params.size(); ++k) {
    if (w.params[k].first == "transformer.h.1.mlp.c_fc.weight") c_fc = k;
    if (w.params[k].first == "transformer.h.0.attn.c_attn.weight") qkv = k;
    if (w.params[k].first == "transformer.ln_f.bias") ln_f_bias = k;
  }
  ASSERT_GT(c_fc * qkv * ln_f_bias, 0u);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // llm.c, f32 and bf16.
  const std::string f32 = dir_ + "/nan_f32.bin", bf16 = dir_ + "/inf_bf16.bin";
  io::save_llmc_model(f32, w.config, with(c_fc, 3, 5, nan), DType::f32);
  expect_error<ParseError>([&] { io::load_gpt_weights(f32); },
                           "io::load_gpt_weights: '" + f32 +
                               "': 'transformer.h.1.mlp.c_fc.weight' [3, 5] is nan" + finite);
  io::save_llmc_model(bf16, w.config, with(0, 0, 0, inf), DType::bf16);
  expect_error<ParseError>(
      [&] { io::load_gpt_weights(bf16); },
      "io::load_gpt_weights: '" + bf16 + "': 'transformer.wte.weight' [0, 0] is inf" + finite);
  // Hugging Face's safetensors: c_attn stored as Conv1D [32, 96], named in nanoGPT's [96, 32].
  const std::string hf = dir_ + "/ninf.safetensors";
  io::save_hf_gpt2(hf, w.config, with(qkv, 70, 2, -inf));
  expect_error<ParseError>([&] { io::load_gpt_weights(hf); },
                           "io::load_gpt_weights: '" + hf +
                               "': 'transformer.h.0.attn.c_attn.weight' [70, 2] is -inf" + finite);
  // nanoGPT's layout in f16.
  std::vector<std::pair<std::string, Tensor>> f16;
  for (const auto& [n, t] : with(ln_f_bias, 0, 7, nan)) f16.emplace_back(n, t.to(DType::f16));
  const std::string st = dir_ + "/nan_f16.safetensors";
  io::save_safetensors(st, f16, {{"ditto.n_head", "4"}});
  expect_error<ParseError>(
      [&] { io::load_gpt_weights(st); },
      "io::load_gpt_weights: '" + st + "': 'transformer.ln_f.bias' [7] is nan" + finite);
  // The unchanged weights load.
  io::save_hf_gpt2(hf, w.config, w.params);
  EXPECT_EQ(io::load_gpt_weights(hf).params.size(), w.params.size());
}

TEST_F(GptWeights, LlmcF32MatchesPyTorch) {
  const io::GptWeights w = io::load_gpt_weights(kDir + "/model_f32.bin");
  EXPECT_EQ(w.format, io::GptWeightsFormat::llmc);
  EXPECT_EQ(w.description, "llm.c model file (f32, version 3)");
  expect_tiny_config(w);
  check_against_torch(w, "f32");
}

// The bf16 file against PyTorch's f32 forward of the bf16-rounded weights (what the file holds).
TEST_F(GptWeights, LlmcBf16MatchesPyTorchOnTheRoundedWeights) {
  const io::GptWeights w = io::load_gpt_weights(kDir + "/model_bf16.bin");
  EXPECT_EQ(w.description, "llm.c model file (bf16, version 5)");
  expect_tiny_config(w);
  check_against_torch(w, "bf16");
}

TEST_F(GptWeights, HuggingFaceMatchesPyTorch) {
  const io::GptWeights w = io::load_gpt_weights(kDir + "/hf/model.safetensors");
  EXPECT_EQ(w.format, io::GptWeightsFormat::hf);
  EXPECT_NE(w.n_head_from.find("config.json"), std::string::npos) << w.n_head_from;
  expect_tiny_config(w);
  check_against_torch(w, "f32");
  // The same bits as the llm.c f32 file's.
  const io::GptWeights l = io::load_gpt_weights(kDir + "/model_f32.bin");
  for (std::size_t i = 0; i < w.params.size(); ++i)
    EXPECT_EQ(f32_values(w.params[i].second), f32_values(l.params[i].second)) << w.params[i].first;
}

// Names with the "transformer." prefix, a tied lm_head.weight, n_head from --n-head (no
// config.json beside the file): the same model.
TEST_F(GptWeights, HuggingFacePrefixedNamesAndTiedHead) {
  io::SafetensorsData d = io::load_safetensors(kDir + "/hf/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> t;
  for (auto& [n, x] : d.tensors) t.emplace_back("transformer." + n, x);
  t.emplace_back("lm_head.weight", *d.find("wte.weight"));
  const std::string path = dir_ + "/prefixed.safetensors";
  io::save_safetensors(path, t);
  expect_error<InvalidArgument>([&] { io::load_gpt_weights(path); },
                                "does not record n_head (the number of attention heads): "
                                "expected --n-head, a config.json beside it");
  try {  // the user's terms only: no internal name
    io::load_gpt_weights(path);
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()).find("n_head_hint"), std::string::npos) << e.what();
  }
  const io::GptWeights w = io::load_gpt_weights(path, 4);
  EXPECT_TRUE(w.n_head_from.empty());
  expect_tiny_config(w);
  check_against_torch(w, "f32");
}

// Issue 29 (4): a nanoGPT state_dict saved from its compiled model (torch.compile's
// "_orig_mod.", nanoGPT's default) or its DDP-wrapped one ("module.") was refused ("expected a
// tensor 'transformer.wte.weight' ..., got none"): the prefixes are taken off, as nanoGPT's
// train.py does, the head included.
TEST_F(GptWeights, TorchCompileAndDdpPrefixesAreTakenOff) {
  io::SafetensorsData d = io::load_safetensors(kDir + "/hf/model.safetensors");
  for (const std::string prefix : {"_orig_mod.", "module.", "module._orig_mod."}) {
    std::vector<std::pair<std::string, Tensor>> t;
    for (auto& [n, x] : d.tensors) t.emplace_back(prefix + "transformer." + n, x);
    t.emplace_back(prefix + "lm_head.weight", *d.find("wte.weight"));
    const std::string path = dir_ + "/compiled.safetensors";
    io::save_safetensors(path, t);
    const io::GptWeights w = io::load_gpt_weights(path, 4);
    expect_tiny_config(w);
    EXPECT_EQ(w.params[0].first, "transformer.wte.weight") << prefix;
    if (prefix == "_orig_mod.") check_against_torch(w, "f32");
  }
}

// llm.c's padded vocabulary: rows [vocab_size, padded_vocab_size) are dropped (llm.c never reads
// them); the writer pads to a multiple of 128 with zeros.
TEST_F(GptWeights, LlmcPaddedVocabularyRowsAreDropped) {
  io::GptWeights w = io::load_gpt_weights(kDir + "/model_f32.bin");
  nn::GPTConfig c = w.config;
  c.vocab_size = 500;
  std::vector<float> wte = f32_values(w.params[0].second);
  wte.resize(500 * 32);
  w.params[0].second = Tensor::from_vector(wte, {500, 32});
  const std::string bytes = io::llmc_model_serialize(c, w.params, DType::f32);
  std::int32_t h[8];
  std::memcpy(h, bytes.data(), sizeof h);
  EXPECT_EQ(h[3], 500);
  EXPECT_EQ(h[7], 512);
  const std::string path = dir_ + "/padded.bin";
  write_bytes(path, bytes);
  const io::GptWeights r = io::load_gpt_weights(path);
  EXPECT_EQ(r.config.vocab_size, 500);
  EXPECT_EQ(r.padded_vocab_size, 512);
  EXPECT_EQ(f32_values(r.params[0].second), wte);
  // The padded rows are zeros in the file.
  const std::size_t wte_end = 1024 + std::size_t{512} * 32 * 4;
  for (std::size_t i = 1024 + std::size_t{500} * 32 * 4; i < wte_end; ++i)
    ASSERT_EQ(bytes[i], 0) << "byte " << i;
}

// Writing then reading gives the same parameters, bit for bit (bf16: the rounded ones), and the
// f32 file written from the fixture is the fixture's own bytes.
TEST_F(GptWeights, ExportRoundTrips) {
  const io::GptWeights w = io::load_gpt_weights(kDir + "/model_f32.bin");
  EXPECT_EQ(io::llmc_model_serialize(w.config, w.params, DType::f32),
            read_bytes(kDir + "/model_f32.bin"));
  EXPECT_EQ(io::llmc_model_serialize(w.config, w.params, DType::bf16),
            read_bytes(kDir + "/model_bf16.bin"));
  io::save_hf_gpt2(dir_ + "/m.safetensors", w.config, w.params);
  const io::GptWeights h = io::load_gpt_weights(dir_ + "/m.safetensors");
  EXPECT_EQ(h.format, io::GptWeightsFormat::hf);
  EXPECT_EQ(h.n_head_from, "its __metadata__ ditto.n_head");
  expect_tiny_config(h);
  for (std::size_t i = 0; i < w.params.size(); ++i)
    EXPECT_EQ(f32_values(h.params[i].second), f32_values(w.params[i].second)) << w.params[i].first;
  // Hugging Face's names and Conv1D shapes in the file.
  const io::SafetensorsData d = io::load_safetensors(dir_ + "/m.safetensors");
  ASSERT_NE(d.find("transformer.h.1.mlp.c_fc.weight"), nullptr);
  EXPECT_EQ(d.find("transformer.h.1.mlp.c_fc.weight")->shape(), (Shape{32, 128}));
  EXPECT_EQ(d.metadata.at("format"), "pt");
  io::save_llmc_model(dir_ + "/m.bin", w.config, w.params, DType::f32);
  EXPECT_EQ(read_bytes(dir_ + "/m.bin"), read_bytes(kDir + "/model_f32.bin"));
}

// A ditto checkpoint directory: its parameters and its model's configuration.
TEST_F(GptWeights, DittoCheckpointDirectory) {
  TrainerState st;
  const std::string ck = save_tiny_checkpoint(st);
  for (const std::string& path : {dir_ + "/ck", ck}) {
    const io::GptWeights r = io::load_gpt_weights(path);
    EXPECT_EQ(r.format, io::GptWeightsFormat::checkpoint);
    expect_tiny_config(r);
    check_against_torch(r, "f32");
  }
  // A checkpoint of another model.
  TrainerState mlp = st;
  mlp.config["model"] = "64-128-10";
  auto gpt = model(io::load_gpt_weights(kDir + "/model_f32.bin"));
  optim::SGD opt(gpt->parameters(), optim::SGDOptions{});
  save_checkpoint(dir_ + "/mlp", *gpt, opt, mlp);
  expect_error<ParseError>([&] { io::load_gpt_weights(dir_ + "/mlp"); },
                           "expected a checkpoint of a GPT (ditto-train --model gpt), got one of "
                           "model '64-128-10'");
}

// Session 56 (B1): a checkpoint of a run on a text records its vocabulary (trainer.json's
// "vocab"), which load_gpt_weights returns from the directory and from its model.safetensors
// (Note [Checkpoint vocabulary]); a run on token files records none; a malformed one is refused.
TEST_F(GptWeights, ACheckpointsVocabularyIsReadWithItsWeights) {
  TrainerState st;
  const std::string none = save_tiny_checkpoint(st);
  EXPECT_TRUE(io::load_gpt_weights(none).vocab.empty());
  EXPECT_TRUE(io::load_gpt_weights(none + "/model.safetensors").vocab.empty());
  st.step = 4;
  st.config["vocab"] = "0a20217a";
  const std::string ck = save_tiny_checkpoint(st);
  for (const std::string& path : {dir_ + "/ck", ck, ck + "/model.safetensors"}) {
    const io::GptWeights r = io::load_gpt_weights(path);
    EXPECT_EQ(r.vocab, (std::vector<unsigned char>{'\n', ' ', '!', 'z'})) << path;
    EXPECT_EQ(r.vocab_from, ck + "/trainer.json") << path;
  }
  st.step = 5;
  st.config["vocab"] = "0a200a";
  const std::string twice = save_tiny_checkpoint(st);
  expect_error<ParseError>([&] { io::load_gpt_weights(twice); },
                           "io::load_gpt_weights: '" + twice +
                               "/trainer.json': config vocab: expected distinct bytes in "
                               "lowercase hex, at most the model's vocab_size = 512 of them, got "
                               "'0a200a'");
}

// A checkpoint's own DIR/step-N/model.safetensors (nanoGPT's layout, no n_head in it, not a
// GPT-2 size): n_head from the trainer.json beside it, no --n-head needed (issue 32, K06).
TEST_F(GptWeights, CheckpointModelFileTakesNHeadFromTrainerJson) {
  TrainerState st;
  const std::string ck = save_tiny_checkpoint(st);
  const io::GptWeights r = io::load_gpt_weights(ck + "/model.safetensors");
  EXPECT_EQ(r.format, io::GptWeightsFormat::nanogpt);
  EXPECT_EQ(r.n_head_from, ck + "/trainer.json");
  expect_tiny_config(r);
  check_against_torch(r, "f32");
}

// A config.json beside the file that is not JSON (or not an object) is refused naming it, not
// ignored (issue 32, J02: it then failed on "does not record n_head").
TEST_F(GptWeights, MalformedConfigJsonIsRefusedNamingIt) {
  fs::copy_file(kDir + "/hf/model.safetensors", dir_ + "/model.safetensors");
  const std::string path = dir_ + "/model.safetensors", cfg = dir_ + "/config.json";
  write_bytes(cfg, "{\"n_head\": 4,");
  expect_error<ParseError>([&] { io::load_gpt_weights(path); },
                           "io::load_gpt_weights: '" + cfg + "' (the config.json beside '" + path +
                               "'): could not be parsed as JSON: ");
  write_bytes(cfg, "[4]");
  expect_error<ParseError>([&] { io::load_gpt_weights(path); }, "(the config.json beside '" + path +
                                                                    "'): expected a JSON object, "
                                                                    "got array");
  write_bytes(cfg, "{\"n_head\": 4}");
  EXPECT_EQ(io::load_gpt_weights(path).config.n_head, 4);
}

// Issue 29 (5): only n_head of a config.json beside the file was read; one that describes another
// model (architecture, activation, LayerNorm epsilon, attention scaling, or sizes that contradict
// the tensors) is refused naming the key, what was expected and what it says.
TEST_F(GptWeights, ConfigJsonOfAnotherModelIsRefusedNamingTheKey) {
  fs::copy_file(kDir + "/hf/model.safetensors", dir_ + "/model.safetensors");
  const std::string path = dir_ + "/model.safetensors", cfg = dir_ + "/config.json";
  const std::string head =
      "io::load_gpt_weights: '" + cfg + "' (the config.json beside '" + path + "'): ";
  const std::pair<std::string, std::string> cases[] = {
      {R"("model_type": "llama")",
       R"(model_type: expected "gpt2" (ditto's GPT is GPT-2's architecture), got "llama")"},
      {R"("activation_function": "relu")",
       R"(activation_function: expected "gelu_new", "gelu_pytorch_tanh" or "gelu_fast" (GPT-2's tanh GELU, the only activation ditto computes), got "relu")"},
      // tester4 (3): transformers' "gelu" is the exact erf GELU; it was taken and computed with
      // the tanh form.
      {R"("activation_function": "gelu")",
       R"(activation_function: expected "gelu_new", "gelu_pytorch_tanh" or "gelu_fast" (GPT-2's tanh GELU, the only activation ditto computes), got "gelu" (transformers' exact erf GELU, nn.GELU(): ditto would compute this model with the tanh GELU, another function; if it was trained with the tanh GELU, set "gelu_new" in the config.json))"},
      {R"("activation_function": "gelu_python")",
       R"(activation_function: expected "gelu_new", "gelu_pytorch_tanh" or "gelu_fast" (GPT-2's tanh GELU, the only activation ditto computes), got "gelu_python" (transformers' exact erf GELU)"},
      {R"("activation_function": "quick_gelu")",
       R"(activation_function: expected "gelu_new", "gelu_pytorch_tanh" or "gelu_fast" (GPT-2's tanh GELU, the only activation ditto computes), got "quick_gelu")"},
      {R"("layer_norm_epsilon": 1e-6)",
       "layer_norm_epsilon: expected 1e-05 (GPT-2's and ditto's LayerNorm epsilon), got 1e-06"},
      {R"("scale_attn_weights": false)",
       "scale_attn_weights: expected true (attention scores scaled by 1/sqrt(head size), as GPT-2), got false"},
      // Session 56 (B2): transformers divides layer i's scores by i + 1 with this flag; the
      // key was ignored. An n_inner other than c_fc's 4 x n_embd was taken too.
      {R"("scale_attn_by_inverse_layer_idx": true, "reorder_and_upcast_attn": true)",
       "scale_attn_by_inverse_layer_idx: expected false (GPT-2's attention; true also divides "
       "layer i's scores by i + 1, which ditto does not compute), got true"},
      {R"("n_inner": 64)",
       "n_inner: expected null or 128 (4 x n_embd: the width of the tensors' mlp.c_fc, the only "
       "MLP width ditto's GPT has), got 64"},
      {R"("n_layer": 12)", "n_layer: expected 2 (the tensors' n_layer), got 12"},
      {R"("n_embd": 768)", "n_embd: expected 32 (the tensors' n_embd), got 768"},
      {R"("n_positions": 1024)",
       "n_positions: expected 64 (the tensors' block_size, wpe's rows), got 1024"},
      {R"("vocab_size": 50257)", "vocab_size: expected 512 (the tensors' vocab_size), got 50257"}};
  for (const auto& [entry, message] : cases) {
    write_bytes(cfg, "{\"n_head\": 4, " + entry + "}");
    expect_invalid([&] { io::load_gpt_weights(path); }, head + message);
  }
  // GPT-2's own values (the tiny fixture's config.json has them) load, with each of
  // transformers' names of the tanh GELU.
  for (const char* act : {"gelu_new", "gelu_pytorch_tanh", "gelu_fast"}) {
    write_bytes(
        cfg,
        std::string(R"({"n_head": 4, "model_type": "gpt2", "activation_function": ")") + act + R"(",
                       "layer_norm_epsilon": 1e-05, "scale_attn_weights": true, "n_layer": 2,
                       "n_embd": 32, "n_positions": 64, "vocab_size": 512})");
    expect_tiny_config(io::load_gpt_weights(path));
  }
  // Keys that leave the causal LM's function as GPT-2's: accepted (Note [GPT-2 config.json]).
  write_bytes(cfg, R"({"n_head": 4, "n_inner": 128, "scale_attn_by_inverse_layer_idx": false,
                       "reorder_and_upcast_attn": true, "add_cross_attention": true,
                       "attn_pdrop": 0.1, "n_ctx": 1024})");
  expect_tiny_config(io::load_gpt_weights(path));
  write_bytes(cfg, R"({"n_head": 4, "n_inner": null})");
  expect_tiny_config(io::load_gpt_weights(path));
}

// A folder that is not a checkpoint: a Hugging Face download folder (model.safetensors +
// config.json) loads its model file; another is refused suggesting the file, and says nothing of
// a checkpoint's 'latest' (issue 32, I38).
TEST_F(GptWeights, HuggingFaceFolderLoadsItsModelFile) {
  const io::GptWeights w = io::load_gpt_weights(kDir + "/hf");
  EXPECT_EQ(w.format, io::GptWeightsFormat::hf);
  EXPECT_EQ(w.n_head_from, kDir + "/hf/config.json");
  expect_tiny_config(w);
  check_against_torch(w, "f32");
  fs::create_directories(dir_ + "/empty");
  ::testing::internal::CaptureStderr();
  expect_error<ParseError>(
      [&] { io::load_gpt_weights(dir_ + "/empty"); },
      "io::load_gpt_weights: '" + dir_ +
          "/empty': expected a ditto "
          "checkpoint directory (DIR/latest, DIR/step-N) or a folder with a "
          "model.safetensors (Hugging Face's), got a folder with neither: pass "
          "the model file itself (DIR/model.safetensors, an llm.c .bin)");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

// ---- malformed llm.c files: each a ParseError naming the file and what was expected ----------

class GptWeightsMalformed : public GptWeights {
 protected:
  std::string f32_ = read_bytes(kDir + "/model_f32.bin");
  std::string with_header(int index, std::int32_t v) const {
    std::string b = f32_;
    std::memcpy(b.data() + 4 * index, &v, 4);
    return b;
  }
  void expect_refused(const std::string& bytes, const std::string& part) {
    const std::string path = dir_ + "/bad.bin";
    write_bytes(path, bytes);
    // The file named first, then what was expected.
    expect_error<ParseError>([&] { io::load_gpt_weights(path); },
                             "io::load_gpt_weights: '" + path + "': ");
    expect_error<ParseError>([&] { io::load_gpt_weights(path); }, part);
  }
};

TEST_F(GptWeightsMalformed, BadMagic) {
  expect_refused(with_header(0, 20240520),
                 "expected an llm.c model file (int32 magic 20240326 first), a safetensors "
                 "file or a checkpoint directory; as safetensors: ");
}

TEST_F(GptWeightsMalformed, WrongVersion) {
  expect_refused(with_header(1, 4), "header[1] (version): expected 3 (f32) or 5 (bf16), got 4");
  expect_refused(with_header(1, 1), "header[1] (version): expected 3 (f32) or 5 (bf16), got 1 "
                                    "(an llm.c file from before the padded vocabulary");
}

TEST_F(GptWeightsMalformed, HeaderSizesThatDoNotFit) {
  expect_refused(with_header(4, 0), "header[4] (num_layers): expected >= 1, got 0");
  expect_refused(with_header(7, 500), "header[7] (padded_vocab_size): expected >= vocab_size = "
                                      "512, got 500");
  expect_refused(with_header(5, 5),
                 "the model it describes is not one ditto's GPT can be: "
                 "GPTConfig: n_embd: expected a positive multiple of n_head = 5");
  // Sizes that fit each other but not the file: 3 layers in the header of a 2-layer file.
  expect_refused(with_header(4, 3), "the header (f32, max_seq_len 64, vocab_size 512 padded to "
                                    "512, 3 layers, 4 heads, channels 32) describes 56608 "
                                    "parameters: expected a file of 227456 bytes, got 176640 "
                                    "bytes (truncated)");
}

// Sizes whose parameter count passes 2^64 (tester hB, 7): in 64 bits (C = 2^30, L = 2^28, ...)
// 4 x n wrapped to 0, so the header-only file of 1024 bytes passed the size check and the read
// then failed "ended after 1024 bytes, expected 3458764230352700416"; every field 2^31 - 1
// printed a wrapped count. Now the count and the bytes are exact and refused against the file.
TEST_F(GptWeightsMalformed, HeaderSizesPastTwoToThe64AreRefusedWithTheirTrueCount) {
  auto header = [](std::int32_t T, std::int32_t V, std::int32_t L, std::int32_t H, std::int32_t C,
                   std::int32_t Vp) {
    std::vector<std::int32_t> h(256, 0);
    h[0] = 20240326;
    h[1] = 3;
    h[2] = T;
    h[3] = V;
    h[4] = L;
    h[5] = H;
    h[6] = C;
    h[7] = Vp;
    return std::string(reinterpret_cast<const char*>(h.data()), 1024);
  };
  expect_refused(header(64, 512, 1 << 28, 1, 1 << 30, 805306302),
                 "the header (f32, max_seq_len 64, vocab_size 512 padded to 805306302, 268435456 "
                 "layers, 1 heads, channels 1073741824) describes 3713820122467826843124760576 "
                 "parameters: expected a file of 14855280489871307372499043328 bytes, got 1024 "
                 "bytes (more than any file holds: sizes no model file has)");
  const std::int32_t m = std::numeric_limits<std::int32_t>::max();
  expect_refused(header(m, m, m, m, m, m),
                 "describes 118842243674551100020520648705 parameters: expected a file of "
                 "475368974698204400082082595844 bytes, got 1024 bytes (more than any file "
                 "holds");
}

TEST_F(GptWeightsMalformed, TruncatedOrTooLong) {
  expect_refused(f32_.substr(0, f32_.size() - 4), "expected a file of 176640 bytes, got 176636 "
                                                  "bytes (truncated)");
  expect_refused(f32_ + "x", "expected a file of 176640 bytes, got 176641 bytes (bytes past the "
                             "parameters)");
  expect_refused(f32_.substr(0, 100), "an llm.c model file starts with a header of 256 int32 "
                                      "(1024 bytes), got a file of 100 bytes (truncated)");
  // bf16 header on the f32 file's bytes: twice as long as described.
  expect_refused(with_header(1, 5), "expected a file of 88832 bytes, got 176640 bytes (bytes "
                                    "past the parameters)");
}

// ---- malformed safetensors ----------------------------------------------------------------------

class GptWeightsBadSafetensors : public GptWeights {
 protected:
  std::vector<std::pair<std::string, Tensor>> hf_ =
      io::load_safetensors(kDir + "/hf/model.safetensors").tensors;
  void expect_refused(const std::vector<std::pair<std::string, Tensor>>& t,
                      const std::string& part) {
    const std::string path = dir_ + "/bad.safetensors";
    io::save_safetensors(path, t, {{"ditto.n_head", "4"}});
    expect_error<ParseError>([&] { io::load_gpt_weights(path); },
                             "io::load_gpt_weights: '" + path + "': " + part);
  }
  void replace(const std::string& name, Tensor t) {
    for (auto& [n, x] : hf_)
      if (n == name) x = std::move(t);
  }
};

TEST_F(GptWeightsBadSafetensors, UnknownName) {
  hf_.emplace_back("h.0.attn.rotary.weight", Tensor::zeros({4}, DType::f32, Device::cpu()));
  expect_refused(hf_, "unknown tensor 'h.0.attn.rotary.weight' [4]: expected GPT-2's names (wte, "
                      "wpe, h.0..h.1, ln_f, with biases)");
}

TEST_F(GptWeightsBadSafetensors, ExtraLayerOutOfOrderIsUnknown) {
  hf_.emplace_back("h.5.ln_1.weight", Tensor::zeros({32}, DType::f32, Device::cpu()));
  expect_refused(hf_, "unknown tensor 'h.5.ln_1.weight'");
}

TEST_F(GptWeightsBadSafetensors, WrongShape) {
  replace("h.1.mlp.c_proj.weight", Tensor::zeros({32, 128}, DType::f32, Device::cpu()));
  expect_refused(hf_, "'h.1.mlp.c_proj.weight': expected [128, 32] (Conv1D's [in, out]) for "
                      "n_layer 2, n_embd 32, got [32, 128]");
  replace("h.0.attn.c_attn.weight", Tensor::zeros({32, 32}, DType::f32, Device::cpu()));
  expect_refused(hf_, "'h.0.attn.c_attn.weight': expected [32, 96] (Hugging Face's Conv1D) or "
                      "[96, 32] (nanoGPT's Linear) for n_embd 32, got [32, 32]");
}

TEST_F(GptWeightsBadSafetensors, MissingTensor) {
  std::erase_if(hf_, [](const auto& p) { return p.first == "h.1.ln_2.bias"; });
  expect_refused(hf_, "expected a tensor 'transformer.h.1.ln_2.bias' (or 'h.1.ln_2.bias') of "
                      "GPT-2's, got none; the file holds '" +
                          hf_[0].first + "', '" + hf_[1].first + "', '" + hf_[2].first + "', '" +
                          hf_[3].first + "', ... (" + std::to_string(hf_.size()) + " tensors)");
}

// A name holding a NUL (tester hB, 11b) cut the message short where it was printed ("the file
// holds 'wte.weight"); names are escaped now (io::quoted_name), so the message is whole.
TEST_F(GptWeightsBadSafetensors, ANameWithControlBytesIsShownEscapedAndWhole) {
  // wte.weight, first in the file, named "wte.weight\0x\n\\": wte is missing, and the names the
  // message lists start with that one.
  auto wte =
      std::find_if(hf_.begin(), hf_.end(), [](const auto& p) { return p.first == "wte.weight"; });
  ASSERT_NE(wte, hf_.end());
  std::rotate(hf_.begin(), wte, wte + 1);
  hf_[0].first += std::string("\0x\n\\", 4);
  expect_refused(hf_, "expected a tensor 'transformer.wte.weight' (or 'wte.weight') of GPT-2's, "
                      "got none; the file holds 'wte.weight\\x00x\\x0a\\\\', '" +
                          hf_[1].first + "'");
  // The message is whole: no NUL in it, and it goes on to the tensor count.
  try {
    io::load_gpt_weights(dir_ + "/bad.safetensors");
  } catch (const ParseError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\0'), std::string::npos);
    EXPECT_EQ(std::string(what.c_str()), what);
    EXPECT_NE(what.find("tensors)"), std::string::npos) << what;
  }
  EXPECT_EQ(io::quoted_name("a\tb\x7f\xc3\xa9\\"), "'a\\x09b\\x7f\xc3\xa9\\\\'");
}

TEST_F(GptWeightsBadSafetensors, WrongDtypeAndUntiedHead) {
  replace("ln_f.bias", Tensor::zeros({32}, DType::i64, Device::cpu()));
  expect_refused(hf_, "'ln_f.bias': expected F32, BF16 or F16, got I64");
  hf_ = io::load_safetensors(kDir + "/hf/model.safetensors").tensors;
  hf_.emplace_back("lm_head.weight", Tensor::zeros({512, 32}, DType::f32, Device::cpu()));
  expect_refused(hf_, "'lm_head.weight' [512, 32]: expected the tied head, equal to wte.weight");
  // Issue 29 (6): a transposed head [C, V] was "other values"; its shape is said.
  hf_.back().second = Tensor::zeros({32, 512}, DType::f32, Device::cpu());
  expect_refused(hf_, "'lm_head.weight': expected the tied head, equal to wte.weight [512, 32] "
                      "(ditto's GPT ties them, as GPT-2), got the shape [32, 512] (transposed)");
  // Issue 29 (6): the key as stored ('transformer.ln_f.weight'), not without its prefix.
  hf_ = io::load_safetensors(kDir + "/hf/model.safetensors").tensors;
  for (auto& [n, x] : hf_) n = "transformer." + n;
  replace("transformer.ln_f.weight", Tensor::zeros({32}, DType::i32, Device::cpu()));
  expect_refused(hf_, "'transformer.ln_f.weight': expected F32, BF16 or F16, got I32");
}

// A safetensors file with `extra` BOOL tensors [1, 1, 64, 64] added by hand (ditto's serializer
// writes no BOOL), as the mask buffers of files saved by some transformers versions.
std::string with_bool_tensors(const std::vector<std::pair<std::string, Tensor>>& t,
                              const std::vector<std::string>& extra) {
  nlohmann::json h = nlohmann::json::object();
  std::string buf;
  for (const auto& [n, x] : t) {
    h[n] = {{"dtype", io::safetensors_dtype(x.dtype())},
            {"shape", x.shape()},
            {"data_offsets", {buf.size(), buf.size() + x.nbytes()}}};
    buf.append(static_cast<const char*>(x.data_ptr()), x.nbytes());
  }
  for (const std::string& n : extra) {
    h[n] = {{"dtype", "BOOL"},
            {"shape", {1, 1, 64, 64}},
            {"data_offsets", {buf.size(), buf.size() + 64 * 64}}};
    buf.append(64 * 64, '\1');
  }
  h["__metadata__"] = {{"format", "pt"}};
  const std::string head = h.dump();
  std::string out(8, '\0');
  const std::uint64_t n = head.size();
  std::memcpy(out.data(), &n, 8);
  return out + head + buf;
}

TEST_F(GptWeightsBadSafetensors, BoolMaskBuffersAreIgnoredOtherBoolTensorsRefused) {
  std::erase_if(hf_, [](const auto& p) {
    return p.first.find("attn.bias") != std::string::npos && p.second.dim() == 4;
  });
  fs::copy_file(kDir + "/hf/config.json", dir_ + "/config.json");
  const std::string path = dir_ + "/model.safetensors";
  write_bytes(path, with_bool_tensors(hf_, {"h.0.attn.bias", "h.1.attn.bias"}));
  expect_error<ParseError>([&] { io::load_safetensors(path); }, "BOOL is a safetensors dtype "
                                                                "ditto cannot hold");
  const io::GptWeights w = io::load_gpt_weights(path);
  expect_tiny_config(w);
  check_against_torch(w, "f32");
  write_bytes(path, with_bool_tensors(hf_, {"h.0.attn.bias", "h.0.mlp.gate"}));
  expect_error<ParseError>([&] { io::load_gpt_weights(path); },
                           "io::load_gpt_weights: '" + path +
                               "': 'h.0.mlp.gate': expected F32, "
                               "BF16 or F16, got BOOL");
}

TEST_F(GptWeightsBadSafetensors, NotAFileOfEither) {
  const std::string path = dir_ + "/text.bin";
  write_bytes(path, "hello, world: not a model\n");
  expect_error<ParseError>([&] { io::load_gpt_weights(path); },
                           "io::load_gpt_weights: '" + path + "': expected an llm.c model file");
  expect_error<ParseError>([&] { io::load_gpt_weights(dir_ + "/missing.bin"); }, "missing.bin");
}

// TrainerConfig::eval_only (--eval-only) needs iteration mode and writes no checkpoint.
TEST(TrainerEvalOnly, NeedsIterationModeAndNoCheckpoint) {
  auto data = std::make_shared<train::CsvDataSource>(DITTO_DIGITS_CSV, data::CsvOptions{}, 0.2, 0);
  train::TrainerConfig c;
  c.eval_only = true;
  expect_invalid([&] { train::Trainer(c, data); },
                 "TrainerConfig::eval_only: expected iteration mode (TrainerConfig::max_iters > 0: "
                 "nanoGPT's loop, whose evaluation it runs), got TrainerConfig::max_iters 0");
  c.max_iters = 5;
  c.checkpoint_dir = "ck";
  expect_invalid([&] { train::Trainer(c, data); },
                 "TrainerConfig::checkpoint_dir: expected none with TrainerConfig::eval_only (it "
                 "trains nothing and writes no checkpoint), got 'ck'");
}

}  // namespace
}  // namespace ditto
