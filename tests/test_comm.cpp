// Tests of ditto::comm (core/comm/comm.h), the torch.cuda.comm helpers, on the simulator:
// broadcast, broadcast_coalesced, reduce_add (+ host destination, + bitwise tree),
// reduce_add_coalesced, scatter (torch.chunk splits, chunk_sizes, any dim), gather (any dim, host,
// 0-dim), and the argument errors, against values computed on the host.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/comm/comm.h"
#include "core/runtime/backend.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

using CommTest = SimSuite<16, std::size_t(1) << 30>;

std::vector<float> iota(std::int64_t n, float start = 0.0f, float step = 1.0f) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[i] = start + step * static_cast<float>(i);
  return v;
}

bool shares_storage(const Tensor& a, const Tensor& b) {
  return a.buffer() == b.buffer() && a.offset_bytes() == b.offset_bytes();
}

// ---- broadcast --------------------------------------------------------------------------------

TEST_F(CommTest, BroadcastCopiesToEveryDeviceAndSharesTheOwnEntry) {
  Tensor t = Tensor::from_vector(iota(6), {2, 3}, sim_device(1));
  auto out = comm::broadcast(t, {sim_device(0), sim_device(1), sim_device(3)});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(shares_storage(out[1], t));
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(out[i].device(),
              (std::vector<Device>{sim_device(0), sim_device(1), sim_device(3)}[i]));
    EXPECT_EQ(out[i].shape(), (Shape{2, 3}));
    EXPECT_EQ(out[i].to_vector<float>(), iota(6));
  }
  EXPECT_FALSE(out[0].buffer() == t.buffer());
  // From the host, an i64 tensor, a zero-size tensor.
  Tensor h = Tensor::from_vector(std::vector<std::int64_t>{5, -6, 7}, {3});
  auto hb = comm::broadcast(h, {sim_device(2), sim_device(4)});
  EXPECT_EQ(hb[1].device(), sim_device(4));
  EXPECT_EQ(hb[1].to_vector<std::int64_t>(), (std::vector<std::int64_t>{5, -6, 7}));
  auto zb = comm::broadcast(Tensor::empty({0, 4}, DType::f32, sim_device(0)),
                            {sim_device(0), sim_device(1)});
  EXPECT_EQ(zb[1].shape(), (Shape{0, 4}));
}

TEST_F(CommTest, BroadcastRejectsBadDeviceLists) {
  Tensor t = Tensor::full({2}, 1.0f, sim_device(0));
  expect_error<InvalidArgument>([&] { comm::broadcast(t, {}); },
                                "comm::broadcast: devices: expected at least one device, got an "
                                "empty list");
  expect_error<InvalidArgument>(
      [&] {
        comm::broadcast(t, {sim_device(2), sim_device(0), sim_device(2)});
      },
      "comm::broadcast: devices: expected distinct devices, got sim:2 "
      "twice (at positions 0 and 2)");
  expect_error<InvalidArgument>(
      [&] {
        comm::broadcast(t, {sim_device(0), sim_device(16)});
      },
      "comm::broadcast: devices[1]: sim:16 is out of range (backend sim "
      "has 16 devices)");
  expect_error<InvalidArgument>(
      [&] {
        comm::broadcast(t, {sim_device(0), Device::cpu()});
      },
      "comm::broadcast: devices[1]: expected a device of a GPU backend");
  expect_error<InvalidArgument>([&] { comm::broadcast(Tensor(), {sim_device(0)}); },
                                "comm::broadcast: tensor: expected a defined tensor");
}

