// ZeroTokenSource: token batches for a dry run (Note [Dry run], backend_sim/sim_backend.h) of a
// GPT whose data is not at hand: every token id is 0, nothing is read from a file, and one batch
// of host memory is held (x and y [B, T] i64, shared by every step). The vocabulary size is what
// the model is built for (GPT-2: 50304, llm.c / nanoGPT's padded 50257). A dry run's kernels do
// not look at token ids, so the predicted time and memory are those of real text.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "core/data/data_source.h"

namespace ditto::train {

class ZeroTokenSource final : public DataSource {
 public:
  /// Windows of `block_size` tokens over a vocabulary of `vocab_size`, `train_tokens` tokens
  /// per "epoch" (batches_per_epoch). Throws InvalidArgument for block_size, vocab_size or
  /// train_tokens < 1.
  ZeroTokenSource(std::int64_t block_size, std::int64_t vocab_size,
                  std::int64_t train_tokens = std::int64_t(1) << 30);

  std::int64_t batches_per_epoch(std::int64_t batch_size) const override;
  /// x and y [batch_size, block_size] i64 host tensors of zeros (the same storage every call for
  /// one batch size). batch_size * block_size <= 2^31 (InvalidArgument otherwise).
  data::Batch batch(std::int64_t epoch, std::int64_t i, std::int64_t batch_size) override;
  data::Batch step_batch(std::int64_t step, std::int64_t batch_size) override;
  data::Batch eval_batch(EvalSplit split, std::int64_t k, std::int64_t batch_size) override;
  const data::Dataset& eval_set() const override { return empty_; }
  std::int64_t train_size() const override { return train_tokens_ / block_size_; }
  std::int64_t num_inputs() const override { return block_size_; }
  std::int64_t num_outputs() const override { return vocab_size_; }
  /// "data" = "zeros", "vocab_size", "block_size".
  std::map<std::string, std::string> checkpoint_config() const override;

  std::int64_t vocab_size() const { return vocab_size_; }
  std::int64_t block_size() const { return block_size_; }

 private:
  std::int64_t block_size_, vocab_size_, train_tokens_;
  std::mutex mu_;  // rank threads share the cached batch
  data::Batch cached_;
  data::Dataset empty_;
};

}  // namespace ditto::train
