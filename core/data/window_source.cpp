// WindowSource (window_source.h; Note [Text batches] in text_source.h).
#include "core/data/window_source.h"

#include <algorithm>
#include <vector>

#include "core/base/error.h"
#include "core/numerics/random.h"

namespace ditto::train {

namespace {
// A batch's B x T token windows are built on the host (two i64 tensors): refuse sizes whose
// product overflows or would not fit any machine, before allocating (a batch_size of 2^60 used to
// wrap B x T to 0 and write past an empty vector).
constexpr std::int64_t kMaxBatchTokens = std::int64_t(1) << 31;
}  // namespace

WindowSource::WindowSource(const char* call, std::int64_t block_size, std::uint64_t seed)
    : call_(call), block_size_(block_size), seed_(seed) {
  DITTO_CHECK(block_size >= 1, call, ": block_size: expected >= 1, got ", block_size);
}

void WindowSource::check_batch_size(std::int64_t batch_size) const {
  const std::int64_t T = block_size_;
  DITTO_CHECK(batch_size >= 1, call_, ": batch_size: expected >= 1, got ", batch_size);
  DITTO_CHECK(batch_size <= kMaxBatchTokens / T, call_,
              ": batch_size: expected batch_size x "
              "block_size <= 2^31 tokens (block_size = ",
              T, ": batch_size <= ", kMaxBatchTokens / T, "), got ", batch_size);
}

std::int64_t WindowSource::batches_per_epoch(std::int64_t batch_size) const {
  check_batch_size(batch_size);
  return std::max<std::int64_t>(1, train_size() / (batch_size * block_size_));
}

data::Batch WindowSource::batch(std::int64_t epoch, std::int64_t i, std::int64_t batch_size) {
  return step_batch(epoch * batches_per_epoch(batch_size) + i, batch_size);
}

data::Batch WindowSource::windows(EvalSplit split, std::uint64_t stream, std::int64_t batch_size,
                                  std::int64_t lo, std::int64_t hi) const {
  check_batch_size(batch_size);
  DITTO_CHECK(0 <= lo && lo <= hi && hi <= batch_size, call_,
              "::step_batch_rows: rows: "
              "expected 0 <= lo <= hi <= batch_size = ",
              batch_size, ", got [", lo, ", ", hi, ")");
  const std::int64_t T = block_size_;
  const auto starts = static_cast<std::uint64_t>(split_tokens(split) - T);  // > 0 (subclass)
  std::vector<std::int64_t> x(static_cast<std::size_t>(batch_size * T)), y(x.size());
  std::vector<std::int64_t> w(static_cast<std::size_t>(T + 1));
  for (std::int64_t j = lo; j < hi; ++j) {
    const auto i = static_cast<std::int64_t>(
        philox_u64(seed_, stream, static_cast<std::uint64_t>(j)) % starts);
    read_tokens(split, i, T + 1, w.data());
    std::copy(w.begin(), w.end() - 1, x.begin() + j * T);
    std::copy(w.begin() + 1, w.end(), y.begin() + j * T);
  }
  return {Tensor::from_vector(x, {batch_size, T}, Device::cpu()),
          Tensor::from_vector(y, {batch_size, T}, Device::cpu())};
}

data::Batch WindowSource::step_batch(std::int64_t step, std::int64_t batch_size) {
  return step_batch_rows(step, batch_size, 0, batch_size);
}

data::Batch WindowSource::step_batch_rows(std::int64_t step, std::int64_t batch_size,
                                          std::int64_t lo, std::int64_t hi) {
  DITTO_CHECK(step >= 0, call_, "::step_batch: step: expected >= 0, got ", step);
  return windows(EvalSplit::train, stream_id(kStreamBatch, static_cast<std::uint64_t>(step)),
                 batch_size, lo, hi);
}

data::Batch WindowSource::eval_batch(EvalSplit split, std::int64_t k, std::int64_t batch_size) {
  DITTO_CHECK(k >= 0, call_, "::eval_batch: k: expected >= 0, got ", k);
  const std::uint64_t p = split == EvalSplit::train ? 0 : 1;
  const std::uint64_t stream = stream_id(kStreamEvalBatch, p << 32 | static_cast<std::uint64_t>(k));
  return windows(split, stream, batch_size, 0, batch_size);
}

}  // namespace ditto::train