TEST_F(CommTest, BroadcastCoalescedPacksSmallTensorsAndKeepsLargeOnesAlone) {
  const std::vector<Device> devs = {sim_device(2), sim_device(0), sim_device(7)};
  std::vector<Tensor> in = {
      Tensor::from_vector(iota(3, 1.0f), {3}, sim_device(2)),  // 12 bytes
      Tensor::from_vector(std::vector<std::int64_t>{-1, 1LL << 40}, {2},
                          sim_device(2)),                                     // 16 bytes
      Tensor::from_vector(iota(4, 10.0f), {2, 2}, sim_device(2)),             // 16 bytes
      Tensor::from_vector(iota(100, -50.0f, 0.5f), {10, 10}, sim_device(2)),  // 400 bytes
      Tensor::from_vector(std::vector<float>{42.0f}, {}, sim_device(2)),      // 0-dim
      Tensor::empty({0}, DType::f32, sim_device(2)),
      Tensor::from_vector(std::vector<std::int64_t>{3}, {1}, sim_device(2)),
  };
  auto out = comm::broadcast_coalesced(in, devs, 32);
  ASSERT_EQ(out.size(), 3u);
  for (std::size_t d = 0; d < devs.size(); ++d) {
    ASSERT_EQ(out[d].size(), in.size());
    for (std::size_t i = 0; i < in.size(); ++i) {
      SCOPED_TRACE(detail::cat("device ", d, " tensor ", i));
      EXPECT_EQ(out[d][i].device(), devs[d]);
      EXPECT_EQ(out[d][i].shape(), in[i].shape());
      EXPECT_EQ(out[d][i].dtype(), in[i].dtype());
      if (in[i].dtype() == DType::f32)
        EXPECT_EQ(out[d][i].to_vector<float>(), in[i].to_vector<float>());
      else
        EXPECT_EQ(out[d][i].to_vector<std::int64_t>(), in[i].to_vector<std::int64_t>());
    }
  }
  for (std::size_t i = 0; i < in.size(); ++i) EXPECT_TRUE(shares_storage(out[0][i], in[i]));
  // f32 [3] and [2, 2] (28 bytes) travel in one buffer; the 400-byte tensor alone.
  EXPECT_EQ(out[1][0].buffer(), out[1][2].buffer());
  EXPECT_NE(out[1][0].buffer(), out[1][3].buffer());

  expect_error<InvalidArgument>(
      [&] {
        comm::broadcast_coalesced({in[0], Tensor::full({2}, 1.0f, sim_device(0))}, devs);
      },
      "comm::broadcast_coalesced: tensors[1]: expected a tensor on devices[0] = sim:2, got [2] f32 "
      "on sim:0");
  expect_error<InvalidArgument>(
      [&] {
        comm::broadcast_coalesced(in, {sim_device(2), sim_device(2)});
      },
      "comm::broadcast_coalesced: devices: expected distinct devices");
  EXPECT_EQ(comm::broadcast_coalesced({}, devs).size(), 3u);
}

// ---- reduce_add -------------------------------------------------------------------------------

std::vector<Tensor> rank_tensors(int n, const Shape& shape, int first_device = 0) {
  std::vector<Tensor> v;
  std::int64_t numel = shape_numel(shape);
  for (int r = 0; r < n; ++r)
    v.push_back(Tensor::from_vector(iota(numel, static_cast<float>(r), 0.5f * (r + 1)), shape,
                                    sim_device(first_device + r)));
  return v;
}

std::vector<float> rank_sum(int n, std::int64_t numel) {
  std::vector<float> s(static_cast<std::size_t>(numel), 0.0f);
  for (int r = 0; r < n; ++r) {
    auto v = iota(numel, static_cast<float>(r), 0.5f * (r + 1));
    for (std::int64_t i = 0; i < numel; ++i) s[i] += v[i];
  }
  return s;
}

