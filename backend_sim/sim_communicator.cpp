// The simulator's collectives: shared-memory all_reduce, reduce, broadcast, all_gather,
// reduce_scatter and barrier across virtual devices, with call matching, timeouts and abort.
//
// Note [Sim collectives]
// Every virtual device's memory is host memory of this process, so a collective needs no
// transport: each rank reads and writes the other ranks' buffers directly, once all of them have
// arrived. Each rank's call enqueues ONE task on the given stream; the task
//   1. publishes the call (kind, pointers, count, dtype, op, root) in the rank's slot of the
//      shared state and enters a rendezvous (a reusable generation barrier: mutex + condvar);
//   2. after the rendezvous, checks that every rank called the same collective with the same
//      count, dtype, op and root (all ranks run the same check and throw the same
//      InvalidArgument when they differ, e.g. "all_reduce: rank 2 called with count 10, rank 0
//      with count 12 ...");
//   3. does its share of the data work, split so that every byte moves about once and the ranks
//      work in parallel:
//        all_reduce      rank r reduces element slice r (ceil(count / N) elements) across all
//                        ranks' send buffers into a small local block, then writes the block into
//                        every rank's recv at slice r;
//        reduce          the same, writing only the root's recv;
//        broadcast       rank r copies slice r of the root's send into every recv;
//        all_gather      rank r copies its send into every recv at offset r * count;
//        reduce_scatter  rank r reduces block r across all ranks' send into its own recv;
//        barrier         nothing;
//      Only rank r touches slice (or block) r of any buffer, so in-place calls (send == recv, or
//      send inside recv for all_gather / recv inside send for reduce_scatter) are race-free: the
//      reduction of a slice is finished in the local block before it is written back;
//   4. enters a second rendezvous, so that no rank returns (and lets its stream reuse or free its
//      buffers, or publish its next call) while other ranks still read or write them.
// The element reduction over ranks follows the canonical tree over rank index in
// Determinism::bitwise (Note [Canonical tree], done on blocks of elements) and runs left to right
// in fast mode. avg is sum followed by a division by N (ncclAvg); i64 arithmetic wraps.
//
// A rank waiting in a rendezvous longer than CommOptions::timeout_ms throws ditto::Timeout naming
// the collective, its ordinal on this communicator and the ranks that never arrived; the
// communicator is then aborted: ranks still waiting fail with the same error, queued tasks fail
// when they run, and every later call throws BackendError at once (like ncclCommAbort). A rank
// that fails calls Communicator::abort: the same, with "rank R failed: <reason>" as the reason
// (ranks waiting in a rendezvous name their collective before it). A mismatch
// does not abort: all ranks fail that one call together and stay in step.
//
// Like NCCL, a single host thread must enqueue the call on every rank before it blocks on any of
// them (e.g. a blocking host copy on a rank's stream), or the ranks wait for each other until the
// timeout. A rank's collectives must run one at a time (issue them on one stream per rank, or
// order the streams); a second collective starting on a rank whose previous one is still running
// aborts the communicator with an error that says so.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

#include "backend_sim/sim_backend.h"
#include "core/collective_call.h"
#include "core/error.h"

namespace ditto::sim {
namespace {

using Kind = detail::CollectiveKind;
using Call = detail::CollectiveCall;
using detail::uses_op;
using detail::uses_root;
inline const char* kind_name(Kind k) { return detail::collective_name(k); }

// ---- elementwise reduction ------------------------------------------------------------------

constexpr std::int64_t kBlock = 1024;  // elements reduced per step into the local block

template <typename T>
T combine(T a, T b, ReduceOp op) {
  if constexpr (std::is_same_v<T, float>) {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: return a + b;
      case ReduceOp::prod: return a * b;
      case ReduceOp::min: return (b < a || b != b) ? b : a;  // NaN propagates
      case ReduceOp::max: return (b > a || b != b) ? b : a;
    }
  } else {  // i64: wrap around like two's complement hardware instead of signed overflow
    auto ua = static_cast<std::uint64_t>(a), ub = static_cast<std::uint64_t>(b);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: return static_cast<T>(ua + ub);
      case ReduceOp::prod: return static_cast<T>(ua * ub);
      case ReduceOp::min: return std::min(a, b);
      case ReduceOp::max: return std::max(a, b);
    }
  }
  return a;
}

