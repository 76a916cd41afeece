// dataparallel_demo: parallel::DataParallel on a small synthetic classification problem, the
// shape of the PyTorch DataParallel tutorial: 1000 samples of 10 features in 2 classes (800 train,
// 200 validation), a 10-5-ReLU-2 model, cross-entropy, SGD lr 0.01, batch 32, 10 epochs.
//
//   build/bin/dataparallel_demo [devices=4]
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/base/error.h"
#include "core/data/data_loader.h"
#include "core/data/dataset.h"
#include "core/nn/loss.h"
#include "core/nn/sequential.h"
#include "core/numerics/random.h"
#include "core/optim/sgd.h"
#include "core/parallel/data_parallel.h"
#include "core/runtime/backend.h"
#include "examples/demo_devices.h"

using namespace ditto;

int main(int argc, char** argv) try {
  const std::vector<Device> devs = ditto_examples::demo_sim_devices(argc, argv);

  // Two Gaussian-ish blobs: class 1 is shifted by +0.8 in every feature.
  const std::int64_t n = 1000, f = 10;
  std::vector<float> x(n * f);
  std::vector<std::int64_t> y(n);
  for (std::int64_t i = 0; i < n; ++i) {
    y[i] = philox_u32(3, stream_id(kStreamSynthetic, 0), i) & 1;
    for (std::int64_t j = 0; j < f; ++j)
      x[i * f + j] =
          uniform(3, stream_id(kStreamSynthetic, 1), i * f + j, -1, 1) + (y[i] ? 0.8f : 0.0f);
  }
  data::Dataset all;
  all.features = Tensor::from_vector(x, {n, f});
  all.labels = Tensor::from_vector(y, {n});
  data::Split split = data::train_val_split(all, 0.2, /*seed=*/3);

  auto model = nn::mlp({10, 5, 2}, devs[0], /*seed=*/3);
  model->set_input_requires_grad(false);
  parallel::DataParallel dp(*model, devs);
  nn::CrossEntropyLoss criterion;
  optim::SGDOptions so;
  so.lr = 0.01f;
  optim::SGD opt(model->parameters(), so);

  data::DataLoader train(split.train, 32, /*shuffle=*/true, /*seed=*/3);
  data::DataLoader val(split.val, 200);
  for (int epoch = 0; epoch < 10; ++epoch) {
    train.set_epoch(epoch);
    for (data::Batch b : train) {
      Tensor out = dp.forward(b.x);
      criterion.forward(out, b.y.to(out.device()));
      opt.zero_grad(true);
      dp.backward(criterion.backward());
      opt.step();
    }
    double vloss = 0;
    for (data::Batch b : val) {
      Tensor out = dp.forward(b.x);
      vloss += criterion.forward(out, b.y.to(out.device())).item() * b.x.size(0);
    }
    std::printf("epoch %d  replicas=%d  val_loss=%.4f\n", epoch, dp.last_num_replicas(),
                vloss / split.val.size());
  }
  return 0;
} catch (const ditto::Error& e) {
  std::fprintf(stderr, "dataparallel_demo: error: %s\n", e.what());
  return 1;
}
