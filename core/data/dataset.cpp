// Dataset checks, subsets, train/validation split and Standardizer.
#include "core/data/dataset.h"

#include <cmath>
#include <cstring>

#include "core/numerics/random.h"

namespace ditto::data {

namespace {
std::string describe(const Tensor& t) {
  return t.defined() ? t.str() : std::string("an undefined tensor");
}

// Copy rows `idx` of a host tensor with dim >= 1 into a new host tensor.
Tensor gather_rows(const Tensor& t, const std::vector<std::int64_t>& idx) {
  Shape shape = t.shape();
  shape[0] = static_cast<std::int64_t>(idx.size());
  Tensor out = Tensor::empty(shape, t.dtype(), Device::cpu());
  const std::size_t row = t.size(0) == 0 ? 0 : t.nbytes() / static_cast<std::size_t>(t.size(0));
  const char* src = static_cast<const char*>(t.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  for (std::size_t i = 0; i < idx.size(); ++i)
    std::memcpy(dst + i * row, src + static_cast<std::size_t>(idx[i]) * row, row);
  return out;
}
}  // namespace

void check_dataset(const Dataset& d, const char* call) {
  const Tensor& f = d.features;
  DITTO_CHECK(f.defined() && f.dim() == 2 && f.dtype() == DType::f32 && f.device().is_cpu(), call,
              ": dataset.features: expected a host [N, F] f32 tensor, got ", describe(f));
  const std::int64_t n = f.size(0);
  DITTO_CHECK(d.labels.defined() != d.targets.defined(), call,
              ": dataset: expected exactly one of labels and targets, got ",
              d.labels.defined() ? "both" : "neither");
  if (d.labels.defined())
    DITTO_CHECK(d.labels.dim() == 1 && d.labels.size(0) == n && d.labels.dtype() == DType::i64 &&
                    d.labels.device().is_cpu(),
                call, ": dataset.labels: expected a host [", n, "] i64 tensor, got ",
                d.labels.str());
  else
    DITTO_CHECK(d.targets.dim() == 2 && d.targets.size(0) == n && d.targets.dtype() == DType::f32 &&
                    d.targets.device().is_cpu(),
                call, ": dataset.targets: expected a host [", n, ", T] f32 tensor, got ",
                d.targets.str());
}

std::int64_t num_classes(const Dataset& d) {
  check_dataset(d, "data::num_classes");
  DITTO_CHECK(!d.is_regression(), "data::num_classes: dataset: expected class labels, got a ",
              "regression data set");
  std::int64_t c = 0;
  const std::int64_t* y = d.labels.data<std::int64_t>();
  for (std::int64_t i = 0; i < d.size(); ++i) {
    DITTO_CHECK(y[i] >= 0, "data::num_classes: dataset.labels[", i,
                "]: expected a class index "
                ">= 0, got ",
                y[i]);
    c = std::max(c, y[i] + 1);
  }
  return c;
}

Dataset subset(const Dataset& d, const std::vector<std::int64_t>& indices) {
  check_dataset(d, "data::subset");
  for (std::size_t i = 0; i < indices.size(); ++i)
    DITTO_CHECK(indices[i] >= 0 && indices[i] < d.size(), "data::subset: indices[", i,
                "]: expected a row in [0, ", d.size(), "), got ", indices[i]);
  Dataset out;
  out.features = gather_rows(d.features, indices);
  if (d.labels.defined()) out.labels = gather_rows(d.labels, indices);
  if (d.targets.defined()) out.targets = gather_rows(d.targets, indices);
  return out;
}

Split train_val_split(const Dataset& d, double val_fraction, std::uint64_t seed) {
  check_dataset(d, "data::train_val_split");
  DITTO_CHECK(val_fraction >= 0.0 && val_fraction < 1.0,
              "data::train_val_split: val_fraction: expected a value in [0, 1), got ",
              val_fraction);
  const std::int64_t n = d.size();
  const auto n_val = static_cast<std::int64_t>(std::ceil(val_fraction * static_cast<double>(n)));
  DITTO_CHECK(n - n_val >= 1, "data::train_val_split: val_fraction: ", val_fraction, " of ", n,
              " samples leaves no training samples");
  std::vector<std::int64_t> p = permutation(n, seed, stream_id(kStreamSplit, 0));
  Split s;
  s.val = subset(d, std::vector<std::int64_t>(p.begin(), p.begin() + n_val));
  s.train = subset(d, std::vector<std::int64_t>(p.begin() + n_val, p.end()));
  return s;
}

Standardizer Standardizer::fit(const Dataset& train) {
  check_dataset(train, "data::Standardizer::fit");
  const std::int64_t n = train.size(), f = train.num_features();
  DITTO_CHECK(n >= 1, "data::Standardizer::fit: train: expected at least one sample, got 0");
  const float* x = train.features.data<float>();
  Standardizer s;
  s.mean_.assign(static_cast<std::size_t>(f), 0.0);
  s.std_.assign(static_cast<std::size_t>(f), 0.0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < f; ++j) s.mean_[static_cast<std::size_t>(j)] += x[i * f + j];
  for (double& m : s.mean_) m /= static_cast<double>(n);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < f; ++j) {
      const double dx = x[i * f + j] - s.mean_[static_cast<std::size_t>(j)];
      s.std_[static_cast<std::size_t>(j)] += dx * dx;
    }
  for (double& v : s.std_) {
    v = std::sqrt(v / static_cast<double>(n));
    if (v == 0.0) v = 1.0;  // constant feature: centre only (sklearn does the same)
  }
  return s;
}

Dataset Standardizer::apply(const Dataset& d) const {
  DITTO_CHECK(fitted(), "data::Standardizer::apply: not fitted (call Standardizer::fit first)");
  check_dataset(d, "data::Standardizer::apply");
  const std::int64_t n = d.size(), f = d.num_features();
  DITTO_CHECK(f == static_cast<std::int64_t>(mean_.size()),
              "data::Standardizer::apply: dataset: "
              "expected ",
              mean_.size(), " features (as fitted), got ", f);
  Dataset out = d;
  out.features = Tensor::empty(d.features.shape(), DType::f32, Device::cpu());
  const float* x = d.features.data<float>();
  float* y = out.features.data<float>();
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < f; ++j) {
      const auto k = static_cast<std::size_t>(j);
      y[i * f + j] = static_cast<float>((x[i * f + j] - mean_[k]) / std_[k]);
    }
  return out;
}

}  // namespace ditto::data
