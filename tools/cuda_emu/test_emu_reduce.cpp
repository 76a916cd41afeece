// The reductions over rows and the canonical trees of backend_cuda/cuda_kernels.cu (Note [CUDA
// row sums]) and cuda_kernels_gpt.cu against the simulator (`cuda_emu_test reduce`):
//   - sum_rows_ex / sum_rows_sharded_ex (x bf16 / f16, out f32 or x's dtype) bit for bit against
//     the simulator's MixedOp path (x widened by Kernels::cast, a typed out widened, the f32
//     kernel, out cast back: ops::sum_rows / sum_rows_sharded in core/runtime/ops.cpp), in bitwise
//     mode and for the sharded kernel (one order in both modes): 0, 1, few and many rows,
//     ragged column blocks, 1 to 64 shards in one launch and 65 / 100 through the host tree,
//     empty and leading-empty shards, accumulate and beta, NaN / +-inf / signed zeros;
//   - fast sum_rows_ex and sum_rows within |cuda - ref| <= 2 u |ref| + (rows + 2) 2^-24 (sum |x|
//     + |beta out|) of a double reference (u: 2^-8 bf16, 2^-11 f16, 2^-24 f32 out), NaN where
//     ref is NaN, the same infinity where it is infinite;
//   - the f32 kernels the typed ones share (sum_rows bitwise, sum_rows_sharded) on wider and
//     ragged column counts than test_emu.cpp's, and once past the grid's 16384 blocks of 32
//     columns (its grid-stride loop: GPT-2's wpe gradient has 786,432 columns);
//   - bitwise sum (the chain staged through shared memory: tails, exact tiles, several tiles)
//     and sum_squares' tree over 1 to 600 leaves (block_tree_over: runs of 1, 2, 4 leaves
//     per thread);
//   - fast sum_rows / sum_rows_ex split into row chunks (cuda_host_logic.h's fast_row_chunks:
//     past 512 rows; the last block of each 32 columns adds the chunks' partials in the same
//     launch): f32, bf16 and f16 x against the double reference, 512 / 513 rows (one pass / a
//     last chunk of one row), ragged columns, GPT-2's [8192, 768], beta 0 over an out of NaNs
//     and beta 1, NaN / +-inf / -0 columns, and the launch's threads (the split's grid); and bit
//     for bit the two launches' order (the chunks' partials added in ascending chunk order) with
//     the blocks run forward, reversed and shuffled (emu_block_order: which block finishes
//     changes, the bits do not), the stream's ticket counters back at zero after each call;
//   - bitwise sum_sharded (Note [CUDA sharded sum]: the chains over staged tiles) bit for bit
//     against the simulator: GPT-2's loss shards (8 of 64 with 1024 tokens), 64 shards of 256,
//     one shard over several stages and exact stage multiples, shards with elements not a power
//     of two, leading / all empty shards, a shard of -0, NaN / +-inf, and 100 shards (the host
//     tree);
//   - has_sum_rows_ex's answers.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/numerics/float_formats.h"
#include "core/numerics/gpt_math.h"
#include "core/numerics/micro_shards.h"
#include "emu_check.h"

