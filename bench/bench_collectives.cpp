// ditto-bench collectives: the nccl-tests-style sweep (bench/bench_collectives.h).
#include "bench/bench_collectives.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/base/error.h"
#include "core/comm/communicator.h"
#include "core/runtime/backend.h"

namespace ditto::bench {
namespace {

enum class Op {
  all_reduce,
  all_gather,
  reduce_scatter,
  broadcast,
  reduce,
  all_to_all,
  sendrecv,
  gather,
  scatter
};
constexpr Op kOps[] = {Op::all_reduce, Op::all_gather, Op::reduce_scatter,
                       Op::broadcast,  Op::reduce,     Op::all_to_all,
                       Op::sendrecv,   Op::gather,     Op::scatter};

const char* op_name(Op op) {
  switch (op) {
    case Op::all_reduce: return "all_reduce";
    case Op::all_gather: return "all_gather";
    case Op::reduce_scatter: return "reduce_scatter";
    case Op::broadcast: return "broadcast";
    case Op::reduce: return "reduce";
    case Op::all_to_all: return "all_to_all";
    case Op::sendrecv: return "sendrecv";
    case Op::gather: return "gather";
    case Op::scatter: return "scatter";
  }
  return "?";
}
/// nccl-tests' binary names (all_reduce_perf, alltoall_perf, ...), accepted by --ops too.
const char* nccl_tests_name(Op op) {
  switch (op) {
    case Op::all_to_all: return "alltoall";
    default: return op_name(op);
  }
}
Op parse_op(const std::string& s) {
  for (Op op : kOps)
    if (s == op_name(op) || s == nccl_tests_name(op)) return op;
  throw InvalidArgument("ditto-bench: --ops: expected all_reduce, all_gather, reduce_scatter, "
                        "broadcast, reduce, all_to_all (alltoall), sendrecv, gather or scatter, "
                        "got '" +
                        s + "'");
}

/// nccl-tests' busbw factors (doc/PERFORMANCE.md).
double bus_factor(Op op, int n) {
  switch (op) {
    case Op::all_reduce: return 2.0 * (n - 1) / n;
    case Op::all_gather:
    case Op::reduce_scatter:
    case Op::all_to_all:
    case Op::gather:
    case Op::scatter: return static_cast<double>(n - 1) / n;
    case Op::broadcast:
    case Op::reduce:
    case Op::sendrecv: return 1.0;
  }
  return 1.0;
}
/// Bytes an in-memory implementation must read plus write per call (size S as nccl-tests counts
/// it): all_reduce reads N*S (every rank's buffer), writes N*S; reduce reads N*S, writes S;
/// broadcast reads S, writes N*S (out of place; (N-1)*S in place); all_gather reads S (all sends
/// together), writes N*S (every rank's receive buffer); reduce_scatter reads N*S (every send),
/// writes S (all receive blocks together); all_to_all and sendrecv read and write every rank's
/// buffer (2*N*S); gather and scatter read and write the root's buffer once (2*S).
double min_traffic(Op op, int n, double s) {
  switch (op) {
    case Op::all_reduce:
    case Op::all_to_all:
    case Op::sendrecv: return 2.0 * n * s;
    case Op::reduce:
    case Op::broadcast:
    case Op::all_gather:
    case Op::reduce_scatter: return (n + 1.0) * s;
    case Op::gather:
    case Op::scatter: return 2.0 * s;
  }
  return s;
}
/// Ops cut into size() blocks (their element count is rounded down to a multiple of the ranks).
bool blocked(Op op) {
  return op == Op::all_gather || op == Op::reduce_scatter || op == Op::all_to_all ||
         op == Op::gather || op == Op::scatter;
}
/// nccl-tests' redop and root columns: "none" and -1 where the op does not reduce or has no root.
bool reduces(Op op) { return op == Op::all_reduce || op == Op::reduce || op == Op::reduce_scatter; }
bool rooted(Op op) {
  return op == Op::broadcast || op == Op::reduce || op == Op::gather || op == Op::scatter;
}
bool has_in_place(Op op) {
  return op == Op::all_reduce || op == Op::all_gather || op == Op::reduce_scatter ||
         op == Op::broadcast || op == Op::reduce;
}

struct DTypeName {
  DType dtype;
  const char* nccl_tests;  // nccl-tests' -d name
  const char* alias;       // another name nccl-tests or torch users type ("" if none)
};
constexpr DTypeName kDTypeNames[] = {{DType::f32, "float", "float32"},
                                     {DType::f16, "half", "float16"},
                                     {DType::bf16, "bfloat16", ""},
                                     {DType::f64, "double", "float64"},
                                     {DType::i8, "int8", "char"},
                                     {DType::u8, "uint8", ""},
                                     {DType::i32, "int32", "int"},
                                     {DType::u32, "uint32", "uint"},
                                     {DType::i64, "int64", ""},
                                     {DType::u64, "uint64", ""},
                                     {DType::f8_e4m3, "f8e4m3", "fp8_e4m3"},
                                     {DType::f8_e5m2, "f8e5m2", "fp8_e5m2"}};

const char* nccl_tests_dtype(DType t) {
  for (const DTypeName& d : kDTypeNames)
    if (d.dtype == t) return d.nccl_tests;
  return dtype_name(t);
}

// The inputs: small integers (1..7), exact in every dtype (fp8 included), whose sums over any
// rank count up to 2^21 are exact in the f32 reference; the reference then rounds them to the
// dtype as the collective does (once), or wraps them for integer dtypes (count_wrong).
float init_value(int rank, std::int64_t i) { return static_cast<float>(1 + (rank + i) % 7); }

struct CollResult {
  double time_us = 0, algbw = 0, busbw = 0, memgbps = 0;
  std::int64_t wrong = 0;
  int iters = 0;
};

/// The element counts of one call at `bytes` (nccl-tests' size) on n ranks.
struct Layout {
  std::int64_t send_n = 0, recv_n = 0;
  std::int64_t block = 0;  ///< elements per rank-block (blocked ops), else the buffer
};
Layout layout(Op op, int n, std::size_t bytes, DType dtype) {
  std::int64_t total = static_cast<std::int64_t>(bytes / dtype_size(dtype));
  if (blocked(op)) total = total / n * n;
  const std::int64_t block = blocked(op) ? total / n : total;
  switch (op) {
    case Op::all_gather:
    case Op::gather: return {block, total, block};
    case Op::reduce_scatter:
    case Op::scatter: return {total, block, block};
    default: return {total, total, block};
  }
}

/// The exact value of element j of rank r's recv after one call (init_value inputs, a sum).
/// sums[k]: the sum over the n ranks of init_value(q, i) for i % 7 == k.
float expected(Op op, int n, int r, int root, std::int64_t block, std::int64_t j,
               const float (&sums)[7]) {
  auto sum_at = [&](std::int64_t i) { return sums[i % 7]; };
  switch (op) {
    case Op::all_reduce:
    case Op::reduce: return sum_at(j);
    case Op::broadcast: return init_value(root, j);
    case Op::all_gather:
    case Op::gather: return init_value(static_cast<int>(j / block), j % block);
    case Op::reduce_scatter: return sum_at(r * block + j);
    case Op::scatter: return init_value(root, r * block + j);
    case Op::all_to_all: return init_value(static_cast<int>(j / block), r * block + j % block);
    case Op::sendrecv: return init_value((r + n - 1) % n, j);
  }
  return 0;
}

/// Fills `t` (any device) with init_value(rank, i) as dtype T.
template <typename T>
void fill(Tensor& t, int rank) {
  Tensor host = Tensor::empty(t.shape(), t.dtype(), Device::cpu());
  T* p = static_cast<T*>(host.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = convert<T>(init_value(rank, i));
  t.copy_(host);
}

/// Elements of rank r's recv whose bits differ from expected(...) rounded to T, or for an integer
/// T wrapped to it, as NCCL's integer sums wrap (ditto's too: Note [Reductions over ranks]).
/// convert<T> saturates instead, so at 32 or more ranks int8 and uint8 sums, which pass 127 and
/// 255, were counted wrong though the collective was right (tester D, D2).
template <typename T>
std::int64_t count_wrong(const Tensor& recv, Op op, int n, int r, int root, std::int64_t block) {
  Tensor host = Tensor::empty(recv.shape(), recv.dtype(), Device::cpu());
  host.copy_(recv);
  const T* got = static_cast<const T*>(host.data_ptr());
  float sums[7] = {};
  for (int k = 0; k < 7; ++k)
    for (int q = 0; q < n; ++q) sums[k] += init_value(q, k);
  std::int64_t wrong = 0;
  for (std::int64_t j = 0; j < recv.numel(); ++j) {
    const float e = expected(op, n, r, root, block, j, sums);
    T want;
    if constexpr (std::is_integral_v<T>)
      want = static_cast<T>(static_cast<std::int64_t>(e));  // modulo 2^bits (C++20)
    else
      want = convert<T>(e);
    wrong += std::memcmp(&want, got + j, sizeof(T)) != 0;
  }
  return wrong;
}

/// One collective at one size: buffers, one checked call, timed calls. `bytes` as nccl-tests.
CollResult run_collective(std::vector<Communicator>& comms, const std::vector<Device>& devs, Op op,
                          DType dtype, bool in_place, std::size_t bytes, const CollConfig& cfg) {
  const int n = static_cast<int>(devs.size());
  const Layout lay = layout(op, n, bytes, dtype);
  const int root = 0;
  std::vector<Tensor> send(n), recv(n);
  for (int r = 0; r < n; ++r) {
    const Device& d = devs[static_cast<std::size_t>(r)];
    if (!in_place) {
      send[r] = Tensor::empty({lay.send_n}, dtype, d);
      recv[r] = Tensor::empty({lay.recv_n}, dtype, d);
    } else if (op == Op::all_gather) {
      recv[r] = Tensor::empty({lay.recv_n}, dtype, d);
      send[r] = recv[r].narrow(r * lay.block, lay.block);
    } else if (op == Op::reduce_scatter) {
      send[r] = Tensor::empty({lay.send_n}, dtype, d);
      recv[r] = send[r].narrow(r * lay.block, lay.block);
    } else {
      send[r] = Tensor::empty({lay.send_n}, dtype, d);
      recv[r] = send[r];
    }
  }
  auto fill_all = [&] {
    visit_dtype(dtype, [&](auto t) {
      for (int r = 0; r < n; ++r) fill<decltype(t)>(send[r], r);
    });
  };
  auto issue = [&] {
    switch (op) {
      case Op::all_reduce: all_reduce(comms, send, recv); break;
      case Op::reduce: reduce(comms, send, recv, ReduceOp::sum, root); break;
      case Op::broadcast:
        if (in_place)
          broadcast(comms, send, root);
        else {
          group_start();
          for (int r = 0; r < n; ++r)
            comms[static_cast<std::size_t>(r)].broadcast(send[r], recv[r], root);
          group_end();
        }
        break;
      case Op::all_gather: all_gather(comms, send, recv); break;
      case Op::reduce_scatter: reduce_scatter(comms, send, recv); break;
      case Op::all_to_all: all_to_all(comms, send, recv); break;
      case Op::gather: gather(comms, send, recv, root); break;
      case Op::scatter: scatter(comms, send, recv, root); break;
      case Op::sendrecv:
        // nccl-tests' sendrecv: a ring, every rank's send and recv in one group.
        group_start();
        for (int r = 0; r < n; ++r) {
          comms[static_cast<std::size_t>(r)].send(send[r], (r + 1) % n);
          comms[static_cast<std::size_t>(r)].recv(recv[r], (r + n - 1) % n);
        }
        group_end();
        break;
    }
  };
  // Checked call.
  fill_all();
  synchronize(comms);
  issue();
  synchronize(comms);
  CollResult res;
  visit_dtype(dtype, [&](auto t) {
    for (int r = 0; r < n; ++r) {
      if ((op == Op::reduce || op == Op::gather) && r != root) continue;
      res.wrong += count_wrong<decltype(t)>(recv[r], op, n, r, root, lay.block);
    }
  });
  // Timed calls: warm-up, then as many calls as fit in cfg.seconds (estimated from the warm-up),
  // enqueued back to back and synchronised once, as nccl-tests does.
  auto t0 = Clock::now();
  for (int w = 0; w < cfg.warmup; ++w) issue();
  synchronize(comms);
  const double one = std::max(1e-7, seconds_since(t0) / std::max(1, cfg.warmup));
  // In double: seconds / one can exceed INT_MAX (max_iters >= 1: check_coll_config).
  const int iters = static_cast<int>(
      std::clamp(std::floor(cfg.seconds / one), 1.0, static_cast<double>(cfg.max_iters)));
  t0 = Clock::now();
  for (int i = 0; i < iters; ++i) issue();
  synchronize(comms);
  const double t = seconds_since(t0) / iters;
  res.iters = iters;
  res.time_us = t * 1e6;
  res.algbw = static_cast<double>(bytes) / t / 1e9;
  res.busbw = res.algbw * bus_factor(op, n);
  res.memgbps = min_traffic(op, n, static_cast<double>(bytes)) / t / 1e9;
  return res;
}

// Largest buffer a size option may ask for: the sweep allocates a few buffers of this size per
// rank in host memory (the simulator's devices), so larger ones only exhaust the machine's memory.
constexpr double kMaxBufferBytes = 4.0 * 1024 * 1024 * 1024;

std::vector<std::size_t> size_list(const CollConfig& cfg) {
  const std::size_t lo = parse_bytes(cfg.min_bytes, "--min-bytes"),
                    hi = parse_bytes(cfg.max_bytes, "--max-bytes");
  DITTO_CHECK(lo <= hi, "ditto-bench: --min-bytes ", cfg.min_bytes, " exceeds --max-bytes ",
              cfg.max_bytes);
  DITTO_CHECK(cfg.step_factor >= 2, "ditto-bench: --step-factor: expected >= 2, got ",
              cfg.step_factor);
  std::vector<std::size_t> out;
  for (std::size_t s = lo; s <= hi; s *= static_cast<std::size_t>(cfg.step_factor))
    out.push_back(s);
  return out;
}

void print_header(Op op, const std::string& be, int n, const std::string& det, DType dtype) {
  std::printf("#\n# %s  backend=%s ranks=%d determinism=%s dtype=%s redop=%s root=%d\n#\n",
              op_name(op), be.c_str(), n, det.c_str(), nccl_tests_dtype(dtype),
              reduces(op) ? "sum" : "none", rooted(op) ? 0 : -1);
  std::printf("# %12s %12s %10s %8s %8s %8s %6s %8s %10s %8s %8s %8s %6s %8s\n", "", "",
              "out-of-place", "", "", "", "", "", "in-place", "", "", "", "", "");
  std::printf("# %12s %12s %10s %8s %8s %8s %6s %8s %10s %8s %8s %8s %6s\n", "size", "count",
              "time", "algbw", "busbw", "memGB/s", "#wrong", "", "time", "algbw", "busbw",
              "memGB/s", "#wrong");
  std::printf("# %12s %12s %10s %8s %8s %8s %6s %8s %10s %8s %8s %8s %6s\n", "(B)", "(elements)",
              "(us)", "(GB/s)", "(GB/s)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "");
}

}  // namespace

std::size_t parse_bytes(const std::string& s, const char* opt) {
  std::size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    throw InvalidArgument(std::string("ditto-bench: ") + opt +
                          ": expected a size like 4K, 16M or 1G, got '" + s + "'");
  }
  std::string unit = s.substr(pos);
  double m = 1;
  if (unit == "K" || unit == "KiB")
    m = 1024;
  else if (unit == "M" || unit == "MiB")
    m = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB")
    m = 1024.0 * 1024 * 1024;
  else if (!unit.empty() && unit != "B")
    throw InvalidArgument(std::string("ditto-bench: ") + opt + ": unknown unit in '" + s +
                          "' (use B, K, M, G)");
  DITTO_CHECK(v > 0, "ditto-bench: ", opt, ": expected a positive size, got '", s, "'");
  DITTO_CHECK(v * m <= kMaxBufferBytes, "ditto-bench: ", opt,
              ": expected a size <= 4G (one buffer per rank in host memory), got '", s, "'");
  return static_cast<std::size_t>(v * m);
}

DType parse_dtype(const std::string& s) {
  for (const DTypeName& d : kDTypeNames)
    if (s == d.nccl_tests || (*d.alias && s == d.alias) || s == dtype_name(d.dtype)) return d.dtype;
  throw InvalidArgument("ditto-bench: --dtype: expected float, half, bfloat16, double, int8, "
                        "uint8, int32, uint32, int64, uint64, f8e4m3, f8e5m2 (nccl-tests' names), "
                        "a ditto dtype name (f32, f16, bf16, ...) or all, got '" +
                        s + "'");
}

std::vector<DType> parse_dtypes(const std::vector<std::string>& names) {
  std::vector<DType> out;
  for (const std::string& s : names) {
    if (s == "all") {
      out.insert(out.end(), std::begin(kAllDTypes), std::end(kAllDTypes));
      continue;
    }
    out.push_back(parse_dtype(s));
  }
  DITTO_CHECK(!out.empty(), "ditto-bench: --dtype: expected at least one dtype");
  return out;
}

void check_coll_config(const CollConfig& cfg) {
  DITTO_CHECK(cfg.max_iters >= 1, "ditto-bench: --max-iters: expected >= 1, got ", cfg.max_iters);
  DITTO_CHECK(cfg.warmup >= 0, "ditto-bench: --warmup-iters: expected >= 0, got ", cfg.warmup);
  DITTO_CHECK(std::isfinite(cfg.seconds) && cfg.seconds > 0 && cfg.seconds <= kMaxSeconds,
              "ditto-bench: --coll-seconds: expected a value > 0 and <= ", kMaxSeconds, ", got ",
              cfg.seconds);
  DITTO_CHECK(cfg.place == "in" || cfg.place == "out" || cfg.place == "both",
              "ditto-bench: --place: expected in, out or both, got '", cfg.place, "'");
  DITTO_CHECK(cfg.determinism == "fast" || cfg.determinism == "bitwise",
              "ditto-bench: --determinism: expected fast or bitwise, got '", cfg.determinism, "'");
  for (int n : cfg.ranks)
    DITTO_CHECK(n >= 1, "ditto-bench: --ranks: expected positive counts, got ", n);
  for (const auto& s : cfg.ops) parse_op(s);
  parse_dtypes(cfg.dtypes);
  size_list(cfg);
}

int run_collectives(const CollConfig& cfg, Csv& csv) {
  check_coll_config(cfg);
  std::vector<std::string> backends;
  if (cfg.backend == "auto") {
    backends.push_back("sim");
    std::string why;
    if (resolve_backend_name("auto", &why) == "cuda")
      backends.push_back("cuda");
    else
      std::printf("# cuda collectives skipped: %s\n", why.c_str());
  } else {
    backends.push_back(cfg.backend);
  }
  std::vector<Op> ops;
  for (const auto& s : cfg.ops) ops.push_back(parse_op(s));
  const std::vector<DType> dtypes = parse_dtypes(cfg.dtypes);
  const std::vector<std::size_t> sizes = size_list(cfg);
  std::int64_t total_wrong = 0;
  double busbw_sum = 0;  // over every timed size and placement: nccl-tests' Avg bus bandwidth
  int busbw_count = 0;
  for (const std::string& be : backends) {
    const int max_ranks = *std::max_element(cfg.ranks.begin(), cfg.ranks.end());
    BackendOptions bo;
    bo.device_count = max_ranks;
    init_backend(be, bo);
    for (int n : cfg.ranks) {
      std::vector<Device> devs = devices(be, n);
      CommOptions co;
      co.determinism = cfg.determinism == "bitwise" ? Determinism::bitwise : Determinism::fast;
      std::vector<Communicator> comms = Communicator::init_all(devs, co);
      for (Op op : ops) {
        for (DType dtype : dtypes) {
          print_header(op, be, n, cfg.determinism, dtype);
          const std::size_t elt = dtype_size(dtype);
          for (std::size_t asked : sizes) {
            // The size that moves, as nccl-tests prints it: whole elements, and for the blocked
            // ops (one block per rank) a multiple of the rank count; bandwidths are of this size.
            // (ditto-bench printed the asked size and divided by it; a newcomer noticed.)
            const Layout fit = layout(op, n, asked, dtype);
            const std::size_t bytes =
                static_cast<std::size_t>(blocked(op) ? fit.block * n : fit.send_n) * elt;
            if (bytes == 0) {
              std::printf("# %12zu B: skipped (less than one %s element%s)\n", asked,
                          dtype_name(dtype), blocked(op) ? " per rank" : "");
              continue;
            }
            std::string line;
            char buf[256];
            const auto elems = static_cast<std::int64_t>(bytes / elt);
            std::snprintf(buf, sizeof buf, "  %12zu %12lld", bytes, static_cast<long long>(elems));
            line += buf;
            for (bool in_place : {false, true}) {
              if ((in_place && (cfg.place == "out" || !has_in_place(op))) ||
                  (!in_place && cfg.place == "in")) {
                std::snprintf(buf, sizeof buf, " %10s %8s %8s %8s %6s %8s", "-", "-", "-", "-", "-",
                              "");
                line += buf;
                continue;
              }
              CollResult r = run_collective(comms, devs, op, dtype, in_place, bytes, cfg);
              total_wrong += r.wrong;
              busbw_sum += r.busbw;
              ++busbw_count;
              std::snprintf(buf, sizeof buf, " %10.1f %8.2f %8.2f %8.2f %6lld %8s", r.time_us,
                            r.algbw, r.busbw, r.memgbps, static_cast<long long>(r.wrong), "");
              line += buf;
              csv.row(be, op_name(op), n, in_place ? "in" : "out", cfg.determinism, bytes, elems,
                      r.iters, r.time_us, r.algbw, r.busbw, r.memgbps, r.wrong, dtype_name(dtype));
            }
            std::printf("%s\n", line.c_str());
            std::fflush(stdout);
          }
        }
      }
    }
  }
  std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(total_wrong),
              total_wrong ? "FAILED" : "OK");
  std::printf("# Avg bus bandwidth    : %g\n#\n", busbw_count ? busbw_sum / busbw_count : 0.0);
  return total_wrong ? 1 : 0;
}

}  // namespace ditto::bench
