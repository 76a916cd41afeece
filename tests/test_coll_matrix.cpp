// The collective test matrix: every collective (all_reduce, reduce, broadcast, all_gather,
// reduce_scatter, all_to_all, all_to_all_v, gather, scatter, a send/recv ring) x every dtype x
// every op that applies (sum, prod, min, max, avg, premul_sum) x ranks 1..8 x {bitwise, fast} x
// {single controller, SPMD one thread per rank}, on the simulator and on cuda (skipped with the
// reason where there is no GPU), against the independent host reference of
// tests/test_coll_matrix_ref.h. bitwise: the reference's bits; fast: the reference's bits for
// integers, min / max and copies, within ref::fast_tolerance for floating sums, products, avg and
// premul_sum. Each test prints how many cases it ran ("[matrix] sim all_reduce: 2304 cases").
// Variants (in place or not, the root, undefined tensors off the root, explicit all_to_all_v
// displacements with gaps, two messages per ring pair) rotate with the case number.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/comm/communicator.h"
#include "core/runtime/backend.h"
#include "test_coll_matrix_ref.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;
using ref::Op;
using Bits = std::vector<std::uint64_t>;

// ---- element bits -------------------------------------------------------

using ref::make;
using ref::read;

Bits sentinel(DType t, std::int64_t n) {
  return Bits(static_cast<std::size_t>(n), 0xa5a5a5a5a5a5a5a5ull & ref::mask(t));
}
/// Raw random bits (copies must move every pattern, NaNs included).
Bits raw(DType t, int r, std::int64_t n, std::uint64_t salt) {
  Bits v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] =
        ref::hash(salt, static_cast<std::uint64_t>(r), i, 5) & ref::mask(t);
  return v;
}

// ---- one case -----------------------------------------------------------------------------------

enum class Coll {
  all_reduce,
  reduce,
  broadcast,
  all_gather,
  reduce_scatter,
  all_to_all,
  all_to_all_v,
  gather,
  scatter,
  send_recv
};
const char* coll_name(Coll c) {
  static const char* names[] = {"all_reduce",     "reduce",     "broadcast",    "all_gather",
                                "reduce_scatter", "all_to_all", "all_to_all_v", "gather",
                                "scatter",        "send_recv"};
  return names[static_cast<int>(c)];
}
bool reduces(Coll c) {
  return c == Coll::all_reduce || c == Coll::reduce || c == Coll::reduce_scatter;
}
enum class Form { single, spmd };

ReduceOp to_reduce_op(Op op) { return static_cast<ReduceOp>(static_cast<int>(op)); }

/// A tensor to read back after the case and what it must hold: want's bits, or (tol[i] > 0) a
/// floating value within tol[i] of want[i]'s (NaN for NaN).
struct Check {
  std::string what;
  Tensor tensor;
  Bits want;
  std::vector<double> tol;
};

struct Plan {
  std::vector<Tensor> send, recv;
  std::vector<Check> checks;
  std::function<void()> single;   ///< all ranks from this thread
  std::function<void(int)> rank;  ///< rank r's call (SPMD, from rank r's thread)
};

struct Case {
  Coll coll;
  DType dt;
  Op op;
  int n;
  Determinism mode;
  Form form;
  int k;            ///< case number
  std::uint64_t v;  ///< its variant bits (in place, root, ...): a hash of k / 2, so both forms
                    ///< run each variant
  std::string str() const {
    return detail::cat(coll_name(coll), " ", dtype_name(dt), " ",
                       reduces(coll) ? ref::op_name(op) : "copy", " ranks=", n, " ",
                       determinism_name(mode), " ", form == Form::single ? "single" : "spmd", " #",
                       k);
  }
};

/// First difference of a check, or empty.
std::string compare(DType t, const Check& c) {
  const Bits got = read(c.tensor);
  if (got.size() != c.want.size())
    return detail::cat(c.what, ": ", got.size(), " elements, expected ", c.want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    bool ok = got[i] == c.want[i];
    if (!ok && !c.tol.empty() && c.tol[i] > 0) {
      const double g = ref::value(t, got[i]), w = ref::value(t, c.want[i]);
      ok = std::isnan(w) ? std::isnan(g) : std::isfinite(w) && std::fabs(g - w) <= c.tol[i];
    }
    if (!ok && bad++ == 0) first = i;
  }
  if (bad == 0) return {};
  return detail::cat(
      c.what, ": ", bad, " of ", got.size(), " elements differ; first [", first, "] expected ",
      ref::show(t, c.want[first]), " got ", ref::show(t, got[first]),
      c.tol.empty() || c.tol[first] == 0 ? "" : detail::cat(" (tolerance ", c.tol[first], ")"));
}