// One loop per op (the op chosen once per block, not per element), so the compiler vectorises
// each: the per-element switch kept the loop scalar. Same arithmetic per element as combine().
// out may alias a (out == a is how the blocks accumulate); b never aliases out.
template <typename T, ReduceOp Op>
void combine_loop(T* out, const T* a, const T* __restrict__ b, std::int64_t len) {
  for (std::int64_t i = 0; i < len; ++i) out[i] = combine(a[i], b[i], Op);
}

template <typename T>
void combine_into(T* out, const T* a, const T* b, std::int64_t len, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return combine_loop<T, ReduceOp::sum>(out, a, b, len);
    case ReduceOp::prod: return combine_loop<T, ReduceOp::prod>(out, a, b, len);
    case ReduceOp::min: return combine_loop<T, ReduceOp::min>(out, a, b, len);
    case ReduceOp::max: return combine_loop<T, ReduceOp::max>(out, a, b, len);
  }
}

/// out[0..len) = op over srcs[lo..hi) of srcs[q][off..off+len), canonical tree over q.
/// scratch holds kBlock elements per tree level below this one.
template <typename T>
void tree_reduce(const std::vector<const T*>& srcs, std::int64_t lo, std::int64_t hi,
                 std::int64_t off, std::int64_t len, ReduceOp op, T* out, T* scratch) {
  if (hi - lo == 1) {
    std::memcpy(out, srcs[lo] + off, static_cast<std::size_t>(len) * sizeof(T));
    return;
  }
  if (hi - lo == 2) {
    combine_into(out, srcs[lo] + off, srcs[lo + 1] + off, len, op);
    return;
  }
  std::int64_t mid = tree_mid(lo, hi);
  tree_reduce(srcs, lo, mid, off, len, op, out, scratch + kBlock);
  tree_reduce(srcs, mid, hi, off, len, op, scratch, scratch + kBlock);
  combine_into(out, out, scratch, len, op);
}

/// Reduces elements [begin, end) of every source (all ranks) and hands each finished block of at
/// most kBlock elements to `emit(offset, block, length)`.
template <typename T, typename Emit>
void reduce_range(const std::vector<const T*>& srcs, std::int64_t begin, std::int64_t end,
                  ReduceOp op, Determinism mode, Emit&& emit) {
  const auto n = static_cast<std::int64_t>(srcs.size());
  int depth = 1;
  while ((std::int64_t(1) << (depth - 1)) < n) ++depth;
  std::vector<T> block(static_cast<std::size_t>(kBlock));
  std::vector<T> scratch(static_cast<std::size_t>(kBlock * depth));
  for (std::int64_t off = begin; off < end; off += kBlock) {
    std::int64_t len = std::min(kBlock, end - off);
    T* out = block.data();
    if (mode == Determinism::bitwise) {
      tree_reduce(srcs, 0, n, off, len, op, out, scratch.data());
    } else if (n == 1) {
      std::memcpy(out, srcs[0] + off, static_cast<std::size_t>(len) * sizeof(T));
    } else {  // left to right
      combine_into(out, srcs[0] + off, srcs[1] + off, len, op);
      for (std::int64_t q = 2; q < n; ++q) combine_into(out, out, srcs[q] + off, len, op);
    }
    if constexpr (std::is_same_v<T, float>) {
      if (op == ReduceOp::avg)
        for (std::int64_t i = 0; i < len; ++i) out[i] = out[i] / static_cast<float>(n);
    }
    emit(off, static_cast<const T*>(out), len);
  }
}