TEST_F(CommTest, ReduceAddSumsOntoTheDestination) {
  auto in = rank_tensors(4, {3, 5});
  Tensor a = comm::reduce_add(in);
  EXPECT_EQ(a.device(), sim_device(0));
  EXPECT_EQ(a.shape(), (Shape{3, 5}));
  EXPECT_EQ(a.to_vector<float>(), rank_sum(4, 15));
  Tensor b = comm::reduce_add(in, sim_device(9));
  EXPECT_EQ(b.device(), sim_device(9));
  EXPECT_EQ(b.to_vector<float>(), rank_sum(4, 15));
  Tensor h = comm::reduce_add(in, Device::cpu());
  EXPECT_TRUE(h.device().is_cpu());
  EXPECT_EQ(h.to_vector<float>(), rank_sum(4, 15));
  // A new tensor even for one input; zero-size tensors.
  Tensor one = comm::reduce_add({in[2]});
  EXPECT_FALSE(one.buffer() == in[2].buffer());
  EXPECT_EQ(one.to_vector<float>(), in[2].to_vector<float>());
  Tensor z = comm::reduce_add({Tensor::empty({0, 3}, DType::f32, sim_device(0)),
                               Tensor::empty({0, 3}, DType::f32, sim_device(1))});
  EXPECT_EQ(z.shape(), (Shape{0, 3}));
}

// Mixed magnitudes: a left-to-right sum over inputs differs from the canonical tree.
float mixed(int r, std::int64_t i) { return mixed_rank_value(r, i, 977u); }
float host_tree(int lo, int hi, std::int64_t i) { return test::host_tree(lo, hi, i, mixed); }

TEST_F(CommTest, ReduceAddBitwiseFollowsTheCanonicalTree) {
  const std::int64_t numel = 500;
  for (int n = 1; n <= 16; ++n) {
    SCOPED_TRACE(detail::cat(n, " inputs"));
    std::vector<Tensor> in;
    std::vector<std::vector<Tensor>> lists;
    for (int r = 0; r < n; ++r) {
      std::vector<float> v(numel);
      for (std::int64_t i = 0; i < numel; ++i) v[i] = mixed(r, i);
      in.push_back(Tensor::from_vector(v, {numel}, sim_device(r)));
      lists.push_back({in.back().narrow(0, 200), in.back().narrow(200, 300)});
    }
    int differ = 0;
    for (std::int64_t i = 0; i < numel; ++i) {
      float left = mixed(0, i);
      for (int r = 1; r < n; ++r) left = left + mixed(r, i);
      differ += bits(left) != bits(host_tree(0, n, i));
    }
    // Up to 3 inputs the tree is the left-to-right sum; from 4 on the inputs must differ.
    if (n >= 4) {
      ASSERT_GT(differ, 10) << "inputs do not tell the tree from a left-to-right sum";
    }
    auto got = comm::reduce_add(in, sim_device(3), Determinism::bitwise).to_vector<float>();
    auto got_host = comm::reduce_add(in, Device::cpu(), Determinism::bitwise).to_vector<float>();
    auto co = comm::reduce_add_coalesced(lists, sim_device(1), 1000, Determinism::bitwise);
    auto co0 = co[0].to_vector<float>(), co1 = co[1].to_vector<float>();
    for (std::int64_t i = 0; i < numel; ++i) {
      const float want = host_tree(0, n, i);
      ASSERT_EQ(bits(got[i]), bits(want)) << "element " << i;
      ASSERT_EQ(bits(got_host[i]), bits(want)) << "element " << i;
      ASSERT_EQ(bits(i < 200 ? co0[i] : co1[i - 200]), bits(want)) << "element " << i;
    }
  }
}

TEST_F(CommTest, ReduceAddRejectsBadInputs) {
  auto in = rank_tensors(3, {4});
  expect_error<InvalidArgument>([] { comm::reduce_add({}); },
                                "comm::reduce_add: inputs: expected at least one tensor, got an "
                                "empty list");
  expect_error<InvalidArgument>(
      [&] {
        comm::reduce_add({in[0], Tensor::full({5}, 1.0f, sim_device(1))});
      },
      "comm::reduce_add: inputs[1]: expected shape [4] (like inputs[0]), got [5] f32 on sim:1");
  expect_error<InvalidArgument>(
      [&] {
        comm::reduce_add({in[0], Tensor::zeros({4}, DType::i64, sim_device(1))});
      },
      "comm::reduce_add: inputs[1]: expected dtype f32 (like inputs[0]), got [4] i64 on sim:1");
  expect_error<InvalidArgument>(
      [&] {
        comm::reduce_add({in[0], in[1].to(Device::cpu())});
      },
      "comm::reduce_add: inputs[1]: expected a tensor on a device of a "
      "GPU backend, got [4] f32 on cpu");
  expect_error<InvalidArgument>([&] { comm::reduce_add(in, sim_device(20)); },
                                "comm::reduce_add: destination: sim:20 is out of range");
}