std::int64_t block_count(int n) { return n % 2 ? 37 : 64; }

/// Reduction inputs and their reference over ranks, element i of rank r = input(r, offset + i).
struct Reduced {
  std::vector<Bits> in;  ///< per rank, `total` elements
  Bits out;              ///< the reference over ranks
  std::vector<double> tol;
};
Reduced reduced(const Case& c, std::int64_t total) {
  Reduced R;
  std::vector<double> scalars(c.n);
  for (int r = 0; r < c.n; ++r) {
    scalars[r] = ref::scalar(c.dt, r);
    Bits b(static_cast<std::size_t>(total));
    for (std::int64_t i = 0; i < total; ++i) b[i] = ref::input(c.dt, c.op, r, i);
    R.in.push_back(std::move(b));
  }
  const bool tolerant =
      c.mode == Determinism::fast && ref::info(c.dt).floating && c.op != Op::min && c.op != Op::max;
  Bits leaf(c.n);
  for (std::int64_t i = 0; i < total; ++i) {
    for (int r = 0; r < c.n; ++r) leaf[r] = R.in[r][i];
    R.out.push_back(ref::reduce(c.dt, c.op, leaf, scalars));
    R.tol.push_back(
        tolerant ? ref::fast_tolerance(c.dt, c.op, leaf, scalars, ref::value(c.dt, R.out.back()))
                 : 0.0);
  }
  return R;
}

Bits slice(const Bits& v, std::int64_t at, std::int64_t len) {
  return Bits(v.begin() + at, v.begin() + at + len);
}
template <typename V>
V slice_v(const V& v, std::int64_t at, std::int64_t len) {
  return V(v.begin() + at, v.begin() + at + len);
}

/// A grouped loop over the ranks' calls (the single-controller form of a call without a vector
/// overload).
std::function<void()> grouped(int n, std::function<void(int)> per_rank) {
  return [n, per_rank] {
    group_start();
    try {
      for (int r = 0; r < n; ++r) per_rank(r);
    } catch (...) {
      try {
        group_end();
      } catch (...) {
      }
      throw;
    }
    group_end();
  };
}

/// raw(t, r, cnt, salt) of ranks 0..n-1, one after the other (what gathering them gives).
Bits raw_of_every_rank(DType t, int n, std::int64_t cnt, std::uint64_t salt) {
  Bits all;
  for (int r = 0; r < n; ++r) {
    const Bits in = raw(t, r, cnt, salt);
    all.insert(all.end(), in.begin(), in.end());
  }
  return all;
}

/// Rank r's buffers out of place on d: a send holding `in` and a recv of recv_len sentinels,
/// checked to end as `in` (send untouched) and `want`.
void add_out_of_place(Plan& p, DType dt, int r, const Device& d, const Bits& in,
                      std::int64_t recv_len, const Bits& want) {
  p.send.push_back(make(dt, in, d));
  p.recv.push_back(make(dt, sentinel(dt, recv_len), d));
  p.checks.push_back({detail::cat("rank ", r, " send"), p.send.back(), in, {}});
  p.checks.push_back({detail::cat("rank ", r, " recv"), p.recv.back(), want, {}});
}

// ---- the plans of each collective (p lives for the case: the calls capture it) -----------------