// ---- stores of finished blocks ----------------------------------------------------------------

// Note [Streaming stores]
// A collective over large buffers writes each destination line once and does not read it again
// soon; an ordinary store first reads the line (read-for-ownership), so every written byte costs a
// read too, and evicts lines the reduction still needs (out-of-place all_reduce of 4 MiB over 4
// ranks ran 4x slower than in-place here). When a call writes more than kStreamBytes in all (more
// than a core's L2), the finished blocks go out with non-temporal stores where the CPU has them
// (x86; one sfence at the end of the rank's work orders them before the closing rendezvous).
// Only the store instruction changes: the values are the same bits.
constexpr std::size_t kStreamBytes = std::size_t(4) << 20;
constexpr std::int64_t kCopyBlock = 4096;  // elements per block of broadcast / all_gather copies

inline void store_block(void* dst, const void* src, std::size_t bytes, bool stream) {
#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
  if (stream) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
#if defined(__AVX512F__)
    constexpr std::size_t kVec = 64;
#elif defined(__AVX__)
    constexpr std::size_t kVec = 32;
#else
    constexpr std::size_t kVec = 16;
#endif
    // Unaligned head with ordinary stores, aligned body streamed, tail ordinary.
    std::size_t head = (kVec - reinterpret_cast<std::uintptr_t>(d) % kVec) % kVec;
    if (head > bytes) head = bytes;
    std::memcpy(d, s, head);
    std::size_t i = head;
    for (; i + kVec <= bytes; i += kVec) {
#if defined(__AVX512F__)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i),
                          _mm512_loadu_si512(reinterpret_cast<const void*>(s + i)));
#elif defined(__AVX__)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
#else
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
#endif
    }
    std::memcpy(d + i, s + i, bytes - i);
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, bytes);
}

inline void store_fence(bool stream) {
#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
  if (stream) _mm_sfence();
#endif
  (void)stream;
}

// ---- the communicator -----------------------------------------------------------------------