TEST_F(CommTest, ReduceAddCoalescedSumsEveryTensor) {
  const int n = 3;
  const std::vector<Shape> shapes = {{3}, {2, 2}, {40}, {}, {0, 2}, {5}};
  std::vector<std::vector<Tensor>> in(n);
  for (int d = 0; d < n; ++d)
    for (std::size_t i = 0; i < shapes.size(); ++i)
      in[d].push_back(Tensor::from_vector(
          iota(shape_numel(shapes[i]), static_cast<float>(d * 10 + i), 0.25f * (d + 1)), shapes[i],
          sim_device(d + 4)));
  for (std::optional<Device> dest : {std::optional<Device>{}, std::optional<Device>{sim_device(6)},
                                     std::optional<Device>{Device::cpu()}}) {
    auto out = comm::reduce_add_coalesced(in, dest, 32);  // [3] + [2, 2] packed, [40] alone
    ASSERT_EQ(out.size(), shapes.size());
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      SCOPED_TRACE(detail::cat("tensor ", i));
      EXPECT_EQ(out[i].device(), dest.value_or(sim_device(4)));
      EXPECT_EQ(out[i].shape(), shapes[i]);
      std::vector<float> want(static_cast<std::size_t>(shape_numel(shapes[i])), 0.0f);
      for (int d = 0; d < n; ++d) {
        auto v = in[d][i].to_vector<float>();
        for (std::size_t k = 0; k < want.size(); ++k) want[k] += v[k];
      }
      EXPECT_EQ(out[i].to_vector<float>(), want);
    }
  }
  EXPECT_TRUE(comm::reduce_add_coalesced({{}, {}}).empty());
  auto short_list = in;
  short_list[2].pop_back();
  expect_error<InvalidArgument>([&] { comm::reduce_add_coalesced(short_list); },
                                "comm::reduce_add_coalesced: inputs[2]: expected 6 tensors (like "
                                "inputs[0]), got 5");
  auto bad_shape = in;
  bad_shape[1][2] = Tensor::full({41}, 1.0f, sim_device(5));
  expect_error<InvalidArgument>([&] { comm::reduce_add_coalesced(bad_shape); },
                                "comm::reduce_add_coalesced: inputs[1][2]: expected shape [40] "
                                "(like inputs[0][2]), got [41] f32 on sim:5");
  auto two_devices = in;
  two_devices[1][3] = Tensor::full({}, 1.0f, sim_device(9));
  expect_error<InvalidArgument>([&] { comm::reduce_add_coalesced(two_devices); },
                                "comm::reduce_add_coalesced: inputs[1][3]: expected a tensor on "
                                "sim:5 (each list on one device)");
  expect_error<InvalidArgument>([] { comm::reduce_add_coalesced({}); },
                                "comm::reduce_add_coalesced: inputs: expected one list of tensors "
                                "per device, got an empty list");
}

// ---- scatter / gather ---------------------------------------------------------------------------

TEST_F(CommTest, ChunkSizesFollowTorchChunk) {
  using V = std::vector<std::int64_t>;
  EXPECT_EQ(comm::chunk_sizes(9, 4), (V{3, 3, 3}));
  EXPECT_EQ(comm::chunk_sizes(36, 7), (V{6, 6, 6, 6, 6, 6}));
  EXPECT_EQ(comm::chunk_sizes(10, 4), (V{3, 3, 3, 1}));
  EXPECT_EQ(comm::chunk_sizes(8, 4), (V{2, 2, 2, 2}));
  EXPECT_EQ(comm::chunk_sizes(1, 4), (V{1}));
  EXPECT_EQ(comm::chunk_sizes(0, 3), (V{0, 0, 0}));
  expect_error<InvalidArgument>([] { comm::chunk_sizes(5, 0); },
                                "comm::chunk_sizes: n: expected at least 1 part, got 0");
}

