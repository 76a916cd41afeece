// DataSource: what a Trainer reads. Batches of a global batch size for step i of an epoch (the
// same on every rank: DDP ranks take their rows of each global batch), an evaluation set, and the
// settings a checkpoint must agree on. CsvDataSource: rows of a CSV file (core/data), split into
// train and validation sets and standardised; token windows for a GPT are TextDataSource
// (core/data/text_source.h), which also draws the batches of an iteration-mode run by step.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/data/csv.h"
#include "core/data/data_loader.h"
#include "core/data/dataset.h"

namespace ditto::train {

/// The split an iteration-mode evaluation reads (nanoGPT's estimate_loss: 'train' and 'val').
enum class EvalSplit : std::uint8_t { train, val };

class DataSource {
 public:
  virtual ~DataSource() = default;

  /// Optimizer steps per epoch at global batch `batch_size` (>= 1).
  virtual std::int64_t batches_per_epoch(std::int64_t batch_size) const = 0;
  /// Batch `i` (0-based, < batches_per_epoch) of epoch `epoch` (0-based): x and y as host
  /// tensors (data::Batch). The same (epoch, i) gives the same batch on every rank and run.
  /// Rank threads call it concurrently.
  virtual data::Batch batch(std::int64_t epoch, std::int64_t i, std::int64_t batch_size) = 0;
  /// The evaluation set (in a fixed order).
  virtual const data::Dataset& eval_set() const = 0;
  /// Rows of the training set (samples per epoch).
  virtual std::int64_t train_size() const = 0;
  /// The rows of the shortest batch at global batch `batch_size` (>= 1) that batch() and
  /// step_batch() give (an epoch's last one may be short), known without reading data: what a
  /// setting that splits every batch (fast mode's grad_accum_steps over the ranks) must fit
  /// before the run reaches it. Default: batch_size (every batch full; a source whose batches
  /// cannot be known up front, FunctionSource's, is taken at that, and a short one is refused
  /// when it comes).
  virtual std::int64_t shortest_batch_rows(std::int64_t batch_size) const { return batch_size; }
  /// Inputs per row and outputs the model must produce (the default MLP's first and last sizes).
  virtual std::int64_t num_inputs() const = 0;
  virtual std::int64_t num_outputs() const = 0;
  /// Settings a checkpoint records and a resume must match ("train_rows", ...).
  virtual std::map<std::string, std::string> checkpoint_config() const = 0;

  /// Iteration mode (TrainerConfig::max_iters > 0): the global batch of optimizer step `step`
  /// (0-based over the whole run). Default: batch(step / B, step % B, batch_size) with B =
  /// batches_per_epoch(batch_size). Rank threads call it concurrently.
  virtual data::Batch step_batch(std::int64_t step, std::int64_t batch_size);
  /// What a replica that trains on rows [lo, hi) of step `step`'s global batch reads (a DDP
  /// rank: DistributedDataParallel::local_rows): a batch of all batch_size rows whose rows [lo,
  /// hi) are step_batch's and the others whatever the source likes (a file-backed source leaves
  /// them zeros, reading only the windows the rank trains on). Default: step_batch.
  virtual data::Batch step_batch_rows(std::int64_t step, std::int64_t batch_size, std::int64_t lo,
                                      std::int64_t hi);
  /// Iteration mode's evaluation: batch `k` (0 <= k < TrainerConfig::eval_iters) of `split`, the
  /// same batch at every evaluation and on every rank: under ddp every rank reads each batch and
  /// evaluates its own rows of it (Note [Evaluation in pieces], core/train/replica.cpp). Default:
  /// val: batch k modulo their number of eval_set() in order (InvalidArgument when eval_set() is
  /// empty); train: batch(0, k % B, batch_size). Rank threads call it concurrently.
  virtual data::Batch eval_batch(EvalSplit split, std::int64_t k, std::int64_t batch_size);
};

/// What CsvDataSource and DatasetSource share: batches of a training data::Dataset in the order
/// of a data::DataLoader (shuffled with the seed per epoch, or in order; ceil(rows / batch_size)
/// per epoch, the last one short), and an evaluation data::Dataset.
class LoaderSource : public DataSource {
 public:
  /// ceil(train_size() / batch_size); InvalidArgument for batch_size < 1.
  std::int64_t batches_per_epoch(std::int64_t batch_size) const override;
  /// The epoch's last batch's: train_size() - (batches_per_epoch - 1) x batch_size (batch_size
  /// when they divide, or with no rows); InvalidArgument for batch_size < 1.
  std::int64_t shortest_batch_rows(std::int64_t batch_size) const override;
  /// Batch `i` of the loader's epoch `epoch` (rank threads share the loader under a mutex).
  data::Batch batch(std::int64_t epoch, std::int64_t i, std::int64_t batch_size) override;
  const data::Dataset& eval_set() const override { return eval_; }
  std::int64_t train_size() const override { return train_.size(); }
  std::int64_t num_inputs() const override { return train_.num_features(); }

