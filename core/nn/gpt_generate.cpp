// nn::GPT::generate: nanoGPT's sampling loop on the host (temperature, top-k, softmax with the
// portable exp, a Philox draw per token), the same tokens on every backend and device count.
#include <algorithm>
#include <cmath>
#include <functional>

#include "core/nn/gpt.h"
#include "core/numerics/canonical_math.h"
#include "core/numerics/random.h"

namespace ditto::nn {

namespace {

// Restores a module's training mode and micro-shards when generate() returns or throws.
class EvalScope {
 public:
  explicit EvalScope(Module& m) : m_(m), training_(m.training()), shards_(m.micro_shards()) {
    m_.set_training(false);
    m_.set_micro_shards({});
  }
  ~EvalScope() {
    m_.set_training(training_);
    m_.set_micro_shards(shards_);
  }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  Module& m_;
  bool training_;
  std::vector<std::int64_t> shards_;
};

// The index sampled from logits [V] (already divided by the temperature and top-k masked with
// -inf) with u in [0, 1): softmax with the portable exp, then the first index whose running sum
// exceeds u (the last index with a non-zero probability if rounding leaves the sum below u).
std::int64_t sample_index(const std::vector<float>& logits, float u) {
  namespace c = canonical;
  float m = logits[0];
  for (float l : logits) m = std::max(m, l);
  std::vector<float> e(logits.size());
  float sum = 0.0f;
  for (std::size_t v = 0; v < logits.size(); ++v) {
    e[v] = std::isinf(logits[v]) && logits[v] < 0 ? 0.0f : c::exp(c::sub(logits[v], m));
    sum = c::add(sum, e[v]);
  }
  float run = 0.0f;
  std::int64_t last = 0;
  for (std::size_t v = 0; v < e.size(); ++v) {
    if (e[v] == 0.0f) continue;
    last = static_cast<std::int64_t>(v);
    run = c::add(run, c::div(e[v], sum));
    if (run > u) return last;
  }
  return last;
}

}  // namespace

std::vector<std::int64_t> GPT::generate(std::vector<std::int64_t> prompt,
                                        std::int64_t max_new_tokens, float temperature,
                                        std::int64_t top_k, std::uint64_t seed,
                                        std::int64_t vocab_limit) {
  DITTO_CHECK(!prompt.empty(), "GPT.generate: prompt: expected at least one token, got none");
  for (std::size_t i = 0; i < prompt.size(); ++i)
    DITTO_CHECK(prompt[i] >= 0 && prompt[i] < cfg_.vocab_size, "GPT.generate: prompt[", i,
                "]: expected a token id in [0, ", cfg_.vocab_size, "), got ", prompt[i]);
  DITTO_CHECK(max_new_tokens >= 0, "GPT.generate: max_new_tokens: expected >= 0, got ",
              max_new_tokens);
  DITTO_CHECK(std::isfinite(temperature) && temperature > 0.0f,
              "GPT.generate: temperature: expected a finite value > 0, got ", temperature);
  DITTO_CHECK(vocab_limit >= 0 && vocab_limit <= cfg_.vocab_size, "GPT.generate: vocab_limit: "
              "expected 0 (every id) or 1..", cfg_.vocab_size, " (vocab_size), got ", vocab_limit);
  EvalScope eval(*this);
  const std::int64_t V = cfg_.vocab_size;
  const std::int64_t drawn = vocab_limit > 0 ? vocab_limit : V;  // ids drawn from: [0, drawn)
  const std::uint64_t stream = stream_id(kStreamSample, 0);
  for (std::int64_t n = 0; n < max_new_tokens; ++n) {
    const auto len = static_cast<std::int64_t>(prompt.size());
    const std::int64_t t = std::min(len, cfg_.block_size);
    const std::vector<std::int64_t> ctx(prompt.end() - t, prompt.end());
    const Tensor logits = forward(Tensor::from_vector(ctx, {1, t}));
    Tensor row = logits.view({t, V}).narrow(t - 1, 1);
    if (row.dtype() != DType::f32) row = row.to(DType::f32);  // bf16 / f16 logits: exact upcast
    std::vector<float> last = row.to_vector<float>();
    last.resize(static_cast<std::size_t>(drawn));  // a padded vocabulary's unused rows dropped
    // torch.multinomial refuses such probabilities; sampling from NaN would silently pick the
    // last vocabulary entry every time (a diverged run printed "}}}}...").
    for (std::size_t v = 0; v < last.size(); ++v)
      DITTO_CHECK(!std::isnan(last[v]), "GPT.generate: the logits of new token ", n,
                  " are not numbers (logit ", v, " is NaN): the model's parameters are not "
                  "finite (did training diverge?)");
    for (float& l : last) l = canonical::div(l, temperature);
    if (top_k > 0 && top_k < drawn) {
      std::vector<float> sorted = last;
      std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(),
                       std::greater<float>());
      const float kth = sorted[static_cast<std::size_t>(top_k - 1)];
      for (float& l : last)
        if (l < kth) l = -INFINITY;
    }
    prompt.push_back(sample_index(last, uniform01(seed, stream, static_cast<std::uint64_t>(n))));
  }
  return prompt;
}

}  // namespace ditto::nn