// A size near the largest int64 (ditto-train --batch-size 9223372036854775807): size + n - 1 and
// the parts' ends overflowed (UBSan stopped the run in chunk_range).
TEST_F(CommTest, ChunkSizesAndRangeOfTheLargestSize) {
  using V = std::vector<std::int64_t>;
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();  // 2^63 - 1
  constexpr std::int64_t kHalf = std::int64_t(1) << 62;                    // ceil(kMax / 2)
  EXPECT_EQ(comm::chunk_sizes(kMax, 2), (V{kHalf, kHalf - 1}));
  EXPECT_EQ(comm::chunk_sizes(kMax, 1), (V{kMax}));
  EXPECT_EQ(comm::chunk_range(kMax, 2, 0), std::make_pair(std::int64_t(0), kHalf));
  EXPECT_EQ(comm::chunk_range(kMax, 2, 1), std::make_pair(kHalf, kMax));
  EXPECT_EQ(comm::chunk_range(kMax, 8, 7),
            std::make_pair(7 * (std::int64_t(1) << 60), kMax));  // ceil(kMax / 8) = 2^60
  EXPECT_EQ(comm::chunk_range(kMax, 1, 0), std::make_pair(std::int64_t(0), kMax));
}

// chunk_range: part i of chunk_sizes' split as rows [begin, end), empty past the last chunk
// (DistributedDataParallel::local_rows' fast split).
TEST_F(CommTest, ChunkRangeIsPartIOfChunkSizes) {
  for (std::int64_t size : {0, 1, 9, 10, 24, 36})
    for (std::int64_t n : {1, 3, 4, 7}) {
      const std::vector<std::int64_t> sizes = comm::chunk_sizes(size, n);
      std::int64_t next = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const auto [lo, hi] = comm::chunk_range(size, n, i);
        const std::size_t k = static_cast<std::size_t>(i);
        EXPECT_EQ(lo, next) << size << " over " << n << ", part " << i;
        EXPECT_EQ(hi - lo, k < sizes.size() ? sizes[k] : 0) << size << " over " << n << ", " << i;
        next = hi;
      }
      EXPECT_EQ(next, size);
    }
  EXPECT_EQ(comm::chunk_range(24, 3, 1), (std::pair<std::int64_t, std::int64_t>{8, 16}));
  EXPECT_EQ(comm::chunk_range(36, 7, 6), (std::pair<std::int64_t, std::int64_t>{36, 36}));
  expect_error<InvalidArgument>([] { comm::chunk_range(5, 2, 2); },
                                "comm::chunk_range: i: expected a part in 0..1, got 2");
}

// Sizes near INT64_MAX (tester hB, 5): (size + n - 1) / n and i * split overflowed, so
// chunk_range returned negative bounds and chunk_sizes grew its vector until bad_alloc.
TEST_F(CommTest, ChunkSizesAndRangeNearInt64MaxDoNotOverflow) {
  using V = std::vector<std::int64_t>;
  using R = std::pair<std::int64_t, std::int64_t>;
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kHalf = std::int64_t(1) << 62;
  EXPECT_EQ(comm::chunk_sizes(kMax, 2), (V{kHalf, kHalf - 1}));
  EXPECT_EQ(comm::chunk_sizes(kMax - 1, 3), (V(3, (kMax - 1) / 3)));
  EXPECT_EQ(comm::chunk_sizes(5, kMax), (V{1, 1, 1, 1, 1}));
  EXPECT_EQ(comm::chunk_range(kMax, 2, 0), (R{0, kHalf}));
  EXPECT_EQ(comm::chunk_range(kMax, 2, 1), (R{kHalf, kMax}));
  EXPECT_EQ(comm::chunk_range(kMax - 1, 3, 2), (R{2 * ((kMax - 1) / 3), kMax - 1}));
  EXPECT_EQ(comm::chunk_range(kMax, kMax, kMax - 1), (R{kMax - 1, kMax}));
  EXPECT_EQ(comm::chunk_range(5, kMax, kMax - 1), (R{5, 5}));
  EXPECT_EQ(comm::chunk_range(kMax, 3, 2), (R{2 * (kMax / 3 + 1), kMax}));
}