 protected:
  /// `call`: the class that errors name; the subclass fills train_ and eval_.
  LoaderSource(const char* call, std::uint64_t seed, bool shuffle)
      : seed_(seed), call_(call), shuffle_(shuffle) {}

  data::Dataset train_, eval_;

 private:
  std::uint64_t seed_;
  const char* call_;
  bool shuffle_;
  std::mutex mu_;                             // rank threads share the loader
  std::unique_ptr<data::DataLoader> loader_;  // of the last batch size asked for
};

/// The rows of a CSV file (data::read_csv): a seeded train/validation split
/// (data::train_val_split), standardised with the training rows' mean and deviation, batches in
/// the shuffled order of a data::DataLoader seeded with `seed` (epoch e: its permutation e); the
/// validation rows are the evaluation set.
class CsvDataSource final : public LoaderSource {
 public:
  /// Throws what read_csv throws, and InvalidArgument for val_fraction outside (0, 1).
  CsvDataSource(const std::string& path, const data::CsvOptions& csv, double val_fraction,
                std::uint64_t seed);
  /// From an already-read data set (the rows of `all`).
  CsvDataSource(data::Dataset all, double val_fraction, std::uint64_t seed);

  std::int64_t num_outputs() const override { return classes_; }
  /// "train_rows", "val_fraction" and "data_fnv1a": the FNV-1a (64-bit, hex) of every row's
  /// features and label as read (f32 / i64 bytes, file order), so that a resume onto another
  /// data set of the same shape is refused naming both fingerprints.
  std::map<std::string, std::string> checkpoint_config() const override;

  /// Gives the model `classes` outputs (torch's CrossEntropyLoss num_classes), more than the
  /// labels need (num_outputs() is otherwise the largest label + 1). Throws InvalidArgument
  /// naming `what` when `classes` is not above every label.
  void set_num_classes(std::int64_t classes, const std::string& what = "set_num_classes");
  /// Rows of the whole file.
  std::int64_t rows() const { return rows_; }
  const data::Dataset& train_set() const { return train_; }

 private:
  std::int64_t rows_ = 0, classes_ = 0, label_classes_ = 0;  // label_classes_: largest label + 1
  std::uint64_t fnv_ = 0;  // of the rows as read (checkpoint_config's data_fnv1a)
  double val_fraction_;
};

/// Given data sets as they are (no split, no standardisation): batches of `train` in a
/// data::DataLoader's order (shuffled with `seed` per epoch, or in order), `eval` as the
/// evaluation set (may be empty: no evaluation). For tests and programs that build their data.
class DatasetSource final : public LoaderSource {
 public:
  /// `outputs`: what the model must produce per row (the default MLP's last size); 0: the
  /// number of classes of train's labels. Throws InvalidArgument for a malformed data set and
  /// for a `train` of no rows.
  DatasetSource(data::Dataset train, data::Dataset eval = {}, std::uint64_t seed = 0,
                bool shuffle = true, std::int64_t outputs = 0);

  std::int64_t num_outputs() const override { return outputs_; }
  std::map<std::string, std::string> checkpoint_config() const override;

 private:
  std::int64_t outputs_;
};

/// Batches made by a function of (epoch, i): synthetic data for tests and benches, whose batch
/// i of an epoch need not come from one data set. `inputs`/`outputs` size the default MLP.
/// `make` is called from every rank thread (ddp): it must be safe to call concurrently. The
/// Trainer refuses a batch of no rows (InvalidArgument naming the epoch and batch).
class FunctionSource final : public DataSource {
 public:
  using MakeBatch = std::function<data::Batch(std::int64_t epoch, std::int64_t i)>;
  FunctionSource(std::int64_t batches_per_epoch, std::int64_t inputs, std::int64_t outputs,
                 MakeBatch make, data::Dataset eval = {});

  std::int64_t batches_per_epoch(std::int64_t) const override { return batches_; }
  /// make(epoch, i); the batch size is the function's.
  data::Batch batch(std::int64_t epoch, std::int64_t i, std::int64_t) override;
  const data::Dataset& eval_set() const override { return eval_; }
  std::int64_t train_size() const override { return 0; }
  std::int64_t num_inputs() const override { return inputs_; }
  std::int64_t num_outputs() const override { return outputs_; }
  std::map<std::string, std::string> checkpoint_config() const override { return {}; }

 private:
  std::int64_t batches_, inputs_, outputs_;
  MakeBatch make_;
  data::Dataset eval_;
};

}  // namespace ditto::train