void plan_reduction(const Case& c, std::vector<Communicator>& comms, Plan& p) {
  const int n = c.n;
  const std::int64_t cnt = block_count(n);
  const bool in_place = c.v & 1, premul = c.op == Op::premul_sum;
  const int root = static_cast<int>((c.v >> 8) % static_cast<std::uint64_t>(n));
  const bool undefined_off_root = (c.v >> 1) & 1;
  const ReduceOp op = to_reduce_op(c.op);
  const std::int64_t total = c.coll == Coll::reduce_scatter ? n * cnt : cnt;
  const Reduced R = reduced(c, total);
  std::vector<PreMulSum> ops;
  for (int r = 0; r < n; ++r) ops.push_back(PreMulSum{ref::scalar(c.dt, r)});
  for (int r = 0; r < n; ++r) {
    const Device& d = comms[r].device();
    p.send.push_back(make(c.dt, R.in[r], d));
    if (c.coll == Coll::reduce_scatter) {
      p.recv.push_back(in_place ? p.send[r].narrow(r * cnt, cnt)
                                : make(c.dt, sentinel(c.dt, cnt), d));
      // send keeps its other blocks; in place, its block r is the result.
      Check s{detail::cat("rank ", r, " send"), p.send[r], R.in[r],
              std::vector<double>(total, 0.0)};
      if (in_place)
        for (std::int64_t j = r * cnt; j < (r + 1) * cnt; ++j) {
          s.want[j] = R.out[j];
          s.tol[j] = R.tol[j];
        }
      p.checks.push_back(s);
      p.checks.push_back({detail::cat("rank ", r, " recv"), p.recv[r], slice(R.out, r * cnt, cnt),
                          slice_v(R.tol, r * cnt, cnt)});
      continue;
    }
    const bool has_result = c.coll == Coll::all_reduce || r == root;
    if (in_place) {
      p.recv.push_back(p.send[r]);
    } else {
      p.checks.push_back({detail::cat("rank ", r, " send"), p.send[r], R.in[r], {}});
      if (!has_result && undefined_off_root)
        p.recv.push_back(Tensor());
      else
        p.recv.push_back(make(c.dt, sentinel(c.dt, cnt), d));
    }
    if (has_result)
      p.checks.push_back({detail::cat("rank ", r, " recv"), p.recv[r], R.out, R.tol});
    else if (p.recv[r].defined())
      p.checks.push_back(
          {detail::cat("rank ", r, " recv off the root"), p.recv[r], read(p.recv[r]), {}});
  }
  switch (c.coll) {
    case Coll::all_reduce:
      p.rank = [&comms, &p, in_place, premul, op, ops](int r) {
        if (premul)
          comms[r].all_reduce(p.send[r], p.recv[r], ops[r]);
        else if (in_place)
          comms[r].all_reduce(p.send[r], op);
        else
          comms[r].all_reduce(p.send[r], p.recv[r], op);
      };
      p.single = [&comms, &p, in_place, premul, op, ops] {
        if (premul)
          all_reduce(comms, p.send, p.recv, ops);
        else if (in_place)
          all_reduce(comms, p.send, op);
        else
          all_reduce(comms, p.send, p.recv, op);
      };
      break;
    case Coll::reduce:
      p.rank = [&comms, &p, premul, op, ops, root](int r) {
        if (premul)
          comms[r].reduce(p.send[r], p.recv[r], ops[r], root);
        else
          comms[r].reduce(p.send[r], p.recv[r], op, root);
      };
      // No vector form of reduce with premul_sum: a grouped loop.
      if (premul)
        p.single = grouped(n, p.rank);
      else
        p.single = [&comms, &p, op, root] { reduce(comms, p.send, p.recv, op, root); };
      break;
    default:  // reduce_scatter
      p.rank = [&comms, &p, premul, op, ops](int r) {
        if (premul)
          comms[r].reduce_scatter(p.send[r], p.recv[r], ops[r]);
        else
          comms[r].reduce_scatter(p.send[r], p.recv[r], op);
      };
      p.single = [&comms, &p, premul, op, ops] {
        if (premul)
          reduce_scatter(comms, p.send, p.recv, ops);
        else
          reduce_scatter(comms, p.send, p.recv, op);
      };
  }
}