class SimCommunicator final : public CommunicatorImpl,
                              public std::enable_shared_from_this<SimCommunicator> {
 public:
  SimCommunicator(std::vector<int> devices, const CommOptions& options,
                  std::shared_ptr<CostModel> cost)
      : devices_(std::move(devices)),
        options_(options),
        cost_(std::move(cost)),
        n_(static_cast<int>(devices_.size())),
        arrive_(devices_.size(), 0),
        here_(devices_.size(), 0),
        in_flight_(devices_.size(), 0),
        seq_(devices_.size(), 0),
        slots_(devices_.size()) {}

  void all_reduce(int rank, Stream& s, const void* send, void* recv, std::int64_t count,
                  DType dtype, ReduceOp op) override {
    submit(rank, s, {Kind::all_reduce, send, recv, count, dtype, op, 0});
  }
  void reduce(int rank, Stream& s, const void* send, void* recv, std::int64_t count, DType dtype,
              ReduceOp op, int root) override {
    submit(rank, s, {Kind::reduce, send, recv, count, dtype, op, root});
  }
  void broadcast(int rank, Stream& s, const void* send, void* recv, std::int64_t count,
                 DType dtype, int root) override {
    submit(rank, s, {Kind::broadcast, send, recv, count, dtype, ReduceOp::sum, root});
  }
  void all_gather(int rank, Stream& s, const void* send, void* recv, std::int64_t count,
                  DType dtype) override {
    submit(rank, s, {Kind::all_gather, send, recv, count, dtype, ReduceOp::sum, 0});
  }
  void reduce_scatter(int rank, Stream& s, const void* send, void* recv, std::int64_t count,
                      DType dtype, ReduceOp op) override {
    submit(rank, s, {Kind::reduce_scatter, send, recv, count, dtype, op, 0});
  }
  void barrier(int rank, Stream& s) override { submit(rank, s, {}); }

  void abort(int rank, const std::string& reason) noexcept override {
    try {
      std::lock_guard lk(mu_);
      if (aborted_) return;  // the first reason stays
      abort_locked(detail::cat("rank ", rank, " failed: ", reason), false);
      abort_by_rank_ = true;
    } catch (...) {  // allocation failure of the message: the flag is what matters
      aborted_ = true;
      cv_.notify_all();
    }
  }

 private:
  // Throws at once when aborted; otherwise enqueues the rank's task.
  void submit(int rank, Stream& s, const Call& call) {
    SimStream& ss = as_sim(s, kind_name(call.kind));
    {
      std::lock_guard lk(mu_);
      throw_if_aborted(call.kind);
    }
    ss.enqueue([self = shared_from_this(), rank, call, &ss] { self->run(rank, call, ss); });
  }

  // Caller holds mu_.
  void throw_if_aborted(Kind kind) const {
    if (aborted_)
      throw BackendError(detail::cat(kind_name(kind), ": communicator aborted by an earlier error: ",
                                     abort_reason_));
  }

  // Caller holds mu_.
  void abort_locked(std::string reason, bool timeout) {
    aborted_ = true;
    abort_timeout_ = timeout;
    abort_reason_ = std::move(reason);
    cv_.notify_all();
  }

  // The task body of one rank (Note [Sim collectives]).
  void run(int rank, const Call& call, SimStream& stream) {
    std::uint64_t seq = 0;
    {
      std::lock_guard lk(mu_);
      throw_if_aborted(call.kind);
      seq = ++seq_[static_cast<std::size_t>(rank)];
      if (in_flight_[static_cast<std::size_t>(rank)]) {
        abort_locked(detail::cat(kind_name(call.kind), " (collective #", seq,
                                 " on this communicator): rank ", rank,
                                 " started a collective while its previous one was still running "
                                 "(on another stream); a rank's collectives must run one at a "
                                 "time"),
                     false);
        throw BackendError(abort_reason_);
      }
      in_flight_[static_cast<std::size_t>(rank)] = 1;
      slots_[static_cast<std::size_t>(rank)] = call;
      arrive_[static_cast<std::size_t>(rank)] = stream.virtual_now;
    }
    struct Done {
      SimCommunicator* self;
      int rank;
      ~Done() {
        std::lock_guard lk(self->mu_);
        self->in_flight_[static_cast<std::size_t>(rank)] = 0;
      }
    } done{this, rank};

    const std::string label =
        detail::cat(kind_name(call.kind), " (collective #", seq, " on this communicator)");
    rendezvous(rank, label);
    std::string mismatch = find_mismatch(seq);
    if (mismatch.empty()) {
      if (call.dtype == DType::f32)
        work<float>(rank);
      else
        work<std::int64_t>(rank);
      charge(call, stream);
    }
    rendezvous(rank, label);
    if (!mismatch.empty()) throw InvalidArgument(mismatch);
  }

  // Reusable generation barrier with a timeout; names the ranks that never arrived.
  void rendezvous(int rank, const std::string& label) {
    std::unique_lock lk(mu_);
    throw_if_aborted(slots_[static_cast<std::size_t>(rank)].kind);
    const std::uint64_t gen = generation_;
    here_[static_cast<std::size_t>(rank)] = 1;
    if (++arrived_ == n_) {
      arrived_ = 0;
      std::fill(here_.begin(), here_.end(), 0);
      ++generation_;
      cv_.notify_all();
      return;
    }
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.timeout_ms);
    while (generation_ == gen && !aborted_) {
      if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && generation_ == gen &&
          !aborted_) {
        std::vector<int> missing;
        for (int q = 0; q < n_; ++q)
          if (!here_[static_cast<std::size_t>(q)]) missing.push_back(q);
        std::string who = missing.size() == 1 ? "rank " : "ranks ";
        for (std::size_t i = 0; i < missing.size(); ++i)
          who += (i ? ", " : "") + std::to_string(missing[i]);
        abort_locked(detail::cat(label, ": timed out after ", options_.timeout_ms,
                                 " ms waiting for ", who, " (communicator of ", n_,
                                 " ranks; it is now aborted)"),
                     true);
        throw Timeout(abort_reason_);
      }
    }
    if (generation_ != gen) return;
    // Another rank timed out (or misused the communicator, or failed and called abort) while
    // this one waited.
    if (abort_timeout_) throw Timeout(abort_reason_);
    if (abort_by_rank_) throw BackendError(detail::cat(label, ": ", abort_reason_));
    throw BackendError(abort_reason_);
  }

  // Virtual time (Note [Virtual time], cost_model.h): the collective starts when the last rank
  // arrived and lasts the cost model's estimate. Reads arrive_: only between the two rendezvous.
  void charge(const Call& call, SimStream& stream) {
    const VTime start = *std::max_element(arrive_.begin(), arrive_.end());
    double bytes = static_cast<double>(call.count) * static_cast<double>(dtype_size(call.dtype));
    if (call.kind == Kind::all_gather || call.kind == Kind::reduce_scatter) bytes *= n_;
    if (call.kind == Kind::barrier) bytes = 0;
    const CollectiveEstimate est = collective_time(cost_->cluster(), call.kind, bytes, devices_);
    cost_->on_collective(stream, kind_name(call.kind), start, est, bytes);
  }

  // Empty when every rank's call matches rank 0's; else the error every rank throws.
  // Reads the slots: only between the two rendezvous of a call.
  std::string find_mismatch(std::uint64_t seq) const { return detail::find_call_mismatch(slots_, seq); }

  // Rank `rank`'s share of the data movement (Note [Sim collectives]).
  template <typename T>
  void work(int rank) {
    const Call& c = slots_[static_cast<std::size_t>(rank)];
    const std::int64_t count = c.count;
    const auto n = static_cast<std::int64_t>(n_);
    const std::size_t elem = sizeof(T);
    std::vector<const T*> sends(static_cast<std::size_t>(n));
    std::vector<T*> recvs(static_cast<std::size_t>(n));
    for (std::int64_t q = 0; q < n; ++q) {
      sends[q] = static_cast<const T*>(slots_[q].send);
      recvs[q] = static_cast<T*>(slots_[q].recv);
    }
    const Determinism mode = options_.determinism;
    // Destination elements written by the whole call (all ranks) past kStreamBytes: stream them.
    auto big = [&](std::int64_t elems) {
      return static_cast<std::size_t>(elems) * elem >= kStreamBytes;
    };
    // Element slice r of [0, count) when the work is split N ways.
    const std::int64_t per = (count + n - 1) / n;
    const std::int64_t lo = std::min(count, rank * per), hi = std::min(count, lo + per);

    switch (c.kind) {
      case Kind::all_reduce: {
        // Note [Streaming stores]; in place the destination lines were just read: keep them.
        const bool stream = sends[0] != recvs[0] && big(count * n);
        reduce_range<T>(sends, lo, hi, c.op, mode, [&](std::int64_t off, const T* b, std::int64_t len) {
          for (std::int64_t q = 0; q < n; ++q)
            store_block(recvs[q] + off, b, static_cast<std::size_t>(len) * elem, stream);
        });
        store_fence(stream);
        break;
      }
      case Kind::reduce: {
        T* dst = recvs[c.root];
        const bool stream = sends[c.root] != dst && big(count);
        reduce_range<T>(sends, lo, hi, c.op, mode, [&](std::int64_t off, const T* b, std::int64_t len) {
          store_block(dst + off, b, static_cast<std::size_t>(len) * elem, stream);
        });
        store_fence(stream);
        break;
      }
      case Kind::broadcast: {
        // Block by block, each block of the root's slice into every recv while it is in cache.
        const T* src = sends[c.root];
        const bool stream = big(count * n);
        for (std::int64_t off = lo; off < hi; off += kCopyBlock) {
          const std::int64_t len = std::min(kCopyBlock, hi - off);
          for (std::int64_t q = 0; q < n; ++q)
            if (recvs[q] != src)
              store_block(recvs[q] + off, src + off, static_cast<std::size_t>(len) * elem, stream);
        }
        store_fence(stream);
        break;
      }
      case Kind::all_gather: {
        const T* src = sends[rank];
        const bool stream = big(count * n * n);
        for (std::int64_t off = 0; off < count; off += kCopyBlock) {
          const std::int64_t len = std::min(kCopyBlock, count - off);
          for (std::int64_t q = 0; q < n; ++q) {
            T* dst = recvs[q] + rank * count;
            if (dst != src)
              store_block(dst + off, src + off, static_cast<std::size_t>(len) * elem, stream);
          }
        }
        store_fence(stream);
        break;
      }
      case Kind::reduce_scatter: {
        std::vector<const T*> blocks(static_cast<std::size_t>(n));
        for (std::int64_t q = 0; q < n; ++q) blocks[q] = sends[q] + rank * count;
        T* dst = recvs[rank];
        const bool stream = blocks[rank] != dst && big(count * n);
        reduce_range<T>(blocks, 0, count, c.op, mode, [&](std::int64_t off, const T* b, std::int64_t len) {
          store_block(dst + off, b, static_cast<std::size_t>(len) * elem, stream);
        });
        store_fence(stream);
        break;
      }
      case Kind::barrier: break;
    }
  }

  const std::vector<int> devices_;
  const CommOptions options_;
  const std::shared_ptr<CostModel> cost_;
  const int n_;
  std::vector<VTime> arrive_;        // each rank's stream clock when its call started

  std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t generation_ = 0;     // completed rendezvous
  int arrived_ = 0;                  // ranks in the current rendezvous
  std::vector<char> here_;           // here_[r]: rank r is in the current rendezvous
  std::vector<char> in_flight_;      // in_flight_[r]: rank r's collective is running
  std::vector<std::uint64_t> seq_;   // collectives started per rank
  std::vector<Call> slots_;          // each rank's current call
  bool aborted_ = false;
  bool abort_timeout_ = false;       // the abort came from a timeout (waiters throw Timeout)
  bool abort_by_rank_ = false;       // the abort came from a rank's abort() (Communicator::abort)
  std::string abort_reason_;
};

}  // namespace

