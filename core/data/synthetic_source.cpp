// ZeroTokenSource (synthetic_source.h).
#include "core/data/synthetic_source.h"

#include <algorithm>

#include "core/base/error.h"

namespace ditto::train {

ZeroTokenSource::ZeroTokenSource(std::int64_t block_size, std::int64_t vocab_size,
                                 std::int64_t train_tokens)
    : block_size_(block_size), vocab_size_(vocab_size), train_tokens_(train_tokens) {
  DITTO_CHECK(block_size >= 1, "ZeroTokenSource: block_size: expected >= 1, got ", block_size);
  DITTO_CHECK(vocab_size >= 1, "ZeroTokenSource: vocab_size: expected >= 1, got ", vocab_size);
  DITTO_CHECK(train_tokens >= 1, "ZeroTokenSource: train_tokens: expected >= 1, got ",
              train_tokens);
}

std::int64_t ZeroTokenSource::batches_per_epoch(std::int64_t batch_size) const {
  DITTO_CHECK(batch_size >= 1, "ZeroTokenSource: batch_size: expected >= 1, got ", batch_size);
  return std::max<std::int64_t>(1, train_tokens_ / block_size_ / batch_size);
}

data::Batch ZeroTokenSource::batch(std::int64_t, std::int64_t, std::int64_t batch_size) {
  constexpr std::int64_t kMaxBatchTokens = std::int64_t(1) << 31;
  DITTO_CHECK(batch_size >= 1 && batch_size <= kMaxBatchTokens / block_size_,
              "ZeroTokenSource: batch_size: expected 1..", kMaxBatchTokens / block_size_,
              " (batch_size x block_size <= 2^31 tokens, block_size = ", block_size_, "), got ",
              batch_size);
  std::lock_guard lk(mu_);
  if (!cached_.x.defined() || cached_.x.size(0) != batch_size) {
    Tensor zeros = Tensor::zeros({batch_size, block_size_}, DType::i64, Device::cpu());
    cached_ = {zeros, zeros};  // y = x: read-only on the host, the same zeros
  }
  return cached_;
}

data::Batch ZeroTokenSource::step_batch(std::int64_t step, std::int64_t batch_size) {
  return batch(0, step, batch_size);
}

data::Batch ZeroTokenSource::eval_batch(EvalSplit, std::int64_t k, std::int64_t batch_size) {
  return batch(0, k, batch_size);
}

std::map<std::string, std::string> ZeroTokenSource::checkpoint_config() const {
  return {{"data", "zeros"},
          {"vocab_size", std::to_string(vocab_size_)},
          {"block_size", std::to_string(block_size_)}};
}

}  // namespace ditto::train
