// The simulator's reduction over ranks for every dtype and op (sim_comm_kernels.h), on blocks of
// kReduceBlock elements through reduce_math.h's Acc / load_scaled / combine / finish (for the
// small floats with the bit-identical fast conversions of sim_small_float.h).
#include "backend_sim/sim_comm_kernels.h"

#include <algorithm>
#include <cstring>

#include "backend_sim/sim_small_float.h"
#include "core/base/error.h"
#include "core/numerics/reduce_math.h"

namespace ditto::sim {
namespace {

using rmath::Op;

// One loop per op (the op chosen once per block, not per element), so the compiler vectorises
// each: a per-element switch kept the loop scalar. out may alias a (out == a is how the blocks
// accumulate); b never aliases out.
template <typename A, Op O>
void combine_loop(A* out, const A* a, const A* __restrict__ b, std::int64_t len) {
  for (std::int64_t i = 0; i < len; ++i) out[i] = rmath::combine(a[i], b[i], O);
}

// sum, avg and premul_sum add (the scalars were applied by the loads).
template <typename A>
void combine_into(A* out, const A* a, const A* b, std::int64_t len, Op op) {
  switch (op) {
    case Op::prod: return combine_loop<A, Op::prod>(out, a, b, len);
    case Op::min: return combine_loop<A, Op::min>(out, a, b, len);
    case Op::max: return combine_loop<A, Op::max>(out, a, b, len);
    case Op::sum:
    case Op::avg:
    case Op::premul_sum: return combine_loop<A, Op::sum>(out, a, b, len);
  }
}

// The reduction of one call: the sources of every rank as T, and how a block of one rank becomes
// accumulator values.
template <typename T>
class Reducer {
 public:
  using A = rmath::Acc<T>;

  Reducer(const std::vector<const void*>& srcs, Op op, const double* scalars) : op_(op) {
    srcs_.reserve(srcs.size());
    for (const void* p : srcs) srcs_.push_back(static_cast<const T*>(p));
    if (op == Op::premul_sum) {
      DITTO_ASSERT(scalars != nullptr);
      for (std::size_t q = 0; q < srcs.size(); ++q)
        scalars_.push_back(rmath::scalar_as_acc<T>(scalars[q]));
    }
  }

  /// Elements [off, off + len) of rank q as accumulators: the source itself when no load is
  /// needed (A == T and no scalar), else loaded into `buf` (kReduceBlock elements).
  const A* leaf(std::int64_t q, std::int64_t off, std::int64_t len, A* buf) const {
    const T* s = srcs_[static_cast<std::size_t>(q)] + off;
    if constexpr (std::is_same_v<A, T>) {
      if (op_ != Op::premul_sum) return s;
    }
    if constexpr (is_small_float_v<T>) {  // rmath::load_scaled with the fast conversion
      to_f32_block(s, buf, len);
      if (op_ == Op::premul_sum) {
        const A scalar = scalars_[static_cast<std::size_t>(q)];
        for (std::int64_t i = 0; i < len; ++i) buf[i] = buf[i] * scalar;
      }
    } else if (op_ == Op::premul_sum) {
      const A scalar = scalars_[static_cast<std::size_t>(q)];
      for (std::int64_t i = 0; i < len; ++i) buf[i] = rmath::load_scaled(s[i], op_, scalar);
    } else {
      for (std::int64_t i = 0; i < len; ++i) buf[i] = rmath::load(s[i]);
    }
    return buf;
  }

  /// out[0..len) = op over ranks [lo, hi) of elements [off, off + len), canonical tree over q.
  /// scratch holds kReduceBlock accumulators per tree level from this one down.
  void tree(std::int64_t lo, std::int64_t hi, std::int64_t off, std::int64_t len, A* out,
            A* scratch) const {
    if (hi - lo == 1) {
      copy_leaf(lo, off, len, out);
      return;
    }
    if (hi - lo == 2) {
      const A* a = leaf(lo, off, len, out);
      combine_into(out, a, leaf(lo + 1, off, len, scratch), len, op_);
      return;
    }
    const std::int64_t mid = tree_mid(lo, hi);
    tree(lo, mid, off, len, out, scratch + kReduceBlock);
    tree(mid, hi, off, len, scratch, scratch + kReduceBlock);
    combine_into(out, out, scratch, len, op_);
  }

