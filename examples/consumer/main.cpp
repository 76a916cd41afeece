// A user program of the installed library (examples/consumer/CMakeLists.txt): four simulated
// GPUs, one tensor on each, an all_reduce (sum) as NCCL's ncclAllReduce over ncclCommInitAll's
// communicators, and the result checked element by element on the host. Then a call with a
// tensor missing, which throws ditto::InvalidArgument before any rank's work is enqueued. With a
// CSV path (consumer P/share/ditto/digits.csv), also one epoch of the Trainer with the
// simulator's H100 profile attached as docs/api.md shows it (sim::add_sim_run,
// backend_sim/sim_run.h), checking that the run predicts a step time.
// Prints one line starting "consumer: OK" and exits 0, or says what differed and exits 1.
#include <cstdio>
#include <memory>
#include <vector>

#include "backend_sim/sim_run.h"
#include "core/base/error.h"
#include "core/comm/communicator.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "core/train/trainer.h"

int main(int argc, char** argv) {
  using namespace ditto;
  constexpr int kDevices = 4;
  constexpr std::int64_t kCount = 1000;
  try {
    BackendOptions opts;
    opts.device_count = kDevices;
    opts.memory_capacity = std::size_t(1) << 30;  // 1 GiB per virtual GPU
    init_backend("sim", opts);
    std::vector<Device> devs = devices("sim", kDevices);

    // Rank r holds (r + 1) * (i % 7) at element i: the sum over ranks, 10 * (i % 7), is exact.
    std::vector<Tensor> t;
    for (int r = 0; r < kDevices; ++r) {
      std::vector<float> v(kCount);
      for (std::int64_t i = 0; i < kCount; ++i) v[i] = float((r + 1) * (i % 7));
      t.push_back(Tensor::from_vector(v, {kCount}, devs[r]));
    }
    std::vector<Communicator> comms = Communicator::init_all(devs);
    all_reduce(comms, t, ReduceOp::sum);
    synchronize(comms);
    for (int r = 0; r < kDevices; ++r) {
      const std::vector<float> got = t[r].to_vector<float>();
      for (std::int64_t i = 0; i < kCount; ++i)
        if (got[i] != float(10 * (i % 7))) {
          std::printf("consumer: FAIL: rank %d element %ld: got %g, expected %d\n", r, long(i),
                      got[i], int(10 * (i % 7)));
          return 1;
        }
    }

    std::vector<Tensor> three(t.begin(), t.begin() + 3);
    try {
      all_reduce(comms, three, ReduceOp::sum);
      std::printf("consumer: FAIL: all_reduce with 3 tensors for 4 ranks did not throw\n");
      return 1;
    } catch (const InvalidArgument&) {
    }
    // The Trainer with the simulator's extension (docs/api.md, "Train from C++").
    train::TrainerConfig cfg;
    cfg.epochs = 1;
    auto run = sim::add_sim_run(cfg, {.profile = "h100-sxm"});
    run->validate(cfg);
    double step_time_s = 0;
    if (argc > 1) {
      auto data =
          std::make_shared<train::CsvDataSource>(argv[1], data::CsvOptions{}, 0.2, cfg.seed);
      const train::FitResult r = train::Trainer(cfg, data).fit();
      if (!r.prediction || !(r.prediction->step_time_s > 0)) {
        std::printf("consumer: FAIL: a run with sim::add_sim_run's h100-sxm profile predicted no "
                    "step time\n");
        return 1;
      }
      step_time_s = r.prediction->step_time_s;
    }
    std::printf("consumer: OK: all_reduce(sum) over %d sim devices, %ld elements each, every "
                "element as expected; a call with 3 tensors for %d ranks threw InvalidArgument; "
                "sim::add_sim_run(h100-sxm)%s%.3g%s\n",
                kDevices, long(kCount), kDevices,
                argc > 1 ? ": an epoch of the Trainer predicted " : " attached",
                argc > 1 ? step_time_s * 1e3 : 0.0, argc > 1 ? " ms a step" : "");
    return 0;
  } catch (const Error& e) {
    std::printf("consumer: FAIL: %s\n", e.what());
    return 1;
  }
}