void plan_broadcast(const Case& c, std::vector<Communicator>& comms, Plan& p) {
  const int n = c.n;
  const std::int64_t cnt = block_count(n);
  const bool in_place = c.v & 1, undefined_off_root = (c.v >> 1) & 1;
  const int root = static_cast<int>((c.v >> 8) % static_cast<std::uint64_t>(n));
  const Bits want = raw(c.dt, root, cnt, c.v);
  for (int r = 0; r < n; ++r) {
    const Device& d = comms[r].device();
    const bool no_send = r != root && undefined_off_root && !in_place;
    p.send.push_back(no_send ? Tensor() : make(c.dt, raw(c.dt, r, cnt, c.v), d));
    p.recv.push_back(in_place ? p.send[r] : make(c.dt, sentinel(c.dt, cnt), d));
    if (!in_place && !no_send)
      p.checks.push_back({detail::cat("rank ", r, " send"), p.send[r], raw(c.dt, r, cnt, c.v), {}});
    p.checks.push_back({detail::cat("rank ", r, " recv"), p.recv[r], want, {}});
  }
  p.rank = [&comms, &p, in_place, root](int r) {
    if (in_place)
      comms[r].broadcast(p.send[r], root);
    else
      comms[r].broadcast(p.send[r], p.recv[r], root);
  };
  if (in_place)
    p.single = [&comms, &p, root] { broadcast(comms, p.send, root); };
  else
    p.single = grouped(n, p.rank);  // the vector form is in place only
}

void plan_all_gather(const Case& c, std::vector<Communicator>& comms, Plan& p) {
  const int n = c.n;
  const std::int64_t cnt = block_count(n);
  const bool in_place = c.v & 1;
  const Bits want = raw_of_every_rank(c.dt, n, cnt, c.v);
  for (int r = 0; r < n; ++r) {
    const Device& d = comms[r].device();
    const Bits in = raw(c.dt, r, cnt, c.v);
    if (in_place) {  // send is block r of recv
      Bits init = sentinel(c.dt, n * cnt);
      std::copy(in.begin(), in.end(), init.begin() + r * cnt);
      p.recv.push_back(make(c.dt, init, d));
      p.send.push_back(p.recv[r].narrow(r * cnt, cnt));
      p.checks.push_back({detail::cat("rank ", r, " recv"), p.recv[r], want, {}});
    } else {
      add_out_of_place(p, c.dt, r, d, in, n * cnt, want);
    }
  }
  p.rank = [&comms, &p](int r) { comms[r].all_gather(p.send[r], p.recv[r]); };
  p.single = [&comms, &p] { all_gather(comms, p.send, p.recv); };
}

void plan_all_to_all(const Case& c, std::vector<Communicator>& comms, Plan& p) {
  const int n = c.n;
  const std::int64_t cnt = block_count(n);
  for (int r = 0; r < n; ++r) {
    const Device& d = comms[r].device();
    const Bits in = raw(c.dt, r, n * cnt, c.v);
    Bits want;
    for (int q = 0; q < n; ++q) {  // block r of rank q's send
      const Bits from = raw(c.dt, q, n * cnt, c.v);
      want.insert(want.end(), from.begin() + r * cnt, from.begin() + (r + 1) * cnt);
    }
    add_out_of_place(p, c.dt, r, d, in, n * cnt, want);
  }
  p.rank = [&comms, &p](int r) { comms[r].all_to_all(p.send[r], p.recv[r]); };
  p.single = [&comms, &p] { all_to_all(comms, p.send, p.recv); };
}

