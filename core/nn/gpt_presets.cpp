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
  // Per block: ln_1, ln_2 (C weight + C bias each), c_attn 3C^2 + 3C, attn.c_proj C^2 + C,
  // mlp.c_fc 4C^2 + 4C, mlp.c_proj 4C^2 + C.
  const std::int64_t block = 2 * C * (1 + b) + 3 * C * C + 3 * C * b + C * C + C * b + 4 * C * C +
                             4 * C * b + 4 * C * C + C * b;
  return m.vocab_size * C + m.block_size * C + m.n_layer * block + C * (1 + b);
}

}  // namespace ditto::nn