std::shared_ptr<CommunicatorImpl> make_sim_communicator(const std::vector<int>& devices,
                                                        const CommOptions& options,
                                                        std::shared_ptr<CostModel> cost) {
  return std::make_shared<SimCommunicator>(devices, options, std::move(cost));
}

namespace {
template <typename T>
void reduce_over_ranks_t(const std::vector<const void*>& srcs, void* out, std::int64_t count,
                         ReduceOp op, Determinism mode) {
  std::vector<const T*> typed;
  typed.reserve(srcs.size());
  for (const void* p : srcs) typed.push_back(static_cast<const T*>(p));
  T* dst = static_cast<T*>(out);
  reduce_range<T>(typed, 0, count, op, mode, [&](std::int64_t off, const T* b, std::int64_t len) {
    std::memcpy(dst + off, b, static_cast<std::size_t>(len) * sizeof(T));
  });
}
}  // namespace

void reduce_over_ranks(const std::vector<const void*>& srcs, void* out, std::int64_t count,
                       DType dtype, ReduceOp op, Determinism mode) {
  if (dtype == DType::f32)
    reduce_over_ranks_t<float>(srcs, out, count, op, mode);
  else
    reduce_over_ranks_t<std::int64_t>(srcs, out, count, op, mode);
}

}  // namespace ditto::sim
