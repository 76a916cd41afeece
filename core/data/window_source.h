// WindowSource: what TextDataSource (text_source.h) and TokenDataSource (token_source.h) share:
// a GPT's batches as windows of block_size + 1 tokens of a training and a validation sequence,
// drawn by Philox (Note [Text batches]), so the global batch of a step is the same for any device
// count. A subclass holds the tokens: how many each split has, and how to read a stretch of them.
#pragma once

#include <cstdint>

#include "core/data/data_source.h"

namespace ditto::train {

class WindowSource : public DataSource {
 public:
  /// Training tokens / (batch_size x block_size), at least 1: an "epoch" of tokens (epoch mode
  /// only).
  std::int64_t batches_per_epoch(std::int64_t batch_size) const override;
  /// step_batch(epoch * batches_per_epoch + i, batch_size).
  data::Batch batch(std::int64_t epoch, std::int64_t i, std::int64_t batch_size) override;
  /// The training windows of step `step` (Note [Text batches]): x and y [batch_size, block_size]
  /// i64 host tensors.
  data::Batch step_batch(std::int64_t step, std::int64_t batch_size) override;
  /// Only rows [lo, hi) of step_batch read (the others are zeros).
  data::Batch step_batch_rows(std::int64_t step, std::int64_t batch_size, std::int64_t lo,
                              std::int64_t hi) override;
  /// Fixed evaluation windows, batch k of the split (Note [Text batches]).
  data::Batch eval_batch(EvalSplit split, std::int64_t k, std::int64_t batch_size) override;
  /// Empty: the windows are evaluated by eval_batch (TrainerConfig::max_iters).
  const data::Dataset& eval_set() const override { return empty_; }
  /// Tokens of the training split.
  std::int64_t train_size() const override { return split_tokens(EvalSplit::train); }
  /// block_size (tokens per row).
  std::int64_t num_inputs() const override { return block_size_; }
  std::int64_t block_size() const { return block_size_; }

 protected:
  /// `call`: the class that errors name ("TextDataSource"). Throws InvalidArgument for
  /// block_size < 1.
  WindowSource(const char* call, std::int64_t block_size, std::uint64_t seed);
  /// Tokens in `split` (each split a subclass opens is longer than block_size).
  virtual std::int64_t split_tokens(EvalSplit split) const = 0;
  /// Tokens [begin, begin + n) of `split` into out[0, n).
  virtual void read_tokens(EvalSplit split, std::int64_t begin, std::int64_t n,
                           std::int64_t* out) const = 0;

  const char* call_;
  std::int64_t block_size_;
  std::uint64_t seed_;

 private:
  /// Rows [lo, hi) of a batch of windows of `split` drawn from Philox stream `stream` (the
  /// others zeros).
  data::Batch windows(EvalSplit split, std::uint64_t stream, std::int64_t batch_size,
                      std::int64_t lo, std::int64_t hi) const;
  /// InvalidArgument unless 1 <= batch_size and batch_size x block_size <= 2^31.
  void check_batch_size(std::int64_t batch_size) const;

  data::Dataset empty_;
};

}  // namespace ditto::train
