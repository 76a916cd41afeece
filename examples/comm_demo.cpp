// comm_demo: data parallelism by hand with ditto::comm (the torch.cuda.comm helpers).
//
// A 10-20-1 MLP with MSE loss on a few synthetic batches over every simulated device:
//   1. broadcast_coalesced the parameters from device 0 to every device (one replica each),
//   2. scatter the inputs and the targets along the batch dimension,
//   3. run each replica's forward on its chunk, gather the outputs on device 0, take the loss,
//   4. scatter the output gradient back, run each replica's backward,
//   5. reduce_add_coalesced the replicas' gradients onto device 0 and take an SGD step there.
// This is exactly what parallel::DataParallel does for you (see dataparallel_demo.cpp).
//
//   build/bin/comm_demo [devices=4]
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/base/error.h"
#include "core/comm/comm.h"
#include "core/nn/loss.h"
#include "core/nn/sequential.h"
#include "core/numerics/random.h"
#include "core/optim/sgd.h"
#include "core/runtime/backend.h"
#include "examples/demo_devices.h"

using namespace ditto;

int main(int argc, char** argv) try {
  const std::vector<Device> devs = ditto_examples::demo_sim_devices(argc, argv);
  const int n_dev = static_cast<int>(devs.size());

  auto model = nn::mlp({10, 20, 1}, devs[0], /*seed=*/1);
  model->set_input_requires_grad(false);
  optim::SGDOptions so;
  so.lr = 0.05f;
  optim::SGD opt(model->parameters(), so);
  nn::MSELoss criterion;

  // Synthetic regression: y = sum of the first three features + noise, 64 samples per batch.
  const std::int64_t batch = 64, features = 10;
  for (int step = 0; step < 8; ++step) {
    std::vector<float> x(batch * features), y(batch);
    for (std::int64_t i = 0; i < batch; ++i) {
      for (std::int64_t f = 0; f < features; ++f)
        x[i * features + f] =
            uniform(7, stream_id(kStreamSynthetic, step), i * features + f, -1, 1);
      y[i] = x[i * features] + x[i * features + 1] + x[i * features + 2] +
             0.01f * uniform(7, stream_id(kStreamSynthetic, 1000 + step), i, -1, 1);
    }
    Tensor xs = Tensor::from_vector(x, {batch, features});
    Tensor ys = Tensor::from_vector(y, {batch, 1});

    // 1. replicate: parameters from device 0 to every device.
    std::vector<Tensor> params;
    for (nn::Parameter* p : model->parameters()) params.push_back(p->data);
    auto copies = comm::broadcast_coalesced(params, devs);
    std::vector<std::unique_ptr<nn::Module>> replicas;
    for (int d = 0; d < n_dev; ++d) {
      replicas.push_back(model->clone());
      auto rp = replicas.back()->parameters();
      for (std::size_t k = 0; k < rp.size(); ++k) rp[k]->data = copies[d][k];
    }
    // 2. scatter inputs and targets the same way.
    std::vector<Tensor> xc = comm::scatter(xs, devs);
    std::vector<Tensor> yc = comm::scatter(ys, devs);
    const std::size_t n = xc.size();  // fewer than n_dev when the batch is small
    // 3. forward on each replica, gather outputs, loss on device 0.
    std::vector<Tensor> outs;
    for (std::size_t d = 0; d < n; ++d) outs.push_back(replicas[d]->forward(xc[d]));
    Tensor out = comm::gather(outs, 0, devs[0]);
    Tensor loss = criterion.forward(out, ys.to(devs[0]));
    // 4. backward: the output gradient goes back along the same split.
    std::vector<std::int64_t> sizes;
    for (auto& t : outs) sizes.push_back(t.size(0));
    std::vector<Device> used(devs.begin(), devs.begin() + static_cast<std::ptrdiff_t>(n));
    std::vector<Tensor> gout = comm::scatter(criterion.backward(), used, sizes);
    for (std::size_t d = 0; d < n; ++d) replicas[d]->backward(gout[d]);
    // 5. sum the gradients on device 0 and step.
    std::vector<std::vector<Tensor>> grads(n);
    for (std::size_t d = 0; d < n; ++d)
      for (nn::Parameter* p : replicas[d]->parameters()) grads[d].push_back(p->grad);
    std::vector<Tensor> sums = comm::reduce_add_coalesced(grads, devs[0]);
    auto mp = model->parameters();
    for (std::size_t k = 0; k < mp.size(); ++k) mp[k]->grad = sums[k];
    opt.step();
    std::printf("step %d  replicas=%zu  loss=%.6f\n", step, n, loss.item());
  }
  return 0;
} catch (const ditto::Error& e) {
  std::fprintf(stderr, "comm_demo: error: %s\n", e.what());
  return 1;
}
