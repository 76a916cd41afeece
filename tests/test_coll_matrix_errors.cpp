// Error cases of the collectives of issue 13 through the public API (simulator), one test each:
// ranks disagreeing on dtype or count, all_to_all_v counts that do not add up (across ranks and
// within one), a recv with no send and a send with no recv (Timeout naming both ranks), send /
// recv count or dtype mismatch (both sides fail), a peer or root out of range, a bare
// premul_sum, integer premul_sum scalars that are not integral or not representable, in-place
// all_to_all, wrong sizes; and avg, which NCCL refuses on no dtype, accepted on every one.
// Messages as the team spec fixes them (tests check substrings).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/runtime/backend.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

using CollMatrixErrors = SimSuite<8>;

Tensor zeros(DType t, std::int64_t n, const Device& d) { return Tensor::zeros({n}, t, d); }

/// Every rank's stream fails with E containing `part`.
template <typename E>
void expect_every_rank(std::vector<Communicator>& comms, const std::string& part) {
  for (auto& c : comms) expect_error<E>([&] { c.stream().synchronize(); }, detail::cat(part));
}

const std::string kWhere = " (collective #";

TEST_F(CollMatrixErrors, RanksWithDifferentDtypesFailEveryRank) {
  auto comms = Communicator::init_all(devices("sim", 2));
  const DType dt[2] = {DType::bf16, DType::f16};
  // Rank r's call on a send of `send` and a recv of `recv` elements (0: no recv, in place).
  struct Call {
    const char* name;
    std::int64_t send, recv;
    std::function<void(Communicator&, Tensor&, Tensor&)> call;
  };
  const std::vector<Call> calls = {
      {"all_reduce", 6, 0, [](Communicator& c, Tensor& s, Tensor&) { c.all_reduce(s); }},
      {"reduce_scatter", 6, 3,
       [](Communicator& c, Tensor& s, Tensor& r) { c.reduce_scatter(s, r); }},
      {"all_gather", 3, 6, [](Communicator& c, Tensor& s, Tensor& r) { c.all_gather(s, r); }},
      {"all_to_all", 6, 6, [](Communicator& c, Tensor& s, Tensor& r) { c.all_to_all(s, r); }},
      {"gather", 3, 6, [](Communicator& c, Tensor& s, Tensor& r) { c.gather(s, r, 0); }},
      {"scatter", 6, 3, [](Communicator& c, Tensor& s, Tensor& r) { c.scatter(s, r, 1); }},
      {"broadcast", 6, 0, [](Communicator& c, Tensor& s, Tensor&) { c.broadcast(s, 0); }},
  };
  for (const Call& c : calls) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> send, recv;  // alive until the streams ran
    for (int r = 0; r < 2; ++r) {
      send.push_back(zeros(dt[r], c.send, comms[r].device()));
      recv.push_back(c.recv ? zeros(dt[r], c.recv, comms[r].device()) : Tensor());
      c.call(comms[r], send[r], recv[r]);
    }
    expect_every_rank<InvalidArgument>(
        comms,
        detail::cat(c.name, ": rank 1 called with dtype f16, rank 0 with dtype bf16", kWhere));
  }
}

TEST_F(CollMatrixErrors, RanksWithDifferentCountsFailEveryRank) {
  auto comms = Communicator::init_all(devices("sim", 2));
  // all_to_all: count = numel / size (4 vs 3 per block).
  Tensor s0 = zeros(DType::i8, 8, comms[0].device()), r0 = zeros(DType::i8, 8, comms[0].device());
  Tensor s1 = zeros(DType::i8, 6, comms[1].device()), r1 = zeros(DType::i8, 6, comms[1].device());
  comms[0].all_to_all(s0, r0);
  comms[1].all_to_all(s1, r1);
  expect_every_rank<InvalidArgument>(comms,
                                     "all_to_all: rank 1 called with count 3, rank 0 with count 4");
  // gather: count = send numel.
  Tensor g0 = zeros(DType::u64, 5, comms[0].device()),
         h0 = zeros(DType::u64, 10, comms[0].device());
  Tensor g1 = zeros(DType::u64, 4, comms[1].device());
  comms[0].gather(g0, h0, 0);
  Tensor none;  // recv is ignored off the root
  comms[1].gather(g1, none, 0);
  expect_every_rank<InvalidArgument>(comms,
                                     "gather: rank 1 called with count 4, rank 0 with count 5");
  // Still usable afterwards.
  std::vector<Tensor> x = {zeros(DType::i32, 3, comms[0].device()),
                           zeros(DType::i32, 3, comms[1].device())};
  all_reduce(comms, x);
  synchronize(comms);
}

