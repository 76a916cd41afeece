// ditto::comm (the torch.cuda.comm helpers) on every dtype, on the simulator: broadcast and
// scatter / gather move each dtype's bytes unchanged; broadcast_coalesced with mixed dtypes in
// one call packs one dtype per buffer (as torch does) and returns every tensor's bytes;
// reduce_add and reduce_add_coalesced sum every dtype (integers wrap, as torch; floats in their
// accumulator, rounded once: Note [Reductions over ranks]) against a host reference, and the
// bitwise f16 / bf16 sum is the canonical tree's, which a left-to-right sum rounded to f16 at
// every step does not give.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

#include "core/comm/comm.h"
#include "core/numerics/determinism.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;
using CommDtypes = SimSuite<8>;

using Bytes = std::vector<std::uint8_t>;
// A [rows, 3] host tensor of dtype t with distinct values per seed (negative ones, and the
// dtype's extremes for integers so that sums wrap).
Tensor values(DType t, std::int64_t rows, int seed) {
  Tensor h = Tensor::empty({rows, 3}, t, Device::cpu());
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(h.data_ptr());
    for (std::int64_t i = 0; i < rows * 3; ++i) {
      double v = (i % 7 - 3) * 1.25 + seed * 0.375;
      if constexpr (std::is_integral_v<T>) {
        v = std::trunc(v);
        if (i == 1) v = double(std::numeric_limits<T>::max());  // wraps in a sum
      }
      p[i] = convert<T>(v);
    }
  });
  return h;
}

TEST_F(CommDtypes, BroadcastScatterGatherMoveEveryDtypesBytes) {
  for (DType t : kAllDTypes) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor h = values(t, 6, 1);
    const Tensor src = h.to(sim_device(2));
    for (const Tensor& c : comm::broadcast(src, {sim_device(0), sim_device(2), sim_device(5)})) {
      EXPECT_EQ(c.dtype(), t);
      EXPECT_EQ(tensor_bytes(c), tensor_bytes(h));
    }
    const auto parts = comm::scatter(src, {sim_device(1), sim_device(3), sim_device(4)},
                                     std::vector<std::int64_t>{1, 3, 2});
    ASSERT_EQ(parts.size(), 3u);
    EXPECT_EQ(parts[1].device(), sim_device(3));
    EXPECT_EQ(tensor_bytes(parts[1]), tensor_bytes(h.narrow(1, 3)));
    EXPECT_EQ(tensor_bytes(comm::gather(parts, 0, Device::cpu())), tensor_bytes(h));
    // Along dim 1 (strided copies).
    const auto cols =
        comm::scatter(src, {sim_device(0), sim_device(6)}, std::vector<std::int64_t>{2, 1}, 1);
    EXPECT_EQ(tensor_bytes(comm::gather(cols, 1, sim_device(7))), tensor_bytes(h));
  }
}

TEST_F(CommDtypes, BroadcastCoalescedWithMixedDtypesPacksOneDtypePerBuffer) {
  std::vector<Tensor> in;
  std::vector<Tensor> host;
  for (DType t : kAllDTypes) {
    host.push_back(values(t, 2, 3));
    in.push_back(host.back().to(sim_device(0)));
  }
  in.push_back(
      values(DType::bf16, 1, 4).to(sim_device(0)));  // a second bf16 shares the bf16 buffer
  host.push_back(values(DType::bf16, 1, 4));
  const auto out = comm::broadcast_coalesced(in, {sim_device(0), sim_device(1), sim_device(7)}, 64);
  ASSERT_EQ(out.size(), 3u);
  for (std::size_t d = 0; d < 3; ++d)
    for (std::size_t i = 0; i < in.size(); ++i) {
      SCOPED_TRACE(std::to_string(d) + " " + std::to_string(i));
      EXPECT_EQ(out[d][i].dtype(), in[i].dtype());
      EXPECT_EQ(out[d][i].shape(), in[i].shape());
      EXPECT_EQ(tensor_bytes(out[d][i]), tensor_bytes(host[i]));
    }
  // The two bf16 tensors travel in one flat bf16 buffer: the views share storage on sim:1.
  EXPECT_EQ(out[1][4].buffer(), out[1][12].buffer());
  EXPECT_NE(out[1][3].buffer(), out[1][4].buffer());  // f16 and bf16 never share a buffer
}

