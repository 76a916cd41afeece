// data::DataLoader: host batches of a Dataset, in order or reshuffled each epoch by a seeded
// Philox permutation (torch.utils.data.DataLoader with a seeded generator; set_epoch as in
// DistributedSampler).
#pragma once

#include <cstdint>
#include <iterator>
#include <vector>

#include "core/data/dataset.h"

namespace ditto::data {

/// One batch: x [B, F] f32 and y ([B] i64 labels, or [B, T] f32 targets), host tensors.
struct Batch {
  Tensor x;
  Tensor y;
};

class DataLoader {
 public:
  /// Batches of `batch_size` samples; the last one is smaller unless drop_last drops it. With
  /// shuffle, epoch e visits the samples in the order permutation(N, seed, stream_id(
  /// kStreamShuffle, e)); without, in file order (and seed is unused). The data set's tensors are
  /// shared, not copied. Throws InvalidArgument for batch_size < 1 or a malformed data set.
  DataLoader(const Dataset& dataset, std::int64_t batch_size, bool shuffle = false,
             std::uint64_t seed = 0, bool drop_last = false);

  /// Batches per epoch: ceil(N / batch_size), or floor with drop_last.
  std::int64_t size() const;
  std::int64_t batch_size() const { return batch_size_; }
  const Dataset& dataset() const { return dataset_; }

  /// Select the epoch whose order the following batches use (default 0), and the batch its
  /// iteration starts at: begin() is batch start_batch, so that a run resumed from a checkpoint
  /// taken after batch k - 1 continues with batch k of the same shuffle (like
  /// torchdata's StatefulDataLoader). Throws InvalidArgument for epoch < 0 or start_batch outside
  /// [0, size()].
  void set_epoch(std::int64_t epoch, std::int64_t start_batch = 0);
  std::int64_t epoch() const { return epoch_; }
  /// The batch the current epoch's iteration starts at (set_epoch's start_batch).
  std::int64_t start_batch() const { return start_batch_; }
  /// Sample order of the current epoch (indices into the data set).
  const std::vector<std::int64_t>& order() const { return order_; }

  /// Batch i of the current epoch (rows order()[i*B, min((i+1)*B, N))). Throws InvalidArgument
  /// for i outside [0, size()).
  Batch batch(std::int64_t i) const;

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = Batch;
    Iterator(const DataLoader* loader, std::int64_t i) : loader_(loader), i_(i) {}
    Batch operator*() const { return loader_->batch(i_); }
    Iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator==(const Iterator& o) const { return i_ == o.i_ && loader_ == o.loader_; }
    bool operator!=(const Iterator& o) const { return !(*this == o); }

   private:
    const DataLoader* loader_;
    std::int64_t i_;
  };
  /// Iterate the current epoch's batches from start_batch(): for (const Batch& b : loader) ...
  Iterator begin() const { return Iterator(this, start_batch_); }
  Iterator end() const { return Iterator(this, size()); }

 private:
  Dataset dataset_;
  std::int64_t batch_size_;
  bool shuffle_;
  std::uint64_t seed_;
  bool drop_last_;
  std::int64_t epoch_ = 0;
  std::int64_t start_batch_ = 0;
  std::vector<std::int64_t> order_;
};

}  // namespace ditto::data
