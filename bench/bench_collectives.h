// ditto-bench's collectives sweep (nccl-tests style), split out of ditto_bench.cpp: every NCCL
// collective ditto has, on any dtype, over 2, 4, 8 ranks of one communicator (init_all, one host
// thread driving every rank as one group).
//
// Ops (--ops; nccl-tests' names in parentheses also accepted): all_reduce, all_gather,
// reduce_scatter, broadcast, reduce, all_to_all (alltoall), sendrecv, gather, scatter.
// Sizes follow nccl-tests (doc/PERFORMANCE.md): `size` is the buffer for all_reduce, broadcast,
// reduce and sendrecv, the gathered (receive) buffer for all_gather and gather, the send buffer for
// reduce_scatter and scatter, and each rank's whole send buffer (size() blocks) for all_to_all.
// busbw = algbw * factor: all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all, gather and
// scatter (n-1)/n; broadcast, reduce and sendrecv 1. sendrecv is nccl-tests' ring: rank r sends
// its buffer to r+1 and receives from r-1, every rank's pair in one group (group_start /
// group_end). all_to_all, sendrecv, gather and scatter run out-of-place only (NCCL's alltoall has
// no in-place form; in-place columns print "-"; nccl-tests times sendrecv with send = recv but
// does not check it, #wrong N/A: ditto refuses a send and a recv of one rank in one group whose
// buffers overlap, Note [Overlapping point-to-point buffers in a group]).
// Each table's header names the op's redop and root as nccl-tests' columns do: redop sum for
// all_reduce, reduce and reduce_scatter, else none; root 0 for broadcast, reduce, gather and
// scatter, else -1. The run ends with nccl-tests' two summary lines: "# Out of bounds values : N
// OK|FAILED" and "# Avg bus bandwidth    : X", the mean busbw over every timed size and
// placement of the run (nccl-tests' src/common.cu: every out-of-place and in-place result).
// --dtype (nccl-tests -d): float, half, bfloat16, double, int8, uint8, int32, uint32, int64,
// uint64, f8e4m3, f8e5m2, or ditto's names (f32, f16, bf16, ...), a comma list, or "all". Every
// call is a sum; #wrong counts elements whose bits differ from the exact result rounded once to
// the dtype, or for integer dtypes wrapped to it as the sum wraps (inputs 1 + (rank + i) % 7:
// every sum is exact in the f32 reference up to 2^21 ranks).
// nccl-tests' short options: -d (--dtype), -b (--min-bytes), -e (--max-bytes), -f
// (--step-factor), -n (--max-iters: at most n timed calls, fewer once --coll-seconds is spent,
// where nccl-tests runs exactly n), -w (--warmup-iters), -g (--ranks: one thread drives every
// rank, as nccl-tests' GPUs per thread).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "core/runtime/dtype.h"

namespace ditto::bench {

struct CollConfig {
  std::string backend = "sim";
  std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                  "reduce"};
  std::vector<std::string> dtypes = {"float"};
  std::vector<int> ranks = {2, 4, 8};
  std::string min_bytes = "4K", max_bytes = "256M";
  int step_factor = 2;
  std::string place = "both";  // out, in, both
  std::string determinism = "fast";
  double seconds = 0.05;  // timed budget per size and placement
  int max_iters = 20;
  int warmup = 1;
};

/// The longest a --coll-seconds / --train-seconds budget may be (one hour per timed run).
inline constexpr double kMaxSeconds = 3600;

/// "4K", "16M", "1G", "512" (bytes) -> bytes. `opt` names the option in errors (InvalidArgument:
/// not a size, unknown unit, not positive, over 4G).
std::size_t parse_bytes(const std::string& s, const char* opt);

/// A --dtype entry: nccl-tests' names (float, half, bfloat16, double, int8, uint8, int32, uint32,
/// int64, uint64, f8e4m3, f8e5m2; also char, int, uint, fp8_e4m3, fp8_e5m2) or ditto's dtype_name.
/// Throws InvalidArgument naming the accepted names otherwise.
DType parse_dtype(const std::string& s);

/// The dtypes of a --dtype list ("all" = every DType).
std::vector<DType> parse_dtypes(const std::vector<std::string>& names);

/// Refuses settings that would time nothing (--max-iters 0) or overflow the iteration count
/// (--coll-seconds 1e300), and bad sizes, ops or dtypes: every option is checked before any work.
void check_coll_config(const CollConfig& cfg);

/// Runs the sweep, prints nccl-tests-style tables, appends rows to `csv` (columns: backend, op,
/// ranks, place, determinism, bytes, count, iters, time_us, algbw_GBps, busbw_GBps, mem_GBps,
/// wrong, dtype). Returns 1 when any element was wrong, else 0.
int run_collectives(const CollConfig& cfg, Csv& csv);

/// The CSV header of run_collectives.
inline constexpr const char* kCollCsvHeader =
    "backend,op,ranks,place,determinism,bytes,count,iters,time_us,algbw_GBps,busbw_GBps,"
    "mem_GBps,wrong,dtype";

}  // namespace ditto::bench
