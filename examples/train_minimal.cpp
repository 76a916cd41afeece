// train_minimal: a whole training program on ditto's Trainer (core/train/trainer.h): the MLP
// 64-128-10 on the bundled digits, DataParallel over 4 simulated GPUs, bitwise mode.
#include <cinttypes>
#include <cstdio>
#include <memory>

#include "core/base/error.h"
#include "core/train/trainer.h"

int main(int argc, char** argv) {
  using namespace ditto::train;
  TrainerConfig cfg;  // defaults: sim backend, 4 devices, SGD lr 0.05, batch 64, 20 epochs
  cfg.epochs = 5;
  try {  // bad input (a missing or malformed CSV, a bad config) throws ditto::Error
    auto digits = std::make_shared<CsvDataSource>(argc > 1 ? argv[1] : DITTO_DEFAULT_DATA,
                                                  ditto::data::CsvOptions{}, 0.2, cfg.seed);
    TrainerCallbacks cb;
    cb.on_epoch = [](const EpochMetrics& m) {
      std::printf("epoch %d train_loss=%.4f val_acc=%.4f\n", m.epoch, m.train_loss, m.val_acc);
    };
    FitResult r = Trainer(cfg, digits, cb).fit();
    std::printf("final: val_loss=%.6f val_acc=%.4f params_checksum=%016" PRIx64 "\n", r.eval.loss,
                r.eval.accuracy, r.params_checksum);
  } catch (const ditto::Error& e) {
    std::fprintf(stderr, "train_minimal: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