/// all_to_all_v: rank r sends (r * 3 + q * 5 + v) % 5 elements to rank q (zeros included).
/// Packed or with explicit displacements (a variant bit): send blocks in reverse rank order
/// with one-element gaps, recv blocks in rank order with two-element gaps that stay untouched.
void plan_all_to_all_v(const Case& c, std::vector<Communicator>& comms, Plan& p) {
  const int n = c.n;
  const bool packed = (c.v & 1) == 0;
  auto count = [&](int from, int to) -> std::int64_t {
    return static_cast<std::int64_t>((from * 3 + to * 5 + (c.v >> 4)) % 5);
  };
  struct Layout {
    std::vector<std::int64_t> sc, sd, rc, rd;
    std::int64_t send_len = 0, recv_len = 0;
  };
  auto layout = [&](int r) {
    Layout L;
    for (int q = 0; q < n; ++q) {
      L.sc.push_back(count(r, q));
      L.rc.push_back(count(q, r));
    }
    L.sd.assign(n, 0);
    L.rd.assign(n, 0);
    for (int j = n - 1; j >= 0; --j) {  // send blocks: reverse order (packed: forward)
      const int q = packed ? n - 1 - j : j;
      L.sd[q] = L.send_len;
      L.send_len += L.sc[q] + (packed ? 0 : 1);
    }
    for (int q = 0; q < n; ++q) {
      L.rd[q] = L.recv_len + (packed ? 0 : 2);
      L.recv_len = L.rd[q] + L.rc[q];
    }
    return L;
  };
  auto ls = std::make_shared<std::vector<Layout>>();
  for (int r = 0; r < n; ++r) ls->push_back(layout(r));
  for (int r = 0; r < n; ++r) {
    const Device& d = comms[r].device();
    const Layout& L = (*ls)[r];
    const Bits in = raw(c.dt, r, L.send_len, c.v);
    Bits want = sentinel(c.dt, L.recv_len);
    for (int q = 0; q < n; ++q) {  // from rank q: its block for r
      const Layout& Q = (*ls)[q];
      const Bits from = raw(c.dt, q, Q.send_len, c.v);
      std::copy(from.begin() + Q.sd[r], from.begin() + Q.sd[r] + Q.sc[r], want.begin() + L.rd[q]);
    }
    add_out_of_place(p, c.dt, r, d, in, L.recv_len, want);
  }
  p.rank = [&comms, &p, ls, packed](int r) {
    const Layout& L = (*ls)[r];
    if (packed)
      comms[r].all_to_all_v(p.send[r], L.sc, p.recv[r], L.rc);
    else
      comms[r].all_to_all_v(p.send[r], L.sc, L.sd, p.recv[r], L.rc, L.rd);
  };
  if (packed) {
    p.single = [&comms, &p, ls, n] {
      std::vector<std::vector<std::int64_t>> sc, rc;
      for (int r = 0; r < n; ++r) {
        sc.push_back((*ls)[r].sc);
        rc.push_back((*ls)[r].rc);
      }
      all_to_all_v(comms, p.send, sc, p.recv, rc);
    };
  } else {
    p.single = grouped(n, p.rank);  // the vector form is packed only
  }
}

void plan_gather_scatter(const Case& c, std::vector<Communicator>& comms, Plan& p) {
  const int n = c.n;
  const std::int64_t cnt = block_count(n);
  const int root = static_cast<int>((c.v >> 8) % static_cast<std::uint64_t>(n));
  const bool undefined_off_root = c.v & 1, gather = c.coll == Coll::gather;
  const Bits root_data = raw(c.dt, root, n * cnt, c.v);
  const Bits gathered = raw_of_every_rank(c.dt, n, cnt, c.v);
  for (int r = 0; r < n; ++r) {
    const Device& d = comms[r].device();
    const bool off = r != root;
    if (gather) {
      p.send.push_back(make(c.dt, raw(c.dt, r, cnt, c.v), d));
      p.checks.push_back({detail::cat("rank ", r, " send"), p.send[r], raw(c.dt, r, cnt, c.v), {}});
      p.recv.push_back(off && undefined_off_root ? Tensor()
                                                 : make(c.dt, sentinel(c.dt, n * cnt), d));
      if (p.recv[r].defined())
        p.checks.push_back({detail::cat("rank ", r, off ? " recv off the root" : " recv"),
                            p.recv[r],
                            off ? sentinel(c.dt, n * cnt) : gathered,
                            {}});
    } else {
      const Bits mine = off ? raw(c.dt, r, n * cnt, c.v + 1) : root_data;
      p.send.push_back(off && undefined_off_root ? Tensor() : make(c.dt, mine, d));
      if (p.send[r].defined())
        p.checks.push_back({detail::cat("rank ", r, " send"), p.send[r], mine, {}});
      p.recv.push_back(make(c.dt, sentinel(c.dt, cnt), d));
      p.checks.push_back(
          {detail::cat("rank ", r, " recv"), p.recv[r], slice(root_data, r * cnt, cnt), {}});
    }
  }
  if (gather) {
    p.rank = [&comms, &p, root](int r) { comms[r].gather(p.send[r], p.recv[r], root); };
    p.single = [&comms, &p, root] { ditto::gather(comms, p.send, p.recv, root); };
  } else {
    p.rank = [&comms, &p, root](int r) { comms[r].scatter(p.send[r], p.recv[r], root); };
    p.single = [&comms, &p, root] { ditto::scatter(comms, p.send, p.recv, root); };
  }
}

