// data::Dataset: a host-resident table of features and labels, and what is done to it before
// training: train/validation split (seeded Philox permutation), per-feature standardisation,
// subsets and class counts.
#pragma once

#include <cstdint>
#include <vector>

#include "core/runtime/tensor.h"

namespace ditto::data {

/// Host tensors: features [N, F] f32 and either labels [N] i64 (classification) or targets
/// [N, 1] f32 (regression); the other one is undefined.
struct Dataset {
  Tensor features;
  Tensor labels;
  Tensor targets;

  /// Number of samples N (0 for a default-constructed Dataset).
  std::int64_t size() const { return features.defined() ? features.size(0) : 0; }
  /// Number of features F.
  std::int64_t num_features() const { return features.defined() ? features.size(1) : 0; }
  bool is_regression() const { return targets.defined(); }
  /// The label tensor a loss takes: labels, or targets for regression.
  const Tensor& y() const { return is_regression() ? targets : labels; }
};

/// Throws InvalidArgument naming `call` unless `d` is a well-formed Dataset (host tensors of the
/// shapes and dtypes above, exactly one of labels / targets defined, same N).
void check_dataset(const Dataset& d, const char* call);

/// Number of classes: max label + 1 (0 for an empty data set). Throws InvalidArgument for a
/// regression data set or a negative label.
std::int64_t num_classes(const Dataset& d);

/// Rows `indices` of `d`, in that order (copies). Throws InvalidArgument for an index out of
/// range.
Dataset subset(const Dataset& d, const std::vector<std::int64_t>& indices);

struct Split {
  Dataset train;
  Dataset val;
};

/// Random train/validation split (like sklearn's train_test_split with shuffling): with
/// p = permutation(N, seed, stream_id(kStreamSplit, 0)), the validation set is rows p[0, n_val)
/// and the training set rows p[n_val, N), both in that permuted order, where
/// n_val = ceil(val_fraction * N). Throws InvalidArgument unless 0 <= val_fraction < 1 and the
/// training set is non-empty.
Split train_val_split(const Dataset& d, double val_fraction, std::uint64_t seed);

/// Per-feature standardisation (sklearn's StandardScaler): fit on the training set, apply to any
/// set with the same feature count: x' = (x - mean) / std with the population std (divide by N);
/// a feature with std 0 gets std 1. Computed in double on the host.
class Standardizer {
 public:
  Standardizer() = default;
  /// Fit on `train`. Throws InvalidArgument for an empty or malformed data set.
  static Standardizer fit(const Dataset& train);
  /// A copy of `d` with standardised features (labels/targets shared). Throws InvalidArgument
  /// when not fitted or the feature count differs.
  Dataset apply(const Dataset& d) const;

  bool fitted() const { return !mean_.empty(); }
  const std::vector<double>& mean() const { return mean_; }
  const std::vector<double>& stddev() const { return std_; }

 private:
  std::vector<double> mean_, std_;
};

}  // namespace ditto::data
