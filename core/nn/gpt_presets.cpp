// nanoGPT's GPT-2 sizes (gpt_config.h).
#include "core/base/error.h"
#include "core/nn/gpt_config.h"

namespace ditto::nn {

const std::vector<GPT2Preset>& gpt2_presets() {
  static const std::vector<GPT2Preset> p = {{"gpt2", 12, 12, 768},
                                            {"gpt2-medium", 24, 16, 1024},
                                            {"gpt2-large", 36, 20, 1280},
                                            {"gpt2-xl", 48, 25, 1600}};
  return p;
}

GPTConfig gpt2_config(const std::string& model_type, const std::string& what) {
  std::string names;
  for (const GPT2Preset& p : gpt2_presets()) {
    if (model_type == p.model_type) {
      GPTConfig c;
      c.block_size = kGpt2BlockSize;
      c.vocab_size = kGpt2PaddedVocab;
      c.n_layer = p.n_layer;
      c.n_head = p.n_head;
      c.n_embd = p.n_embd;
      c.bias = true;
      c.dropout = 0.0f;
      return c;
    }
    names += (names.empty() ? "" : ", ") + std::string(p.model_type);
  }
  throw InvalidArgument(detail::cat(what, ": expected one of ", names,
                                    " (nanoGPT's model_type), "
                                    "got '",
                                    model_type, "'"));
}

std::int64_t gpt_num_params(const GPTConfig& m) {
  const std::int64_t C = m.n_embd, b = m.bias ? 1 : 0;
  bool overflow = false;
  const auto mul = [&](std::int64_t x, std::int64_t y) {
    std::int64_t r = 0;
    overflow |= __builtin_mul_overflow(x, y, &r);
    return r;
  };
  const auto add = [&](std::int64_t x, std::int64_t y) {
    std::int64_t r = 0;
    overflow |= __builtin_add_overflow(x, y, &r);
    return r;
  };
  // Per block: ln_1, ln_2 (C weight + C bias each), c_attn 3C^2 + 3C, attn.c_proj C^2 + C,
  // mlp.c_fc 4C^2 + 4C, mlp.c_proj 4C^2 + C: 12 C^2 + (4 + 9) C with biases, 12 C^2 + 2 C without.
  const std::int64_t block = add(mul(12, mul(C, C)), mul(2 + 11 * b, C));
  const std::int64_t n = add(
      add(add(mul(m.vocab_size, C), mul(m.block_size, C)), mul(m.n_layer, block)), mul(C, 1 + b));
  DITTO_CHECK(!overflow, "gpt_num_params: expected a parameter count that fits std::int64_t, got ",
              "n_layer=", m.n_layer, " n_embd=", m.n_embd, " vocab_size=", m.vocab_size,
              " block_size=", m.block_size, ": 12 L C^2 + 13 L C + V C + T C + 2 C overflows");
  return n;
}

}  // namespace ditto::nn
