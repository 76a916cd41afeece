// CsvDataSource (data_source.h).
#include "core/data/data_source.h"

#include <cstdio>
#include <initializer_list>

#include "core/base/error.h"

namespace ditto::train {

namespace {
// The loader of `batch_size` over `ds` at `epoch` (re-made when the batch size changes).
data::DataLoader& loader_at(std::unique_ptr<data::DataLoader>& loader, const data::Dataset& ds,
                            std::int64_t epoch, std::int64_t batch_size, bool shuffle,
                            std::uint64_t seed) {
  if (!loader || loader->batch_size() != batch_size)
    loader = std::make_unique<data::DataLoader>(ds, batch_size, shuffle, seed, false);
  if (loader->epoch() != epoch) loader->set_epoch(epoch);
  return *loader;
}
// FNV-1a (64-bit) over the bytes of `tensors` (host, contiguous), in order.
std::uint64_t fnv1a(std::initializer_list<const Tensor*> tensors) {
  std::uint64_t h = 1469598103934665603ull;
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;
    const Tensor host = t->to(Device::cpu());
    const auto* b = static_cast<const unsigned char*>(host.data_ptr());
    for (std::size_t i = 0; i < host.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  return h;
}
}  // namespace

data::Batch DataSource::step_batch(std::int64_t step, std::int64_t batch_size) {
  DITTO_CHECK(step >= 0, "DataSource::step_batch: step: expected >= 0, got ", step);
  const std::int64_t b = batches_per_epoch(batch_size);
  return batch(step / b, step % b, batch_size);
}

data::Batch DataSource::step_batch_rows(std::int64_t step, std::int64_t batch_size, std::int64_t,
                                        std::int64_t) {
  return step_batch(step, batch_size);
}

data::Batch DataSource::eval_batch(EvalSplit split, std::int64_t k, std::int64_t batch_size) {
  DITTO_CHECK(k >= 0, "DataSource::eval_batch: k: expected >= 0, got ", k);
  if (split == EvalSplit::train) return batch(0, k % batches_per_epoch(batch_size), batch_size);
  DITTO_CHECK(eval_set().size() > 0, "DataSource::eval_batch: expected a data source with an "
                                     "evaluation set, got an empty one");
  data::DataLoader loader(eval_set(), batch_size, /*shuffle=*/false);
  return loader.batch(k % loader.size());
}

CsvDataSource::CsvDataSource(const std::string& path, const data::CsvOptions& csv,
                             double val_fraction, std::uint64_t seed)
    : CsvDataSource(data::read_csv(path, csv), val_fraction, seed) {}

std::int64_t LoaderSource::batches_per_epoch(std::int64_t batch_size) const {
  DITTO_CHECK(batch_size >= 1, call_, ": batch_size: expected >= 1, got ", batch_size);
  const std::int64_t n = train_.size();  // ceil(n / batch_size); n + batch_size - 1 overflowed
  return n / batch_size + (n % batch_size != 0 ? 1 : 0);
}

std::int64_t LoaderSource::shortest_batch_rows(std::int64_t batch_size) const {
  const std::int64_t batches = batches_per_epoch(batch_size);  // (checks batch_size)
  return batches == 0 ? batch_size : train_.size() - (batches - 1) * batch_size;
}

data::Batch LoaderSource::batch(std::int64_t epoch, std::int64_t i, std::int64_t batch_size) {
  std::lock_guard lk(mu_);
  return loader_at(loader_, train_, epoch, batch_size, shuffle_, seed_).batch(i);
}

CsvDataSource::CsvDataSource(data::Dataset all, double val_fraction, std::uint64_t seed)
    : LoaderSource("CsvDataSource", seed, /*shuffle=*/true), val_fraction_(val_fraction) {
  DITTO_CHECK(val_fraction > 0 && val_fraction < 1,
              "CsvDataSource: val_fraction: expected a value in (0, 1), got ", val_fraction);
  data::Split split = data::train_val_split(all, val_fraction, seed);
  data::Standardizer stdz = data::Standardizer::fit(split.train);
  train_ = stdz.apply(split.train);
  eval_ = stdz.apply(split.val);
  rows_ = all.size();
  classes_ = label_classes_ = data::num_classes(all);
  fnv_ = fnv1a({&all.features, &all.labels, &all.targets});
}

void CsvDataSource::set_num_classes(std::int64_t classes, const std::string& what) {
  DITTO_CHECK(classes >= label_classes_, what,
              ": expected a number of classes greater than "
              "every label (the largest is ",
              label_classes_ - 1, "), got ", classes);
  classes_ = classes;
}

std::map<std::string, std::string> CsvDataSource::checkpoint_config() const {
  char hex[24];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv_));
  return {{"train_rows", std::to_string(train_.size())},
          {"val_fraction", std::to_string(val_fraction_)},
          {"data_fnv1a", hex}};
}

DatasetSource::DatasetSource(data::Dataset train, data::Dataset eval, std::uint64_t seed,
                             bool shuffle, std::int64_t outputs)
    : LoaderSource("DatasetSource", seed, shuffle), outputs_(outputs) {
  train_ = std::move(train);
  eval_ = std::move(eval);
  data::check_dataset(train_, "DatasetSource: train");
  // No rows: no batch to train on (and no labels to count the classes of).
  DITTO_CHECK(train_.size() >= 1, "DatasetSource: train: expected at least one row, got 0");
  if (eval_.size() > 0) data::check_dataset(eval_, "DatasetSource: eval");
  if (outputs_ == 0) outputs_ = data::num_classes(train_);
}

FunctionSource::FunctionSource(std::int64_t batches_per_epoch, std::int64_t inputs,
                               std::int64_t outputs, MakeBatch make, data::Dataset eval)
    : batches_(batches_per_epoch),
      inputs_(inputs),
      outputs_(outputs),
      make_(std::move(make)),
      eval_(std::move(eval)) {
  DITTO_CHECK(batches_ >= 1 && make_,
              "FunctionSource: expected batches_per_epoch >= 1 and a "
              "function, got ",
              batches_, make_ ? "" : " and no function");
}

data::Batch FunctionSource::batch(std::int64_t epoch, std::int64_t i, std::int64_t) {
  return make_(epoch, i);
}

std::map<std::string, std::string> DatasetSource::checkpoint_config() const {
  return {{"train_rows", std::to_string(train_.size())}};
}

}  // namespace ditto::train