TEST_F(CollMatrixErrors, AllToAllVCountsThatDoNotAddUpAcrossRanks) {
  auto comms = Communicator::init_all(devices("sim", 3));
  // Rank 0 sends 2 elements to rank 1, which expects 3 from rank 0; everything else agrees.
  const std::vector<std::vector<std::int64_t>> sc = {{1, 2, 1}, {1, 1, 1}, {0, 2, 2}};
  std::vector<std::vector<std::int64_t>> rc(3, std::vector<std::int64_t>(3));
  for (int r = 0; r < 3; ++r)
    for (int q = 0; q < 3; ++q) rc[r][q] = sc[q][r];
  rc[1][0] = 3;
  std::vector<Tensor> send, recv;
  for (int r = 0; r < 3; ++r) {
    std::int64_t ns = 0, nr = 0;
    for (int q = 0; q < 3; ++q) ns += sc[r][q], nr += rc[r][q];
    send.push_back(zeros(DType::bf16, ns, comms[r].device()));
    recv.push_back(zeros(DType::bf16, nr, comms[r].device()));
  }
  for (int r = 0; r < 3; ++r) comms[r].all_to_all_v(send[r], sc[r], recv[r], rc[r]);
  expect_every_rank<InvalidArgument>(
      comms,
      "all_to_all_v: rank 0 sends 2 elements to rank 1 (send_counts[1]), but rank 1 expects 3 "
      "from rank 0 (recv_counts[0]) (collective #");
}

TEST_F(CollMatrixErrors, AllToAllVCountsThatDoNotFitOneRanksTensors) {
  auto comms = Communicator::init_all(devices("sim", 2));
  const Device d = comms[0].device();  // a copy: comms is replaced below
  Tensor s = zeros(DType::f32, 4, d), r = zeros(DType::f32, 4, d);
  const std::string fn = "Communicator::all_to_all_v";
  // Packed: the counts must add up to the tensors' sizes.
  expect_invalid([&] { comms[0].all_to_all_v(s, {1, 2}, r, {2, 2}); }, fn);
  expect_invalid([&] { comms[0].all_to_all_v(s, {2, 2}, r, {3, 2}); }, fn);
  // One entry per rank, none negative.
  expect_invalid([&] { comms[0].all_to_all_v(s, {4}, r, {2, 2}); }, fn);
  expect_invalid([&] { comms[0].all_to_all_v(s, {5, -1}, r, {2, 2}); }, fn);
  // Explicit displacements: blocks inside the tensors, recv blocks not overlapping.
  expect_invalid([&] { comms[0].all_to_all_v(s, {2, 2}, {0, 3}, r, {2, 2}, {0, 2}); }, fn);
  expect_invalid([&] { comms[0].all_to_all_v(s, {2, 2}, {0, 2}, r, {2, 2}, {0, 1}); }, fn);
  expect_invalid([&] { comms[0].all_to_all_v(s, {2, 2}, {0, -1}, r, {2, 2}, {0, 2}); }, fn);
  // Nothing was enqueued, but each per-rank refusal aborted the communicator (Note [Per-rank
  // refusals abort]): a good call works on new handles.
  comms = Communicator::init_all(devices("sim", 2));
  std::vector<Tensor> a = {zeros(DType::f32, 2, d), zeros(DType::f32, 2, comms[1].device())};
  std::vector<Tensor> b = {zeros(DType::f32, 2, d), zeros(DType::f32, 2, comms[1].device())};
  all_to_all_v(comms, a, {{1, 1}, {1, 1}}, b, {{1, 1}, {1, 1}});
  synchronize(comms);
}