/// The ring: rank r sends to r + 1 and receives from r - 1 (one rank: itself), in one group per
/// rank; a variant bit adds a second, shorter message per pair (the k-th send pairs with the k-th
/// recv) and posts the recvs before the sends.
void plan_send_recv(const Case& c, std::vector<Communicator>& comms, Plan& p) {
  const int n = c.n;
  const std::int64_t cnt = block_count(n), cnt2 = cnt / 2 + 1;
  const bool two = c.v & 1;
  const int m = two ? 2 : 1;  // messages per pair: send[r * m + j], recv[r * m + j]
  for (int r = 0; r < n; ++r) {
    const Device& d = comms[r].device();
    const int from = (r + n - 1) % n;
    for (int j = 0; j < m; ++j) {
      const std::int64_t len = j == 0 ? cnt : cnt2;
      add_out_of_place(p, c.dt, r, d, raw(c.dt, r, len, c.v + j), len,
                       raw(c.dt, from, len, c.v + j));
    }
  }
  auto calls = [&comms, &p, n, m, two](int r) {
    auto sends = [&] {
      for (int j = 0; j < m; ++j) comms[r].send(p.send[r * m + j], (r + 1) % n);
    };
    auto recvs = [&] {
      for (int j = 0; j < m; ++j) comms[r].recv(p.recv[r * m + j], (r + n - 1) % n);
    };
    if (two) {
      recvs();
      sends();
    } else {
      sends();
      recvs();
    }
  };
  p.rank = [calls](int r) { grouped(1, [&](int) { calls(r); })(); };
  p.single = grouped(n, calls);
}

void plan(const Case& c, std::vector<Communicator>& comms, Plan& p) {
  switch (c.coll) {
    case Coll::all_reduce:
    case Coll::reduce:
    case Coll::reduce_scatter: return plan_reduction(c, comms, p);
    case Coll::broadcast: return plan_broadcast(c, comms, p);
    case Coll::all_gather: return plan_all_gather(c, comms, p);
    case Coll::all_to_all: return plan_all_to_all(c, comms, p);
    case Coll::all_to_all_v: return plan_all_to_all_v(c, comms, p);
    case Coll::gather:
    case Coll::scatter: return plan_gather_scatter(c, comms, p);
    case Coll::send_recv: return plan_send_recv(c, comms, p);
  }
}

// ---- running the matrix -------------------------------------------------------------------------

/// Runs a case; empty on success, else what went wrong. `broken` is set when the communicator may
/// be unusable afterwards (an error was thrown).
std::string run_case(const Case& c, std::vector<Communicator>& comms, bool& broken) {
  Plan p;
  try {
    plan(c, comms, p);
    if (c.form == Form::single) {
      p.single();
    } else {
      run_threads(c.n, p.rank);
    }
    synchronize(comms);
  } catch (const std::exception& e) {
    broken = true;
    return detail::cat("threw: ", e.what());
  }
  std::string out;
  for (std::size_t i = 0; i < p.checks.size(); ++i) {
    const std::string d = compare(c.dt, p.checks[i]);
    if (!d.empty()) {
      out += detail::cat(out.empty() ? "" : "; ", d);
      if (out.size() > 600) break;
    }
  }
  return out;
}

std::vector<Op> ops_of(Coll c) {
  if (reduces(c)) return {std::begin(ref::kAllOps), std::end(ref::kAllOps)};
  return {Op::sum};  // copies: one "op"
}

/// Cases of one collective: dtypes x ops x ranks 1..8 x modes x forms.
int case_count(Coll c) { return kNumDTypes * static_cast<int>(ops_of(c).size()) * 8 * 2 * 2; }

using Param = std::tuple<std::string, Coll>;

class CollMatrix : public ::testing::TestWithParam<Param> {
 protected:
  static void SetUpTestSuite() { init_sim(8); }
  void SetUp() override {
    backend_ = std::get<0>(GetParam());
    if (backend_ != "sim") {
      const std::string why = backend_unavailable(backend_, 8);
      if (!why.empty()) GTEST_SKIP() << why;
    }
  }
  std::string backend_;
};