// Host reference of reduce_add: Acc sum in input order (exact for integers: wrapping), one
// rounding. For the data here (few inputs, small values) every order gives the same floats.
Tensor reference_sum(const std::vector<Tensor>& hs) {
  const DType t = hs[0].dtype();
  Tensor out = Tensor::empty(hs[0].shape(), t, Device::cpu());
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    for (std::int64_t i = 0; i < out.numel(); ++i) {
      if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        U s = 0;
        for (const Tensor& h : hs)
          s = static_cast<U>(s + static_cast<U>(static_cast<const T*>(h.data_ptr())[i]));
        static_cast<T*>(out.data_ptr())[i] = static_cast<T>(s);
      } else {
        double s = 0;  // exact for these values, as the f32 accumulator is
        for (const Tensor& h : hs) s += convert<double>(static_cast<const T*>(h.data_ptr())[i]);
        static_cast<T*>(out.data_ptr())[i] = convert<T>(s);
      }
    }
  });
  return out;
}

TEST_F(CommDtypes, ReduceAddSumsEveryDtypeOntoTheDestination) {
  for (DType t : kAllDTypes)
    for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
      SCOPED_TRACE(std::string(dtype_name(t)) +
                   (mode == Determinism::bitwise ? " bitwise" : " fast"));
      std::vector<Tensor> hs, in;
      for (int r = 0; r < 3; ++r) {
        hs.push_back(values(t, 4, r));
        in.push_back(hs.back().to(sim_device(r)));
      }
      const Bytes want = tensor_bytes(reference_sum(hs));
      Tensor out = comm::reduce_add(in, sim_device(4), mode);
      EXPECT_EQ(out.dtype(), t);
      EXPECT_EQ(out.device(), sim_device(4));
      EXPECT_EQ(tensor_bytes(out), want);
      EXPECT_EQ(tensor_bytes(comm::reduce_add(in, Device::cpu(), mode)), want);
      // Coalesced, mixed with an f32 and an i8 list entry.
      std::vector<std::vector<Tensor>> lists;
      std::vector<Tensor> f32s, i8s;
      for (int r = 0; r < 3; ++r) {
        f32s.push_back(values(DType::f32, 1, r));
        i8s.push_back(values(DType::i8, 2, r));
        lists.push_back({in[r], f32s.back().to(sim_device(r)), i8s.back().to(sim_device(r))});
      }
      const auto sums = comm::reduce_add_coalesced(lists, sim_device(0), 1 << 20, mode);
      ASSERT_EQ(sums.size(), 3u);
      EXPECT_EQ(tensor_bytes(sums[0]), want);
      EXPECT_EQ(tensor_bytes(sums[1]), tensor_bytes(reference_sum(f32s)));
      EXPECT_EQ(tensor_bytes(sums[2]), tensor_bytes(reference_sum(i8s)));
    }
  std::vector<Tensor> mixed = {Tensor::zeros({2}, DType::bf16, sim_device(0)),
                               Tensor::zeros({2}, DType::f16, sim_device(1))};
  EXPECT_THROW_MSG(comm::reduce_add(mixed), InvalidArgument,
                   "comm::reduce_add: inputs[1]: expected dtype bf16 (like inputs[0]), got [2] "
                   "f16 on sim:1");
}

TEST_F(CommDtypes, ReduceAddF16BitwiseIsTheCanonicalTreeRoundedOnce) {
  // Eight inputs whose f16 sum depends on the order: 2048 plus seven 1s. In f32 the exact sum
  // is 2055, rounded once to f16 (spacing 2): 2056. Rounding to f16 after every step (a naive
  // left-to-right kernel) leaves 2048 + 1 = 2048 each time.
  std::vector<Tensor> in;
  for (int r = 0; r < 8; ++r)
    in.push_back(Tensor::full({3}, r == 0 ? 2048.0 : 1.0, DType::f16, sim_device(r)));
  const Tensor sum = comm::reduce_add(in, sim_device(0), Determinism::bitwise);
  const auto got = sum.to_vector<float16>();
  EXPECT_EQ(got[0].bits, float16::from(2056.0f).bits);
  float16 naive = float16::from(2048.0f);
  for (int r = 1; r < 8; ++r) naive = float16::from(naive.to_float() + 1.0f);
  EXPECT_EQ(naive.bits, float16::from(2048.0f).bits);
  EXPECT_NE(got[0].bits, naive.bits);
  // bf16 likewise: 256 + 1 + 1 is 258 rounded once; per step 256 + 1 ties back to 256.
  const Tensor bf = comm::reduce_add({Tensor::full({1}, 256.0, DType::bf16, sim_device(0)),
                                      Tensor::full({1}, 1.0, DType::bf16, sim_device(1)),
                                      Tensor::full({1}, 1.0, DType::bf16, sim_device(2))},
                                     sim_device(0), Determinism::bitwise);
  EXPECT_EQ(bf.item<bfloat16>().bits, bfloat16::from(258.0f).bits);
  EXPECT_EQ(bfloat16::from(256.0f + 1.0f).bits, bfloat16::from(256.0f).bits);
}

}  // namespace
}  // namespace ditto