TEST_F(CommTest, ScatterAlongDim0SplitsLikeTorchChunk) {
  const std::vector<Device> four = {sim_device(0), sim_device(1), sim_device(2), sim_device(3)};
  Tensor t = Tensor::from_vector(iota(18), {9, 2}, sim_device(1));
  auto parts = comm::scatter(t, four);
  ASSERT_EQ(parts.size(), 3u);  // 9 over 4: chunks of 3, so only 3 chunks
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(parts[i].device(), four[i]);
    EXPECT_EQ(parts[i].shape(), (Shape{3, 2}));
    EXPECT_EQ(parts[i].to_vector<float>(), iota(6, 6.0f * i));
  }
  EXPECT_TRUE(parts[1].buffer() == t.buffer());  // own device: a view, as in PyTorch

  std::vector<Device> seven;
  for (int i = 0; i < 7; ++i) seven.push_back(sim_device(i + 8));
  auto p36 = comm::scatter(Tensor::from_vector(iota(36), {36}, Device::cpu()), seven);
  ASSERT_EQ(p36.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(p36[i].device(), seven[i]);
    EXPECT_EQ(p36[i].to_vector<float>(), iota(6, 6.0f * i));
  }
  // Fewer rows than devices; zero rows.
  auto p1 = comm::scatter(Tensor::from_vector(iota(3), {1, 3}, sim_device(0)), four);
  ASSERT_EQ(p1.size(), 1u);
  EXPECT_EQ(p1[0].to_vector<float>(), iota(3));
  auto p0 = comm::scatter(Tensor::empty({0, 3}, DType::f32, sim_device(0)), four);
  ASSERT_EQ(p0.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(p0[i].shape(), (Shape{0, 3}));
    EXPECT_EQ(p0[i].device(), four[i]);
  }
}

TEST_F(CommTest, ScatterWithChunkSizesAndAlongOtherDims) {
  const std::vector<Device> four = {sim_device(3), sim_device(2), sim_device(1), sim_device(0)};
  Tensor t = Tensor::from_vector(iota(12), {6, 2}, sim_device(5));
  auto parts = comm::scatter(t, four, std::vector<std::int64_t>{1, 0, 3, 2});
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_EQ(parts[0].to_vector<float>(), iota(2));
  EXPECT_EQ(parts[1].shape(), (Shape{0, 2}));
  EXPECT_EQ(parts[1].device(), sim_device(2));
  EXPECT_EQ(parts[2].to_vector<float>(), iota(6, 2.0f));
  EXPECT_EQ(parts[3].to_vector<float>(), iota(4, 8.0f));

  // [2, 5, 3] along dim 1 over 3 devices: chunks of 2, 2, 1 columns.
  Tensor m = Tensor::from_vector(iota(30), {2, 5, 3}, sim_device(0));
  for (std::int64_t dim : {1, -2}) {
    auto cols = comm::scatter(m, {sim_device(0), sim_device(1), sim_device(2)}, {}, dim);
    ASSERT_EQ(cols.size(), 3u);
    const std::int64_t widths[] = {2, 2, 1}, starts[] = {0, 2, 4};
    for (std::size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(cols[i].shape(), (Shape{2, widths[i], 3}));
      std::vector<float> want;
      for (std::int64_t a = 0; a < 2; ++a)
        for (std::int64_t b = starts[i]; b < starts[i] + widths[i]; ++b)
          for (std::int64_t c = 0; c < 3; ++c)
            want.push_back(static_cast<float>(a * 15 + b * 3 + c));
      EXPECT_EQ(cols[i].to_vector<float>(), want) << "chunk " << i;
    }
    // gather along the same dim gives the tensor back (to the host, too).
    EXPECT_EQ(comm::gather(cols, dim).to_vector<float>(), iota(30));
    Tensor back = comm::gather(cols, dim, Device::cpu());
    EXPECT_TRUE(back.device().is_cpu());
    EXPECT_EQ(back.shape(), (Shape{2, 5, 3}));
    EXPECT_EQ(back.to_vector<float>(), iota(30));
  }
  // Last dim, with chunk sizes, i64.
  Tensor l =
      Tensor::from_vector(std::vector<std::int64_t>{0, 1, 2, 3, 4, 5}, {2, 3}, sim_device(4));
  auto lc = comm::scatter(l, {sim_device(6), sim_device(7)}, std::vector<std::int64_t>{2, 1}, -1);
  EXPECT_EQ(lc[0].to_vector<std::int64_t>(), (std::vector<std::int64_t>{0, 1, 3, 4}));
  EXPECT_EQ(lc[1].to_vector<std::int64_t>(), (std::vector<std::int64_t>{2, 5}));
}