TEST_P(CollMatrix, AgainstHostReference) {
  const Coll coll = std::get<1>(GetParam());
  int cases = 0, failed = 0, reported = 0;
  std::map<std::string, int> failing;  // "dtype op" -> failed cases
  for (int n = 1; n <= 8; ++n) {
    for (Determinism mode : {Determinism::bitwise, Determinism::fast}) {
      CommOptions o;
      o.determinism = mode;
      o.timeout_ms = 5000;
      auto comms = Communicator::init_all(devices(backend_, n), o);
      for (DType dt : kAllDTypes) {
        for (Op op : ops_of(coll)) {
          for (Form form : {Form::single, Form::spmd}) {
            const Case c{coll, dt, op, n, mode, form, cases, ref::mix(cases / 2)};
            ++cases;
            bool broken = false;
            const std::string err = run_case(c, comms, broken);
            if (broken) comms = Communicator::init_all(devices(backend_, n), o);
            if (err.empty()) continue;
            ++failed;
            ++failing[detail::cat(dtype_name(dt), " ", reduces(coll) ? ref::op_name(op) : "copy")];
            if (reported++ < 12) ADD_FAILURE() << c.str() << ": " << err;
          }
        }
      }
    }
  }
  std::printf("[matrix] %s %s: %d cases (%d dtypes x %zu ops x ranks 1..8 x 2 modes x 2 forms), "
              "%d failed\n",
              backend_.c_str(), coll_name(coll), cases, kNumDTypes, ops_of(coll).size(), failed);
  if (failed > 0) {
    std::string summary;
    for (const auto& [key, count] : failing) summary += detail::cat(" [", key, ": ", count, "]");
    ADD_FAILURE() << failed << " of " << cases << " cases failed (first 12 shown above); by dtype "
                  << "and op:" << summary;
  }
  EXPECT_EQ(cases, case_count(coll));
}

const Coll kColls[] = {Coll::all_reduce,     Coll::reduce,     Coll::broadcast,    Coll::all_gather,
                       Coll::reduce_scatter, Coll::all_to_all, Coll::all_to_all_v, Coll::gather,
                       Coll::scatter,        Coll::send_recv};

INSTANTIATE_TEST_SUITE_P(Backends, CollMatrix,
                         ::testing::Combine(::testing::Values(std::string("sim"),
                                                              std::string("cuda")),
                                            ::testing::ValuesIn(kColls)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::get<0>(info.param) + "_" +
                                  coll_name(std::get<1>(info.param));
                         });

// The reference's f16 codec (test_coll_matrix_ref.h, double arithmetic) against the compiler's
// _Float16 where it has one: every f16 decoded, and every 61st f32 bit pattern (70 million: both
// signs, subnormals, the overflow edge, inf and NaN payloads) rounded, bit for bit.
TEST(CollMatrixReference, F16CodecEqualsTheCompilersFloat16) {
#if defined(__FLT16_MAX__)
  int bad = 0;
  for (std::uint32_t u = 0; u <= 0xffffu; ++u) {
    const auto h = std::bit_cast<_Float16>(static_cast<std::uint16_t>(u));
    const float want = static_cast<float>(h), got = ref::f16_value(u);
    if (std::bit_cast<std::uint32_t>(want) != std::bit_cast<std::uint32_t>(got) && ++bad <= 5)
      ADD_FAILURE() << "f16_value(0x" << std::hex << u << ") = 0x"
                    << std::bit_cast<std::uint32_t>(got) << ", _Float16 gives 0x"
                    << std::bit_cast<std::uint32_t>(want) << std::dec;
  }
  for (std::uint64_t x = 0; x <= 0xffffffffull; x += 61) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(x));
    const auto want = std::bit_cast<std::uint16_t>(static_cast<_Float16>(f));
    const std::uint64_t got = ref::f16_round(f);
    if (got != want && ++bad <= 10)
      ADD_FAILURE() << "f16_round(" << f << " = 0x" << std::hex << x << ") = 0x" << got
                    << ", _Float16 gives 0x" << want << std::dec;
  }
  EXPECT_EQ(bad, 0);
#else
  GTEST_SKIP() << "this compiler has no _Float16 for this target (Clang 14 on x86 without "
                  "AVX512-FP16): nothing to compare the reference's f16 codec with";
#endif
}

// The size of the whole matrix (per backend), for the README and the report.
TEST(CollMatrixSize, PrintsTheNumberOfCases) {
  int total = 0;
  for (Coll c : kColls) total += case_count(c);
  std::printf("[matrix] %d cases per backend (%d collectives)\n", total,
              static_cast<int>(std::size(kColls)));
  EXPECT_EQ(total, 3 * kNumDTypes * 6 * 32 + 7 * kNumDTypes * 32);
}

}  // namespace
}  // namespace ditto
