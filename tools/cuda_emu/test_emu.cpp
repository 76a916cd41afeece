// Runs every bitwise/fixed-order Kernels method on the simulator and on the CPU-emulated CUDA
// kernels (cuda_kernels.cu, cuda_gemm.cu, cuda_kernels_gpt.cu, cuda_attention.cu, cuda_fused.cu,
// cuda_kernels_dtype.cu through emu.h) with identical inputs and compares the bits; the transformer
// kernels' cases are in test_emu_gpt.cpp and test_emu_fused.cpp, the dtype-generic kernels' in
// test_emu_dtype.cpp, the typed GEMM's (gemm_ex on f32 / bf16 / f16 against the simulator's
// MixedOp path) in test_emu_gemm.cpp.
#include "core/numerics/micro_shards.h"
#include "emu_check.h"

// `cuda_emu_test rows` only the typed row kernels' (bf16 / f16, test_emu_rows.cpp),
// `cuda_emu_test reduce` only the reductions over rows and the trees' (test_emu_reduce.cpp),
// `cuda_emu_test dtype` runs only the dtype-generic kernels' checks (test_emu_dtype.cpp),
// `cuda_emu_test attention` only the attention's (test_emu_gpt.cpp), `cuda_emu_test fused` only
// those of cuda_fused.cu (test_emu_fused.cpp), `cuda_emu_test multi` only the typed
// multi-tensor kernels' (test_emu_multi.cpp; also run with `fused`).
int main(int argc, char** argv) {
  BackendOptions o;
  o.device_count = 2;
  Backend& sim = init_backend("sim", o);
  simk = &sim.kernels();
  sims = &sim.default_stream(0);
  cuda_emu::CudaBackend cb;
  cudak = cuda_emu::make_cuda_kernels(cb);
  unsigned seed = 1;
  const std::string only = argc > 1 ? argv[1] : "";
  if (only == "dtype" || only == "attention" || only == "fused" || only == "gemm" ||
      only == "attention-measure" || only == "rows" || only == "multi" || only == "reduce") {
    if (only == "attention-measure")
      measure_typed_attention(seed);
    else if (only == "dtype")
      check_dtype_kernels(seed);
    else if (only == "attention")
      check_attention_kernels(seed);
    else if (only == "gemm")
      check_typed_gemm(seed);
    else if (only == "rows")
      check_typed_rows(seed);
    else if (only == "multi")
      check_typed_multi_tensor(seed);
    else if (only == "reduce")
      check_row_reductions(seed);
    else
      check_fused_kernels(seed);
    std::printf(
        "%d checks, %d failures, %ld emulated threads, leaked temps %d, %d equal as NaN only\n",
        checks, failures, emu_threads_launched, emu_allocs, nan_bit_diffs);
    return failures != 0;
  }

  // ---- GEMM bitwise
  struct G {
    i64 M, N, K;
    float alpha, beta;
    int pad;
    int coff;
  };
  std::vector<G> gs = {{130, 200, 37, 1, 0, 0, 0},       {1, 1, 1, 1, 0, 0, 0},
                       {128, 128, 8, 0.5f, 0, 0, 0},     {129, 257, 0, 2, 0.5f, 1, 1},
                       {5, 300, 70, 1.5f, -0.75f, 3, 1}, {200, 7, 19, 1, 1, 2, 0},
                       {64, 132, 16, 1, 0, 0, 0},        {3, 4, 3, 1, 0, 0, 0}};
  for (const G& g : gs)
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const i64 ar = ta ? g.K : g.M, ac = ta ? g.M : g.K, br = tb ? g.N : g.K, bc = tb ? g.K : g.N;
      const i64 lda = ac + g.pad, ldb = bc + g.pad, ldc = g.N + g.pad;
      V A = mixed(std::max<i64>(ar * lda, 1), seed++),
        B = mixed(std::max<i64>(br * ldb, 1), seed++);
      V C = mixed(g.M * ldc + g.coff, seed++);
      if (g.M == 3) {  // products that underflow to -0
        for (auto& x : A) x = -1e-30f;
        for (auto& x : B) x = 1e-30f;
      }
      both("gemm",
           std::to_string(g.M) + "x" + std::to_string(g.N) + "x" + std::to_string(g.K) + " t" +
               std::to_string(t),
           {A, B, C}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
             k.gemm(s, ta, tb, g.M, g.N, g.K, g.alpha, b[0].data(), lda, b[1].data(), ldb, g.beta,
                    b[2].data() + g.coff, ldc, Determinism::bitwise);
           });
    }

  // ---- the typed GEMM (gemm_ex) against the simulator's MixedOp path (test_emu_gemm.cpp)
  check_typed_gemm(seed);

  // ---- sharded
  std::vector<std::pair<i64, Bounds>> sc;
  for (i64 rows : {0, 5, 37, 130, 300})
    for (i64 S : {1, 2, 3, 8, 64, 65, 100, 200}) {
      sc.push_back({rows, micro_shard_bounds(rows, S)});
      if (S > 1 && rows > 0) sc.push_back({rows, random_bounds(rows, S, seed++)});
    }
  // gemm_tn_sharded: N 131 (unaligned) and 132, acc off and on, all four for every bounds of up to
  // 37 rows; past that one of the four, the next for the next bounds (each still 3 or 4 times per
  // row count), since the emulated time grows with the rows (130 and 300 were 70% of this part's
  // time; 13 s of one core under ASan at e3048b2).
  int turn = 0;                   // the bounds past 37 rows so far
  for (auto& rows_bounds : sc) {  // no structured binding: Clang 14's lambdas cannot capture one
    const auto& rows = rows_bounds.first;
    const auto& bounds = rows_bounds.second;
    const std::string ctx =
        "rows " + std::to_string(rows) + " S " + std::to_string(bounds.size() - 1);
    const int keep = rows > 37 ? turn++ % 4 : -1;  // the (N, acc) case run, -1: all four
    int c = 0;
    for (i64 N : {131, 132})
      for (bool acc : {false, true}) {
        if (keep >= 0 && c++ != keep) continue;
        const i64 M = 130;
        V A = mixed(std::max<i64>(rows * M, 1), seed++),
          B = mixed(std::max<i64>(rows * N, 1), seed++), C = mixed(M * N, seed++);
        both("gemm_tn_sharded", ctx + " N " + std::to_string(N) + " acc " + std::to_string(acc),
             {A, B, C}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
               k.gemm_tn_sharded(s, M, N, b[0].data(), M, b[1].data(), N, bounds, b[2].data(), N,
                                 acc);
             });
      }
    for (bool acc : {false, true}) {
      const i64 cols = 7;
      V X = mixed(std::max<i64>(rows * cols, 1), seed++), O = mixed(cols, seed++);
      both("sum_rows_sharded", ctx, {X, O}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
        k.sum_rows_sharded(s, b[0].data(), rows, cols, bounds, b[1].data(), acc);
      });
    }
    V X = mixed(std::max<i64>(rows, 1), seed++), O = {1.0f};
    both("sum_sharded", ctx, {X, O}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
      k.sum_sharded(s, b[0].data(), bounds, 0.37f, b[1].data());
    });
  }

  // ---- sum_inputs (canonical tree), 0..20 inputs, aligned or not, out aliasing input 0
  for (int n = 0; n <= 20; ++n)
    for (i64 numel : {1, 7, 1001})
      for (int off : {0, 1})
        for (bool alias : {false, true}) {
          if (alias && n == 0) continue;
          std::vector<V> st;
          for (int i = 0; i < n; ++i) st.push_back(mixed(numel + 1, seed++));
          st.push_back(mixed(numel + 1, seed++));  // out
          both("sum_inputs",
               "n " + std::to_string(n) + " numel " + std::to_string(numel) + " off " +
                   std::to_string(off) + " alias " + std::to_string(alias),
               st, [&](Kernels& k, Stream& s, std::vector<V>& b) {
                 std::vector<const float*> in;
                 for (int i = 0; i < n; ++i) in.push_back(b[i].data() + off);
                 float* out = alias ? b[0].data() + off : b.back().data() + off;
                 k.sum_inputs(s, in.data(), n, out, numel, Determinism::bitwise);
               });
        }

  // ---- elementwise, losses, reductions, optimizers
  for (i64 n : {1, 5, 1000, 70000}) {
    const std::string ctx = "n " + std::to_string(n);
    V x = mixed(n, seed++), y = mixed(n, seed++), z = mixed(n, seed++);
    both("relu", ctx, {x, y},
         [&](Kernels& k, Stream& s, std::vector<V>& b) { k.relu(s, b[0].data(), b[1].data(), n); });
    both("relu_backward", ctx, {x, y, z}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
      k.relu_backward(s, b[0].data(), b[1].data(), b[2].data(), n);
    });
    both("axpy", ctx, {x, y}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
      k.axpy(s, 0.3f, b[0].data(), b[1].data(), n);
    });
    both("scale", ctx, {x},
         [&](Kernels& k, Stream& s, std::vector<V>& b) { k.scale(s, -1.7f, b[0].data(), n); });
    both("fill", ctx, {x},
         [&](Kernels& k, Stream& s, std::vector<V>& b) { k.fill_f32(s, b[0].data(), -0.0f, n); });
    V g1 = {0.8f};
    both("mse_backward", ctx, {x, y, z, g1}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
      k.mse_backward(s, b[0].data(), b[1].data(), n, b[3].data(), 0.01f, b[2].data());
    });
    V out1 = {5.0f};
    both("sum", ctx, {x, out1}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
      k.sum(s, b[0].data(), n, 0.125f, b[1].data(), Determinism::bitwise);
    });
    V p = mixed(n, seed++, false), gr = mixed(n, seed++, false), m = mixed(n, seed++, false);
    for (bool nesterov : {false, true})
      for (bool first : {false, true})
        both("sgd", ctx, {p, gr, m}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
          k.sgd_step(s, b[0].data(), b[1].data(), b[2].data(), n, 0.1f, 0.9f, 0.1f, 0.01f, nesterov,
                     first);
        });
    both("sgd0", ctx, {p, gr}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
      k.sgd_step(s, b[0].data(), b[1].data(), nullptr, n, 0.1f, 0.0f, 0.0f, 0.0f, false, false);
    });
    V ea = mixed(n, seed++, false), eas = mixed(n, seed++, false), mx = mixed(n, seed++, false);
    for (auto& v : eas) v = std::fabs(v);
    for (auto& v : mx) v = std::fabs(v);
    for (bool ams : {false, true})
      both("adam", ctx, {p, gr, ea, eas, mx}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
        k.adam_step(s, b[0].data(), b[1].data(), b[2].data(), b[3].data(),
                    ams ? b[4].data() : nullptr, n, 1e-3, 0.9, 0.999, 1e-8, 0.01,
                    1 - std::pow(0.9, 3), 1 - std::pow(0.999, 3), ams);
      });
  }
  for (auto rows_cols :
       std::vector<std::pair<i64, i64>>{{1, 1}, {7, 10}, {300, 3}, {33, 257}, {0, 5}}) {
    const i64 rows = rows_cols.first, cols = rows_cols.second;
    const std::string ctx = std::to_string(rows) + "x" + std::to_string(cols);
    V x = mixed(std::max<i64>(rows * cols, 1), seed++),
      t = mixed(std::max<i64>(rows * cols, 1), seed++);
    V bias = mixed(cols, seed++), out = mixed(std::max<i64>(rows, 1), seed++),
      oc = mixed(cols, seed++);
    both("add_bias", ctx, {x, bias}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
      k.add_bias(s, b[0].data(), b[1].data(), rows, cols);
    });
    for (float beta : {0.0f, 0.5f})
      both("sum_rows", ctx, {x, oc}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
        k.sum_rows(s, b[0].data(), rows, cols, beta, b[1].data(), Determinism::bitwise);
      });
    both("mse", ctx, {x, t, out}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
      k.mse(s, b[0].data(), b[1].data(), rows, cols, b[2].data());
    });
    std::vector<i64> tg(std::max<i64>(rows, 1));
    for (i64 r = 0; r < rows; ++r) tg[r] = (r * 7) % cols;
    V logits = mixed(std::max<i64>(rows * cols, 1), seed++, false);
    if (rows > 2) {
      logits[1] = NAN;
      logits[cols] = INFINITY;
      logits[2 * cols] = -0.0f;
    }
    both("cross_entropy", ctx, {logits, out}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
      k.cross_entropy(s, b[0].data(), tg.data(), rows, cols, b[1].data());
    });
    V g1 = {1.5f}, gl = mixed(std::max<i64>(rows * cols, 1), seed++);
    both("cross_entropy_backward", ctx, {logits, g1, gl},
         [&](Kernels& k, Stream& s, std::vector<V>& b) {
           k.cross_entropy_backward(s, b[0].data(), tg.data(), rows, cols, b[1].data(), 0.25f,
                                    b[2].data());
         });
  }
  // ---- fast-mode reductions: any order, so within a tolerance of the simulator's
  for (i64 n : {0, 1, 31, 1000, 5000}) {
    V x = mixed(std::max<i64>(n, 1), seed++, false), o1 = {2.0f}, o2 = {2.0f};
    simk->sum(*sims, x.data(), n, 0.5f, o1.data(), Determinism::fast);
    sims->synchronize();
    cudak->sum(cudas, x.data(), n, 0.5f, o2.data(), Determinism::fast);
    ++checks;
    if (std::fabs(o1[0] - o2[0]) > 1e-3f * (1 + std::fabs(o1[0]))) {
      ++failures;
      std::printf("FAIL sum fast n %ld: %g vs %g\n", long(n), o1[0], o2[0]);
    }
  }
  for (auto rows_cols :
       std::vector<std::pair<i64, i64>>{{1, 1}, {7, 10}, {300, 3}, {33, 257}, {0, 5}})
    for (float beta : {0.0f, 0.5f}) {
      const i64 rows = rows_cols.first, cols = rows_cols.second;
      V x = mixed(std::max<i64>(rows * cols, 1), seed++, false), o = mixed(cols, seed++, false),
        o2 = o;
      simk->sum_rows(*sims, x.data(), rows, cols, beta, o.data(), Determinism::fast);
      sims->synchronize();
      cudak->sum_rows(cudas, x.data(), rows, cols, beta, o2.data(), Determinism::fast);
      ++checks;
      for (i64 c = 0; c < cols; ++c)
        if (std::fabs(o[c] - o2[c]) > 1e-3f * (1 + std::fabs(o[c]))) {
          ++failures;
          std::printf("FAIL sum_rows fast %ldx%ld col %ld: %g vs %g\n", long(rows), long(cols),
                      long(c), o[c], o2[c]);
          break;
        }
    }
  check_gpt_kernels(seed);
  check_fused_kernels(seed);
  check_dtype_kernels(seed);
  check_row_reductions(seed);
  std::printf(
      "%d checks, %d failures, %ld emulated threads, leaked temps %d, %d equal as NaN only\n",
      checks, failures, emu_threads_launched, emu_allocs, nan_bit_diffs);
  return failures != 0;
}