TEST_F(CommTest, ScatterRejectsBadArguments) {
  const std::vector<Device> four = {sim_device(0), sim_device(1), sim_device(2), sim_device(3)};
  Tensor t = Tensor::from_vector(iota(2), {1, 2}, sim_device(0));
  expect_error<InvalidArgument>(
      [&] {
        comm::scatter(t, four, std::vector<std::int64_t>{40, 9, 0, 0});
      },
      "comm::scatter: chunk_sizes: expected entries adding up to 1 (size of dim 0), got 49");
  expect_error<InvalidArgument>(
      [&] {
        comm::scatter(t, four, std::vector<std::int64_t>{1, 0, 0});
      },
      "comm::scatter: chunk_sizes: expected 4 entries (one per device), "
      "got 3");
  expect_error<InvalidArgument>(
      [&] {
        comm::scatter(t, four, std::vector<std::int64_t>{2, -1, 0, 0});
      },
      "comm::scatter: chunk_sizes[1]: expected a non-negative size, got -1");
  // Entries whose sum passes INT64_MAX: said so, not the wrapped sum ("got -3", tester hB 5).
  expect_error<InvalidArgument>(
      [&] {
        constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
        comm::scatter(t, {sim_device(0), sim_device(1)}, std::vector<std::int64_t>{kMax, kMax - 1});
      },
      "comm::scatter: chunk_sizes: expected entries adding up to 1 (size of dim 0), got a sum "
      "over 9223372036854775807");
  expect_error<InvalidArgument>([&] { comm::scatter(t, four, {}, 2); },
                                "comm::scatter: dim: expected a dim in [-2, 2) for a 2-dim tensor, "
                                "got 2");
  expect_error<InvalidArgument>(
      [&] { comm::scatter(Tensor::full({}, 1.0f, sim_device(0)), four); },
      "comm::scatter: tensor: expected at least 1 dim, got [] f32 on sim:0");
  expect_error<InvalidArgument>([&] { comm::scatter(t, {}); },
                                "comm::scatter: devices: expected at least one device, got an "
                                "empty list");
  expect_error<InvalidArgument>(
      [&] {
        comm::scatter(t, {sim_device(1), sim_device(1)});
      },
      "comm::scatter: devices: expected distinct devices, got sim:1 twice "
      "(at positions 0 and 1)");
  expect_error<InvalidArgument>([&] { comm::scatter(t, {sim_device(-1)}); },
                                "comm::scatter: devices[0]: sim:-1 is out of range");
}