/// Rank `rank` of n posts one send to (or recv from) `peer` that nobody matches: its stream fails
/// with a Timeout containing `part` (timeout 200 ms).
void expect_unmatched_p2p_times_out(int n, bool is_send, int rank, int peer, DType t,
                                    const std::string& part) {
  CommOptions o;
  o.timeout_ms = 200;
  auto comms = Communicator::init_all(devices("sim", n), o);
  Tensor x = zeros(t, 7, comms[rank].device());
  if (is_send)
    comms[rank].send(x, peer);
  else
    comms[rank].recv(x, peer);
  expect_error<Timeout>([&] { comms[rank].stream().synchronize(); }, part);
}

TEST_F(CollMatrixErrors, RecvWithNoSendTimesOutNamingBothRanks) {
  expect_unmatched_p2p_times_out(2, false, 1, 0, DType::f16,
                                 "recv (point-to-point #1 from rank 0 to rank 1): rank 0 did not "
                                 "post the matching send to rank 1 within 200 ms");
}

TEST_F(CollMatrixErrors, SendWithNoRecvTimesOutNamingBothRanks) {
  expect_unmatched_p2p_times_out(3, true, 2, 0, DType::u8,
                                 "send (point-to-point #1 from rank 2 to rank 0): rank 0 did not "
                                 "post the matching recv from rank 2 within 200 ms");
}

TEST_F(CollMatrixErrors, SendRecvCountOrDtypeMismatchFailsBothSides) {
  auto comms = Communicator::init_all(devices("sim", 2));
  {
    Tensor a = zeros(DType::f32, 5, comms[0].device()), b = zeros(DType::f32, 4, comms[1].device());
    comms[0].send(a, 1);
    comms[1].recv(b, 0);
    expect_every_rank<InvalidArgument>(
        comms,
        "send/recv: rank 0 sends 5 elements of f32 to rank 1, but rank 1 receives 4 elements of "
        "f32 from rank 0 (point-to-point #1 from rank 0 to rank 1; a send and its recv must have "
        "the same count and dtype)");
  }
  auto fresh = Communicator::init_all(devices("sim", 2));
  Tensor a = zeros(DType::f32, 4, fresh[1].device()), b = zeros(DType::bf16, 4, fresh[0].device());
  fresh[1].send(a, 0);
  fresh[0].recv(b, 1);
  expect_every_rank<InvalidArgument>(
      fresh, "send/recv: rank 1 sends 4 elements of f32 to rank 0, but rank 0 receives 4 "
             "elements of bf16 from rank 1");
}

TEST_F(CollMatrixErrors, PeerOutOfRange) {
  auto comms = Communicator::init_all(devices("sim", 2));
  Tensor x = zeros(DType::i64, 3, comms[0].device());
  expect_invalid([&] { comms[0].send(x, 2); },
                 "Communicator::send: peer: expected a rank in [0, 2), got 2");
  expect_invalid([&] { comms[0].recv(x, -1); },
                 "Communicator::recv: peer: expected a rank in [0, 2), got -1");
}

TEST_F(CollMatrixErrors, RootOutOfRange) {
  auto comms = Communicator::init_all(devices("sim", 2));
  const Device& d = comms[0].device();
  Tensor s = zeros(DType::f64, 3, d), g = zeros(DType::f64, 6, d);
  expect_invalid([&] { comms[0].gather(s, g, 2); },
                 "Communicator::gather: root: expected a rank in [0, 2), got 2");
  expect_invalid([&] { comms[0].scatter(g, s, -1); },
                 "Communicator::scatter: root: expected a rank in [0, 2), got -1");
  std::vector<Tensor> sv = {s, zeros(DType::f64, 3, comms[1].device())};
  std::vector<Tensor> gv = {g, Tensor()};
  expect_invalid([&] { gather(comms, sv, gv, 5); }, "root: expected a rank in [0, 2), got 5");
}

