// api_tour: the API in one page (docs/api.md "The API in one page"), as a whole program that checks
// what it computes: torch.cuda.comm, NCCL-style collectives, nn.DataParallel and
// DistributedDataParallel on 4 simulated GPUs. Exits 1 with "api_tour: FAIL ..." on a wrong value.
#include <cstdio>
#include <thread>
#include <vector>

#include "core/comm/comm.h"
#include "core/comm/communicator.h"
#include "core/nn/loss.h"
#include "core/nn/sequential.h"
#include "core/optim/sgd.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/distributed_data_parallel.h"
#include "core/runtime/backend.h"
using namespace ditto;

static int failures = 0;
static void check(bool ok, const char* what) {
  if (!ok) std::printf("api_tour: FAIL %s\n", what), ++failures;
}

int main() {
  BackendOptions opts;
  opts.device_count = 4;                         // 4 virtual GPUs
  opts.memory_capacity = std::size_t(16) << 30;  // 16 GiB each
  init_backend("sim", opts);
  std::vector<Device> devs = devices("sim", 4);  // sim:0 .. sim:3

  // torch.cuda.comm
  Tensor x = Tensor::from_vector(std::vector<float>(9 * 2, 1.0f), {9, 2});  // on the host
  std::vector<Tensor> parts = comm::scatter(x, devs);  // 3, 3, 3 rows: 3 chunks, as torch.chunk
  Tensor sum = comm::reduce_add(comm::broadcast(parts[0], devs), devs[0]);
  Tensor back = comm::gather(parts, /*dim=*/0, Device::cpu());
  check(sum.to_vector<float>() == std::vector<float>(3 * 2, 4.0f), "reduce_add of 4 copies");
  check(back.to_vector<float>() == x.to_vector<float>(), "gather of the scattered parts");

  // NCCL-style collectives: one handle per rank (ncclCommInitAll); enqueued on each device's stream
  CommOptions co;
  co.determinism = Determinism::bitwise;
  std::vector<Communicator> comms = Communicator::init_all(devs, co);
  std::vector<Tensor> t;
  for (auto& d : devs) t.push_back(Tensor::full({1000}, 1.0f, d));
  all_reduce(comms, t, ReduceOp::sum);  // single controller; per thread: comms[r].all_reduce(t[r])
  synchronize(comms);
  for (const Tensor& r : t)
    check(r.to_vector<float>() == std::vector<float>(1000, 4.0f), "all_reduce");

  // nn.DataParallel, bitwise: the same bits on any power-of-two number of devices
  const std::int64_t B = 32;
  std::vector<float> xs(B * 64);
  std::vector<std::int64_t> ys(B);
  for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = float(i % 17) / 17.0f - 0.5f;
  for (std::int64_t i = 0; i < B; ++i) ys[i] = i % 10;
  Tensor batch_x = Tensor::from_vector(xs, {B, 64}), batch_y = Tensor::from_vector(ys, {B});
  auto model = nn::mlp({64, 128, 10}, devs[0], /*seed=*/0);
  parallel::DataParallelOptions dpo;
  dpo.determinism = Determinism::bitwise;
  parallel::DataParallel dp(*model, devs, dpo);
  nn::CrossEntropyLoss criterion;
  criterion.set_determinism(Determinism::bitwise);
  optim::SGD opt(model->parameters(), {.lr = 0.05f, .momentum = 0.9f});
  Tensor out = dp.forward(batch_x);  // scatter, replicate, parallel_apply, gather
  criterion.forward(out, batch_y.to(out.device()));
  opt.zero_grad(true);
  dp.backward(criterion.backward());  // gradients reduced onto devs[0]
  opt.step();

  // DistributedDataParallel: one thread per rank; with the loss over the global batch and no
  // averaging (Note [DDP loss scaling]) its parameters equal DataParallel's bit for bit
  std::vector<std::vector<float>> after(devs.size());
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.emplace_back([&, r] {
      auto replica = nn::mlp({64, 128, 10}, devs[r], /*seed=*/0);
      parallel::DistributedDataParallelOptions ddpo;
      ddpo.average_gradients = false;  // the loss divides by the global batch instead
      parallel::DistributedDataParallel ddp(*replica, comms[r], ddpo);
      nn::CrossEntropyLoss loss;
      loss.set_determinism(Determinism::bitwise);
      loss.set_global_batch(B);
      optim::SGD sgd(replica->parameters(), {.lr = 0.05f, .momentum = 0.9f});
      const auto [lo, hi] = ddp.local_rows(B);  // this rank's rows of the global batch
      Tensor local = ddp.forward({batch_x.narrow(lo, hi - lo)}, B);
      loss.forward(local, batch_y.narrow(lo, hi - lo).to(local.device()));
      sgd.zero_grad(true);
      ddp.backward(loss.backward());  // bucketed all_reduce overlaps backward
      sgd.step();
      for (nn::Parameter* p : replica->parameters())
        for (float v : p->data.to_vector<float>()) after[r].push_back(v);
    });
  for (auto& th : ranks) th.join();
  std::vector<float> want;
  for (nn::Parameter* p : model->parameters())
    for (float v : p->data.to_vector<float>()) want.push_back(v);
  for (const auto& a : after) check(a == want, "DDP's parameters equal DataParallel's");
  if (failures == 0) std::printf("api_tour: OK\n");
  return failures == 0 ? 0 : 1;
}
