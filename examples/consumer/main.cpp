// A user program of the installed library (examples/consumer/CMakeLists.txt): four simulated
// GPUs, one tensor on each, an all_reduce (sum) as NCCL's ncclAllReduce over ncclCommInitAll's
// communicators, and the result checked element by element on the host. Then a call with a
// tensor missing, which throws ditto::InvalidArgument before any rank's work is enqueued.
// Prints one line starting "consumer: OK" and exits 0, or says what differed and exits 1.
#include <cstdio>
#include <vector>

#include "core/base/error.h"
#include "core/comm/communicator.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"

int main() {
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
    std::printf("consumer: OK: all_reduce(sum) over %d sim devices, %ld elements each, every "
                "element as expected; a call with 3 tensors for %d ranks threw InvalidArgument\n",
                kDevices, long(kCount), kDevices);
    return 0;
  } catch (const Error& e) {
    std::printf("consumer: FAIL: %s\n", e.what());
    return 1;
  }
}