TEST_F(CollMatrixErrors, BarePremulSumIsRefused) {
  auto comms = Communicator::init_all(devices("sim", 2));
  const Device& d = comms[0].device();
  Tensor x = zeros(DType::bf16, 4, d), y = zeros(DType::bf16, 2, d);
  const std::string m = "op: premul_sum needs its scalar: pass PreMulSum{scalar}";
  expect_invalid([&] { comms[0].all_reduce(x, ReduceOp::premul_sum); }, m);
  expect_invalid([&] { comms[0].reduce(x, x, ReduceOp::premul_sum, 0); }, m);
  expect_invalid([&] { comms[0].reduce_scatter(x, y, ReduceOp::premul_sum); }, m);
  std::vector<Tensor> v = {x, zeros(DType::bf16, 4, comms[1].device())};
  expect_invalid([&] { all_reduce(comms, v, ReduceOp::premul_sum); }, m);
}

TEST_F(CollMatrixErrors, IntegerPremulSumScalarMustBeIntegralAndRepresentable) {
  auto comms = Communicator::init_all(devices("sim", 2));
  const Device d = comms[0].device();  // a copy: comms is replaced below
  Tensor i = zeros(DType::i32, 4, d), u = zeros(DType::u8, 4, d), s = zeros(DType::i8, 4, d);
  expect_invalid([&] { comms[0].all_reduce(i, i, PreMulSum{0.5}); }, "scalar");
  expect_invalid([&] { comms[0].all_reduce(u, u, PreMulSum{-1.0}); }, "scalar");
  expect_invalid([&] { comms[0].all_reduce(s, s, PreMulSum{300.0}); }, "scalar");
  expect_invalid([&] { comms[0].reduce(i, i, PreMulSum{1.25}, 0); }, "scalar");
  // Floats take any scalar; integral ones are fine on integers (nothing enqueued above; new
  // handles, as each per-rank refusal aborted the communicator).
  comms = Communicator::init_all(devices("sim", 2));
  std::vector<Tensor> a = {zeros(DType::i8, 4, d), zeros(DType::i8, 4, comms[1].device())};
  all_reduce(comms, a, a, std::vector<PreMulSum>{{-3.0}, {127.0}});
  synchronize(comms);
}

TEST_F(CollMatrixErrors, WrongSizesAndInPlaceAllToAll) {
  auto comms = Communicator::init_all(devices("sim", 2));
  const Device& d = comms[0].device();
  Tensor x = zeros(DType::f16, 6, d), five = zeros(DType::f16, 5, d),
         other = zeros(DType::bf16, 6, d);
  expect_invalid([&] { comms[0].all_to_all(x, x); }, "Communicator::all_to_all");        // in place
  expect_invalid([&] { comms[0].all_to_all(five, five); }, "Communicator::all_to_all");  // 5 % 2
  expect_invalid([&] { comms[0].all_to_all(x, other); },
                 "Communicator::all_to_all: recv: expected dtype f16 (like send)");
  expect_invalid([&] { comms[0].gather(x, five, 0); }, "Communicator::gather: recv");
  expect_invalid([&] { comms[0].scatter(five, x, 0); }, "Communicator::scatter: send");
  Tensor other_device = zeros(DType::f16, 6, comms[1].device());
  expect_invalid([&] { comms[0].send(other_device, 1); }, "Communicator::send");
}

TEST_F(CollMatrixErrors, AvgIsAcceptedOnEveryDtype) {
  // NCCL refuses avg on no dtype (integers: the truncated mean): no call throws.
  auto comms = Communicator::init_all(devices("sim", 2));
  for (DType t : kAllDTypes) {
    std::vector<Tensor> v = {zeros(t, 3, comms[0].device()), zeros(t, 3, comms[1].device())};
    EXPECT_NO_THROW({
      all_reduce(comms, v, ReduceOp::avg);
      synchronize(comms);
    }) << dtype_name(t);
  }
}

}  // namespace
}  // namespace ditto
