// DataLoader: per-epoch sample order and batch assembly on the host.
#include "core/data/data_loader.h"

#include <cstring>
#include <numeric>

#include "core/numerics/random.h"

namespace ditto::data {

namespace {
// Rows [start, start + len) of order, gathered from a host tensor (a view when contiguous).
Tensor take(const Tensor& t, const std::vector<std::int64_t>& order, std::int64_t start,
            std::int64_t len, bool in_order) {
  if (in_order) return t.narrow(start, len);
  Shape shape = t.shape();
  shape[0] = len;
  Tensor out = Tensor::empty(shape, t.dtype(), Device::cpu());
  const std::size_t row = t.size(0) == 0 ? 0 : t.nbytes() / static_cast<std::size_t>(t.size(0));
  const char* src = static_cast<const char*>(t.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  for (std::int64_t i = 0; i < len; ++i)
    std::memcpy(dst + static_cast<std::size_t>(i) * row,
                src + static_cast<std::size_t>(order[static_cast<std::size_t>(start + i)]) * row,
                row);
  return out;
}
}  // namespace

DataLoader::DataLoader(const Dataset& dataset, std::int64_t batch_size, bool shuffle,
                       std::uint64_t seed, bool drop_last)
    : dataset_(dataset),
      batch_size_(batch_size),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  check_dataset(dataset, "data::DataLoader");
  DITTO_CHECK(batch_size >= 1, "data::DataLoader: batch_size: expected >= 1, got ", batch_size);
  set_epoch(0);
}

std::int64_t DataLoader::size() const {
  const std::int64_t n = dataset_.size();
  // ceil(n / batch_size) without n + batch_size - 1, which overflowed for a batch near 2^63
  return n / batch_size_ + (!drop_last_ && n % batch_size_ != 0 ? 1 : 0);
}

void DataLoader::set_epoch(std::int64_t epoch, std::int64_t start_batch) {
  DITTO_CHECK(epoch >= 0, "data::DataLoader::set_epoch: epoch: expected >= 0, got ", epoch);
  DITTO_CHECK(start_batch >= 0 && start_batch <= size(),
              "data::DataLoader::set_epoch: start_batch: expected a batch in [0, ", size(),
              "] (batches per epoch), got ", start_batch);
  epoch_ = epoch;
  start_batch_ = start_batch;
  const std::int64_t n = dataset_.size();
  if (shuffle_) {
    order_ = permutation(n, seed_, stream_id(kStreamShuffle, static_cast<std::uint64_t>(epoch)));
  } else if (static_cast<std::int64_t>(order_.size()) != n) {
    order_.resize(static_cast<std::size_t>(n));
    std::iota(order_.begin(), order_.end(), std::int64_t{0});
  }
}

Batch DataLoader::batch(std::int64_t i) const {
  DITTO_CHECK(i >= 0 && i < size(), "data::DataLoader::batch: i: expected a batch in [0, ", size(),
              "), got ", i);
  const std::int64_t start = i * batch_size_;
  const std::int64_t len = std::min(batch_size_, dataset_.size() - start);
  return {take(dataset_.features, order_, start, len, !shuffle_),
          take(dataset_.y(), order_, start, len, !shuffle_)};
}

}  // namespace ditto::data