namespace {

using Bytes = std::vector<std::uint8_t>;

// v stored as t (f32 bytes, or rounded to bf16 / f16).
Bytes stored(DType t, const V& v) {
  Bytes b(v.size() * dtype_size(t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (t == DType::f32) {
      std::memcpy(b.data() + 4 * i, &v[i], 4);
      continue;
    }
    const std::uint16_t u = t == DType::bf16 ? bfloat16::from(v[i]).bits : float16::from(v[i]).bits;
    std::memcpy(b.data() + 2 * i, &u, 2);
  }
  return b;
}

// Element i of a stored buffer, widened (exact).
float elem(DType t, const Bytes& b, std::size_t i) {
  if (t == DType::f32) {
    float f;
    std::memcpy(&f, b.data() + 4 * i, 4);
    return f;
  }
  std::uint16_t u;
  std::memcpy(&u, b.data() + 2 * i, 2);
  return t == DType::bf16 ? bfloat16{u}.to_float() : float16{u}.to_float();
}

// The simulator's widening of a stored buffer (MixedOp::in: Kernels::cast).
V widen(DType t, const Bytes& b) {
  const i64 n = static_cast<i64>(b.size() / dtype_size(t));
  V f(static_cast<std::size_t>(std::max<i64>(n, 1)));
  if (t == DType::f32) {
    std::memcpy(f.data(), b.data(), b.size());
    return f;
  }
  simk->cast(*sims, b.data(), t, f.data(), DType::f32, n);
  sims->synchronize();
  return f;
}

// The simulator's rounding of the f32 result into out (MixedOp::write_back).
void round_into(DType t, const V& f, Bytes& out) {
  const i64 n = static_cast<i64>(out.size() / dtype_size(t));
  if (t == DType::f32) {
    std::memcpy(out.data(), f.data(), out.size());
    return;
  }
  simk->cast(*sims, f.data(), DType::f32, out.data(), t, n);
  sims->synchronize();
}

// x with NaN, +inf, -inf and -0 at a few places (only where `specials`).
V inputs(i64 n, unsigned seed, bool specials) {
  V v = mixed(static_cast<std::size_t>(std::max<i64>(n, 1)), seed);
  if (specials && n > 8) {
    v[3] = NAN;
    v[static_cast<std::size_t>(n / 2)] = INFINITY;
    v[static_cast<std::size_t>(n - 2)] = -INFINITY;
    v[5] = -0.0f;
  }
  return v;
}

// One typed call (sharded: sum_rows_sharded_ex over `bounds`, accumulate = acc; else
// sum_rows_ex with beta in bitwise mode) on the simulator's MixedOp path and the emulated CUDA
// kernel, out compared byte for byte.
void compare_typed(DType xt, DType ot, i64 rows, i64 cols, const Bounds* bounds, bool acc,
                   float beta, unsigned& seed, bool specials) {
  const Bytes x = stored(xt, inputs(rows * cols, seed++, specials));
  const Bytes out0 = stored(ot, mixed(static_cast<std::size_t>(cols), seed++));
  const std::string ctx = std::string(dtype_name(xt)) + "->" + dtype_name(ot) + " " +
                          dims({rows, cols}) +
                          (bounds ? " S " + std::to_string(bounds->size() - 1) + (acc ? " acc" : "")
                                  : " beta " + std::to_string(beta)) +
                          (specials ? " specials" : "");
  Bytes s = out0, e = out0;
  try {
    const V xf = widen(xt, x);
    V of = widen(ot, s);
    if (bounds)
      simk->sum_rows_sharded(*sims, xf.data(), rows, cols, *bounds, of.data(), acc);
    else
      simk->sum_rows(*sims, xf.data(), rows, cols, beta, of.data(), Determinism::bitwise);
    sims->synchronize();
    round_into(ot, of, s);
    if (bounds)
      cudak->sum_rows_sharded_ex(cudas, x.data(), xt, rows, cols, *bounds, e.data(), ot, acc);
    else
      cudak->sum_rows_ex(cudas, x.data(), xt, rows, cols, beta, e.data(), ot, Determinism::bitwise);
  } catch (const std::exception& ex) {
    ++checks;
    ++failures;
    std::printf("FAIL sum_rows typed %s: %s\n", ctx.c_str(), ex.what());
    return;
  }
  check(bounds ? "sum_rows_sharded_ex" : "sum_rows_ex", s, e, ctx);
}

// Fast sum_rows (f32 x: Kernels::sum_rows; else sum_rows_ex) of x stored as xt into an out of
// ot against the double reference, the header's tolerance; a NaN reference wants a NaN, an
// infinite one the same infinity. beta 0: out starts as NaNs (not read). `specials`: column 0
// holds a NaN, column 1 a +inf, column 2 a +inf and a -inf, column 3 only -0.
void check_fast_rows(DType xt, DType ot, i64 rows, i64 cols, float beta, unsigned& seed,
                     bool specials) {
  V xv = inputs(rows * cols, seed++, false);
  for (float& v : xv) v *= 1e-3f;  // sums within f16's range
  if (specials && rows >= 2 && cols >= 4)
    for (i64 r = 0; r < rows; ++r) {
      float* row = xv.data() + r * cols;
      if (r == rows / 2) row[0] = NAN;
      if (r == rows - 1) row[1] = row[2] = INFINITY;
      if (r == 0) row[2] = -INFINITY;
      row[3] = -0.0f;
    }
  const Bytes x = stored(xt, xv);
  V o0 = mixed(static_cast<std::size_t>(cols), seed++);
  if (beta == 0.0f) std::fill(o0.begin(), o0.end(), NAN);
  Bytes out = stored(ot, o0);
  const Bytes out0 = out;
  const std::string ctx = std::string(dtype_name(xt)) + "->" + dtype_name(ot) + " " +
                          dims({rows, cols}) + " beta " + std::to_string(beta);
  if (xt == DType::f32)
    cudak->sum_rows(cudas, reinterpret_cast<const float*>(x.data()), rows, cols, beta,
                    reinterpret_cast<float*>(out.data()), Determinism::fast);
  else
    cudak->sum_rows_ex(cudas, x.data(), xt, rows, cols, beta, out.data(), ot, Determinism::fast);
  const double u = ot == DType::bf16 ? 0x1p-8 : ot == DType::f16 ? 0x1p-11 : 0x1p-24;
  ++checks;
  for (i64 c = 0; c < cols; ++c) {
    double ref = 0.0, mag = 0.0;
    for (i64 r = 0; r < rows; ++r) {
      const double v = elem(xt, x, static_cast<std::size_t>(r * cols + c));
      ref += v;
      mag += std::fabs(v);
    }
    if (beta != 0.0f) {
      const double d = double(beta) * elem(ot, out0, static_cast<std::size_t>(c));
      ref += d;
      mag += std::fabs(d);
    }
    const double got = elem(ot, out, static_cast<std::size_t>(c));
    const double tol = 2.0 * u * std::fabs(ref) + double(rows + 2) * 0x1p-24 * mag;
    const bool ok = std::isnan(ref)   ? std::isnan(got)
                    : std::isinf(ref) ? got == ref
                                      : std::fabs(got - ref) <= tol;
    if (!ok) {
      ++failures;
      std::printf("FAIL sum_rows fast %s col %ld: %.9g vs ref %.9g (tol %.3g)\n", ctx.c_str(),
                  long(c), got, ref, tol);
      return;
    }
  }
}

// The emulated threads of one fast sum_rows over [rows, cols]: one launch of blocks of 32 x 8
// threads, 32 columns by one row chunk each.
long fast_rows_threads(i64 rows, i64 cols) {
  const auto split = cuda::fast_row_chunks(rows, cols);
  return long((cols + 31) / 32) * long(split.chunks) * 256;
}

// The fast sum_rows' bits as the two launches computed them (Note [CUDA row sums]): per chunk
// and column, row group g's chain over rows r0 + g, r0 + g + 8, ... from 0.0f, the 8 groups
// added in order; then the chunks' partials added in ascending chunk order from chunk 0, and
// finished (beta 0: v; else beta out + v), rounded once into ot.
Bytes chunk_order_sum(DType xt, DType ot, const Bytes& x, i64 rows, i64 cols, float beta,
                      const Bytes& out0) {
  const auto split = cuda::fast_row_chunks(rows, cols);
  V res(static_cast<std::size_t>(cols));
  for (i64 c = 0; c < cols; ++c) {
    float sum = 0.0f;
    for (i64 k = 0; k < split.chunks; ++k) {
      const i64 r0 = k * split.chunk_rows, r1 = std::min(rows, r0 + split.chunk_rows);
      float group[8] = {};
      for (int g = 0; g < 8; ++g)
        for (i64 r = r0 + g; r < r1; r += 8)
          group[g] += elem(xt, x, static_cast<std::size_t>(r * cols + c));
      float part = group[0];
      for (int g = 1; g < 8; ++g) part += group[g];
      sum = k == 0 ? part : sum + part;
    }
    res[static_cast<std::size_t>(c)] =
        beta == 0.0f ? sum : beta * elem(ot, out0, static_cast<std::size_t>(c)) + sum;
  }
  return stored(ot, res);
}

// The one-launch fast sum_rows over [rows, cols] with the emulator running the blocks forward,
// reversed and shuffled (twice): whichever block draws a column range's last ticket, out's bytes
// are chunk_order_sum's (the two launches' order), and the stream's semaphores are back at zero
// after each call (the next call's tickets start from zero).
void check_fast_rows_orders(DType xt, DType ot, i64 rows, i64 cols, float beta, unsigned& seed) {
  V xv = inputs(rows * cols, seed++, false);
  for (float& v : xv) v *= 1e-3f;
  const Bytes x = stored(xt, xv), out0 = stored(ot, mixed(static_cast<std::size_t>(cols), seed++));
  const Bytes want = chunk_order_sum(xt, ot, x, rows, cols, beta, out0);
  const std::string ctx = std::string(dtype_name(xt)) + "->" + dtype_name(ot) + " " +
                          dims({rows, cols}) + " beta " + std::to_string(beta) + " (" +
                          std::to_string(cuda::fast_row_chunks(rows, cols).chunks) + " chunks)";
  const std::pair<EmuBlockOrder, const char*> orders[] = {{EmuBlockOrder::forward, "forward"},
                                                          {EmuBlockOrder::reversed, "reversed"},
                                                          {EmuBlockOrder::shuffled, "shuffled"},
                                                          {EmuBlockOrder::shuffled, "shuffled"}};
  for (const auto& [order, name] : orders) {
    Bytes out = out0;
    emu_block_order = order;
    if (xt == DType::f32)
      cudak->sum_rows(cudas, reinterpret_cast<const float*>(x.data()), rows, cols, beta,
                      reinterpret_cast<float*>(out.data()), Determinism::fast);
    else
      cudak->sum_rows_ex(cudas, x.data(), xt, rows, cols, beta, out.data(), ot, Determinism::fast);
    emu_block_order = EmuBlockOrder::forward;
    check("sum_rows fast, the chunks' order", want, out, ctx + " blocks " + name);
    ++checks;
    if (std::any_of(cudas.sem.begin(), cudas.sem.end(), [](unsigned t) { return t != 0; })) {
      ++failures;
      std::printf("FAIL sum_rows fast %s blocks %s: a ticket counter left non-zero\n", ctx.c_str(),
                  name);
      std::fill(cudas.sem.begin(), cudas.sem.end(), 0u);
    }
  }
}

}  // namespace

void check_row_reductions(unsigned& seed) {
  // ---- typed, bitwise sum_rows_ex and sum_rows_sharded_ex (one order in both modes)
  struct Shape {
    i64 rows, cols;
  };
  const std::vector<Shape> shapes = {{0, 5}, {1, 1}, {1, 33}, {5, 7}, {37, 65}, {300, 40}};
  int round = 0;
  for (DType xt : {DType::bf16, DType::f16})
    for (const Shape& sh : shapes) {
      const DType ot = (round++ % 2 == 0) ? DType::f32 : xt;  // both outs over the shapes
      for (float beta : {0.0f, 0.5f})
        compare_typed(xt, ot, sh.rows, sh.cols, nullptr, false, beta, seed, sh.rows > 8);
      std::vector<Bounds> bs = {micro_shard_bounds(sh.rows, 1), micro_shard_bounds(sh.rows, 3),
                                micro_shard_bounds(sh.rows, 64)};
      if (sh.rows > 1) {
        bs.push_back(random_bounds(sh.rows, 8, seed++));  // empty shards among them
        Bounds lead = micro_shard_bounds(sh.rows, 4);     // leading empty shards
        lead[1] = lead[2] = 0;
        bs.push_back(lead);
      }
      if (sh.rows >= 100) {  // past one launch: the host tree, f32 nodes, the root typed
        bs.push_back(micro_shard_bounds(sh.rows, 65));
        bs.push_back(random_bounds(sh.rows, 100, seed++));
      }
      for (const Bounds& b : bs)
        for (bool acc : {false, true})
          compare_typed(xt, acc ? xt : ot, sh.rows, sh.cols, &b, acc, 0.0f, seed, sh.rows > 8);
    }
  // Many rows, few columns (the chains' length): one shard and 8.
  for (DType xt : {DType::bf16, DType::f16}) {
    compare_typed(xt, DType::f32, 3000, 3, nullptr, false, 0.0f, seed, true);
    const Bounds b = micro_shard_bounds(3000, 8);
    compare_typed(xt, xt, 3000, 3, &b, true, 0.0f, seed, true);
  }

  // ---- typed, fast sum_rows_ex against double
  for (DType xt : {DType::bf16, DType::f16})
    for (DType ot : {DType::f32, xt})
      for (const Shape& sh : std::vector<Shape>{{1, 3}, {33, 40}, {500, 9}})
        for (float beta : {0.0f, 1.0f})
          check_fast_rows(xt, ot, sh.rows, sh.cols, beta, seed, sh.rows > 8);

  // ---- fast sum_rows split into row chunks (f32 and typed), against double
  struct Fast {
    DType xt, ot;
    i64 rows, cols;
  };
  const std::vector<Fast> fast = {
      {DType::f32, DType::f32, 512, 33},   {DType::f32, DType::f32, 513, 33},
      {DType::f32, DType::f32, 1000, 40},  {DType::f32, DType::f32, 2000, 1},
      {DType::bf16, DType::bf16, 513, 70}, {DType::bf16, DType::f32, 3000, 5},
      {DType::f16, DType::f16, 1000, 40},  {DType::f16, DType::f32, 777, 100}};
  for (const Fast& f : fast)
    for (float beta : {0.0f, 1.0f}) check_fast_rows(f.xt, f.ot, f.rows, f.cols, beta, seed, true);
  {  // GPT-2's bias gradients, and the split's one launch by its threads: 24 x 43 blocks
    ++checks;
    const long before = emu_threads_launched;
    check_fast_rows(DType::bf16, DType::bf16, 8192, 768, 0.5f, seed, true);
    const long got = emu_threads_launched - before;
    if (cuda::fast_row_chunks(8192, 768).chunks != 43 || got != fast_rows_threads(8192, 768) ||
        got != 24L * 43 * 256) {
      ++failures;
      std::printf("FAIL sum_rows fast 8192x768: %ld emulated threads, expected %ld\n", got,
                  24L * 43 * 256);
    }
  }
  // One launch, the two launches' bits, whatever order the blocks finish in; the tickets reset.
  for (const Fast& f : std::vector<Fast>{{DType::f32, DType::f32, 1000, 40},
                                         {DType::f32, DType::f32, 513, 33},
                                         {DType::bf16, DType::f32, 3000, 70},
                                         {DType::bf16, DType::bf16, 2000, 100},
                                         {DType::f16, DType::f16, 777, 100}})
    for (float beta : {0.0f, 1.0f}) check_fast_rows_orders(f.xt, f.ot, f.rows, f.cols, beta, seed);
  check_fast_rows_orders(DType::bf16, DType::bf16, 8192, 768, 0.5f, seed);  // GPT-2's 24 x 43

  // ---- bitwise sum_sharded: the shards' chains over tiles staged in shared memory
  struct Sharded {
    std::string name;
    Bounds bounds;
    bool specials = false;  // NaN, +-inf (their result is NaN whatever the order: one case)
  };
  std::vector<Sharded> sharded = {
      {"gpt2 8 samples x 1024", micro_shard_bounds(8, 64)},
      {"64 x 256", micro_shard_bounds(64 * 256, 64)},
      {"1 x 5000", {0, 5000}},
      {"1 x 4096", {0, 4096}},
      {"2 x 4096, the first all -0", {0, 4096, 8192}},
      {"random 3 over 3001", random_bounds(3001, 3, seed++)},
      {"leading empty, 5 with elements", {0, 0, 0, 700, 701, 1500, 1500, 2600, 4000}},
      {"empty", {0, 0, 0, 0, 0}},
      {"random 64 over 9000", random_bounds(9000, 64, seed++)},
      {"100 over 20000", micro_shard_bounds(20000, 100)},
      {"5 samples x 300 over 64", micro_shard_bounds(5, 64)},
      {"random 64 over 300 (empty ones among them)", random_bounds(300, 64, seed++)},
      {"specials, 8 over 3000", micro_shard_bounds(3000, 8), true}};
  for (i64& b : sharded[0].bounds) b *= 1024;
  for (i64& b : sharded[10].bounds) b *= 300;
  for (const Sharded& c : sharded) {
    const i64 n = c.bounds.back();
    V x = inputs(n, seed++, c.specials), o = {2.0f};
    if (c.name.rfind("2 x 4096", 0) == 0)  // a chain of -0 from +0: +0
      std::fill(x.begin(), x.begin() + 4096, -0.0f);
    ++checks;
    const long before = emu_threads_launched;
    both("sum_sharded bitwise", c.name, {x, o}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
      k.sum_sharded(s, b[0].data(), c.bounds, 0.37f, b[1].data());
    });
    // One launch of 512 threads up to 64 shards (100: two leaves, then the combine's 256).
    const long want = c.bounds.size() - 1 <= 64 ? 512 : 2 * 512 + 256;
    if (emu_threads_launched - before != want) {
      ++failures;
      std::printf("FAIL sum_sharded %s: %ld emulated threads, expected %ld\n", c.name.c_str(),
                  emu_threads_launched - before, want);
    }
  }