  /// out[0..len) = op over every rank, left to right. buf: kReduceBlock accumulators.
  void left_to_right(std::int64_t off, std::int64_t len, A* out, A* buf) const {
    const auto n = static_cast<std::int64_t>(srcs_.size());
    if (n == 1) {
      copy_leaf(0, off, len, out);
      return;
    }
    const A* a = leaf(0, off, len, out);
    combine_into(out, a, leaf(1, off, len, buf), len, op_);
    for (std::int64_t q = 2; q < n; ++q) combine_into(out, out, leaf(q, off, len, buf), len, op_);
  }

  void run(std::int64_t begin, std::int64_t end, Determinism mode, BlockSink emit) const {
    const auto n = static_cast<std::int64_t>(srcs_.size());
    int depth = 1;
    while ((std::int64_t(1) << (depth - 1)) < n) ++depth;
    std::vector<A> block(static_cast<std::size_t>(kReduceBlock));
    std::vector<A> scratch(static_cast<std::size_t>(kReduceBlock * depth));
    // Finished values, when they are not the accumulators themselves.
    constexpr bool kSameType = std::is_same_v<A, T>;
    const bool in_acc = kSameType && op_ != Op::avg;
    std::vector<T> finished(in_acc ? 0 : static_cast<std::size_t>(kReduceBlock));
    for (std::int64_t off = begin; off < end; off += kReduceBlock) {
      const std::int64_t len = std::min(kReduceBlock, end - off);
      A* out = block.data();
      if (mode == Determinism::bitwise)
        tree(0, n, off, len, out, scratch.data());
      else
        left_to_right(off, len, out, scratch.data());
      if (in_acc) {
        emit(off, out, len);
        continue;
      }
      if constexpr (is_small_float_v<T>) {  // rmath::finish with the fast conversion
        if (op_ == Op::avg)
          for (std::int64_t i = 0; i < len; ++i)
            out[i] = rmath::finish<float>(out[i], op_, static_cast<int>(n));
        from_f32_block(out, finished.data(), len);
      } else {
        for (std::int64_t i = 0; i < len; ++i)
          finished[static_cast<std::size_t>(i)] =
              rmath::finish<T>(out[i], op_, static_cast<int>(n));
      }
      emit(off, finished.data(), len);
    }
  }

 private:
  void copy_leaf(std::int64_t q, std::int64_t off, std::int64_t len, A* out) const {
    const A* p = leaf(q, off, len, out);
    if (p != out) std::memcpy(out, p, static_cast<std::size_t>(len) * sizeof(A));
  }

  std::vector<const T*> srcs_;
  Op op_;
  std::vector<A> scalars_;  // premul_sum: each rank's scalar as the accumulator
};

}  // namespace

void reduce_range(const std::vector<const void*>& srcs, std::int64_t begin, std::int64_t end,
                  DType dtype, ReduceOp op, Determinism mode, const double* scalars,
                  BlockSink emit) {
  if (end <= begin || srcs.empty()) return;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    Reducer<T>(srcs, static_cast<Op>(op), scalars).run(begin, end, mode, emit);
  });
}

void reduce_over_ranks(const std::vector<const void*>& srcs, void* out, std::int64_t count,
                       DType dtype, ReduceOp op, Determinism mode, const double* scalars) {
  auto* dst = static_cast<unsigned char*>(out);
  const std::size_t elem = dtype_size(dtype);
  reduce_range(srcs, 0, count, dtype, op, mode, scalars,
               [&](std::int64_t off, const void* b, std::int64_t len) {
                 std::memcpy(dst + static_cast<std::size_t>(off) * elem, b,
                             static_cast<std::size_t>(len) * elem);
               });
}

}  // namespace ditto::sim