TEST_F(CommTest, GatherConcatenatesAlongAnyDim) {
  // dim 0: rows 1, 3, 2 from three devices onto the first tensor's device.
  std::vector<Tensor> rows = {Tensor::from_vector(iota(4), {1, 4}, sim_device(2)),
                              Tensor::from_vector(iota(12, 4.0f), {3, 4}, sim_device(0)),
                              Tensor::from_vector(iota(8, 16.0f), {2, 4}, sim_device(5))};
  Tensor g = comm::gather(rows);
  EXPECT_EQ(g.device(), sim_device(2));
  EXPECT_EQ(g.shape(), (Shape{6, 4}));
  EXPECT_EQ(g.to_vector<float>(), iota(24));
  EXPECT_EQ(comm::gather(rows, 0, sim_device(11)).device(), sim_device(11));
  // dim 1 of [2, k] pieces.
  std::vector<Tensor> cols = {
      Tensor::from_vector(std::vector<float>{0, 1, 5, 6}, {2, 2}, sim_device(1)),
      Tensor::from_vector(std::vector<float>{2, 3, 4, 7, 8, 9}, {2, 3}, sim_device(3)),
      Tensor::empty({2, 0}, DType::f32, sim_device(4))};
  Tensor c = comm::gather(cols, 1, Device::cpu());
  EXPECT_EQ(c.shape(), (Shape{2, 5}));
  EXPECT_EQ(c.to_vector<float>(), iota(10));
  // i64.
  Tensor li =
      comm::gather({Tensor::from_vector(std::vector<std::int64_t>{7}, {1}, sim_device(0)),
                    Tensor::from_vector(std::vector<std::int64_t>{8, 9}, {2}, sim_device(1))});
  EXPECT_EQ(li.to_vector<std::int64_t>(), (std::vector<std::int64_t>{7, 8, 9}));
}

TEST_F(CommTest, GatherOfScalarsGivesAVector) {
  std::vector<Tensor> losses;
  for (int r = 0; r < 4; ++r) losses.push_back(Tensor::full({}, 0.5f * r, sim_device(r)));
  Tensor v = comm::gather(losses, 0, Device::cpu());
  EXPECT_EQ(v.shape(), (Shape{4}));
  EXPECT_EQ(v.to_vector<float>(), (std::vector<float>{0.0f, 0.5f, 1.0f, 1.5f}));
  EXPECT_EQ(comm::gather(losses).device(), sim_device(0));
}

TEST_F(CommTest, GatherRejectsBadArguments) {
  std::vector<Tensor> t = {Tensor::full({2, 4}, 1.0f, sim_device(0)),
                           Tensor::full({3, 4}, 1.0f, sim_device(1)),
                           Tensor::full({3, 5}, 1.0f, sim_device(2))};
  expect_error<InvalidArgument>([&] { comm::gather(t); },
                                "comm::gather: tensors[2]: expected shape [*, 4] (like tensors[0] "
                                "in every dim but 0), got [3, 5] f32 on sim:2");
  expect_error<InvalidArgument>(
      [&] {
        comm::gather({t[0], Tensor::full({2, 4, 1}, 1.0f, sim_device(1))});
      },
      "comm::gather: tensors[1]: expected shape [*, 4]");
  expect_error<InvalidArgument>(
      [&] {
        comm::gather({t[0], t[1]}, 1);
      },
      "comm::gather: tensors[1]: expected shape [2, *]");
  expect_error<InvalidArgument>(
      [&] {
        comm::gather({t[0], Tensor::zeros({1, 4}, DType::i64, sim_device(1))});
      },
      "comm::gather: tensors[1]: expected dtype f32 (like tensors[0]), got [1, 4] i64 on sim:1");
  expect_error<InvalidArgument>([] { comm::gather({}); },
                                "comm::gather: tensors: expected at least one tensor, got an empty "
                                "list");
  expect_error<InvalidArgument>([&] { comm::gather({t[0]}, 2); },
                                "comm::gather: dim: expected a dim in [-2, 2) for a 2-dim tensor, "
                                "got 2");
  expect_error<InvalidArgument>([&] { comm::gather({t[0]}, 0, sim_device(99)); },
                                "comm::gather: destination: sim:99 is out of range");
  expect_error<InvalidArgument>(
      [&] {
        comm::gather({Tensor::full({}, 1.0f, sim_device(0)), Tensor::full({}, 1.0f, sim_device(1))},
                     1);
      },
      "comm::gather: tensors[0]: expected at least 1 dim");
}

}  // namespace
}  // namespace ditto