  // ---- f32: the tree kernel the typed calls share, on ragged column blocks
  for (const Shape& sh : std::vector<Shape>{{1, 31}, {37, 33}, {130, 70}}) {
    V x = inputs(sh.rows * sh.cols, seed++, true),
      o = mixed(static_cast<std::size_t>(sh.cols), seed++);
    const std::string ctx = dims({sh.rows, sh.cols});
    for (float beta : {0.0f, -1.5f})
      both("sum_rows f32", ctx, {x, o}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
        k.sum_rows(s, b[0].data(), sh.rows, sh.cols, beta, b[1].data(), Determinism::bitwise);
      });
    for (i64 S : {2, 9, 64, 65})
      for (bool acc : {false, true}) {
        const Bounds bounds = random_bounds(sh.rows, S, seed++);
        both("sum_rows_sharded f32", ctx + " S " + std::to_string(S), {x, o},
             [&](Kernels& k, Stream& s, std::vector<V>& b) {
               k.sum_rows_sharded(s, b[0].data(), sh.rows, sh.cols, bounds, b[1].data(), acc);
             });
      }
  }
  {  // past 16384 blocks of 32 columns: the grid-stride loop (one row, one shard)
    const i64 cols = 16384 * 32 + 45;
    V x = mixed(static_cast<std::size_t>(cols), seed++),
      o = mixed(static_cast<std::size_t>(cols), seed++);
    both("sum_rows f32", "1x" + std::to_string(cols), {x, o},
         [&](Kernels& k, Stream& s, std::vector<V>& b) {
           k.sum_rows(s, b[0].data(), 1, cols, 0.25f, b[1].data(), Determinism::bitwise);
         });
  }

  // ---- bitwise sum: the chain over staged tiles of 2048 floats
  for (i64 n : {0, 1, 2047, 2048, 2049, 4096, 7000}) {
    V x = inputs(n, seed++, n == 7000), o = {3.0f};
    both("sum bitwise", "n " + std::to_string(n), {x, o},
         [&](Kernels& k, Stream& s, std::vector<V>& b) {
           k.sum(s, b[0].data(), n, 0.37f, b[1].data(), Determinism::bitwise);
         });
  }

  // ---- sum_squares' tree over the blocks' chains (block_tree_over, 256 threads)
  for (i64 leaves : {1, 2, 3, 255, 256, 257, 600}) {
    const i64 n = (leaves - 1) * gpt::kSquaresBlock + 77;
    V x = inputs(n, seed++, false), o = {1.0f};
    for (std::size_t i = 0; i < x.size(); i += 4096) x[i] = 1e17f;  // leaves that differ widely
    both("sum_squares bitwise", "leaves " + std::to_string(leaves), {x, o},
         [&](Kernels& k, Stream& s, std::vector<V>& b) {
           k.sum_squares(s, b[0].data(), n, b[1].data(), Determinism::bitwise);
         });
  }

  // ---- has_sum_rows_ex: x bf16 / f16 with out f32 or x's dtype, both modes; the simulator no
  ++checks;
  for (Determinism m : {Determinism::fast, Determinism::bitwise}) {
    const bool yes = cudak->has_sum_rows_ex(DType::bf16, DType::f32, m) &&
                     cudak->has_sum_rows_ex(DType::bf16, DType::bf16, m) &&
                     cudak->has_sum_rows_ex(DType::f16, DType::f32, m) &&
                     cudak->has_sum_rows_ex(DType::f16, DType::f16, m);
    const bool no = cudak->has_sum_rows_ex(DType::f32, DType::f32, m) ||
                    cudak->has_sum_rows_ex(DType::bf16, DType::f16, m) ||
                    cudak->has_sum_rows_ex(DType::f16, DType::f64, m) ||
                    simk->has_sum_rows_ex(DType::bf16, DType::f32, m);
    if (!yes || no) {
      ++failures;
      std::printf("FAIL has_sum_rows_ex (mode %d): yes %d no %d\n", static_cast<int>(m), yes, no);
      break;
    }
  }
}
