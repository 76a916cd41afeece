// The CUDA backend's multi-tensor kernels of the optimizer step (CudaGptKernels,
// cuda_kernels_common.cuh): AdamW over every parameter in one launch, the gradient norm's sums of
// squares, the clip's scaling, the zeroing of new moments, ZeRO-1's buffer copies and casts
// (copy_multi). Every chain keeps the operation order
// of core/numerics/canonical_math.h and gpt_math.h, so the results equal backend_sim's bit for bit (ctest CudaEmu.Kernels,
// tools/cuda_emu/test_emu_fused.cpp). How the work is cut: Note [CUDA fused kernels] (`*_multi`),
// cuda_fused.cu.
#include "backend_cuda/cuda_kernels_common.cuh"
#include "core/numerics/gpt_math.h"

namespace ditto::cuda::kern {

namespace {

constexpr int kMultiCap = 256;          // tensors per launch (the table is a kernel parameter)
constexpr i64 kMultiChunk = 8192;       // elements per block-chunk
constexpr int kMultiThreads = 256;

// The tensor of chunk `ch`: the largest i < count with first[i] <= ch (first ascending, first[0]
// == 0, empty tensors removed by the host).
__device__ __forceinline__ int tensor_of(const i64* first, int count, i64 ch) {
  int lo = 0, hi = count;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (first[mid] <= ch)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// One tensor of an AdamW launch. The gradient is of g_type (f32, bf16, f16), widened as loaded;
// `model` (null: none) receives the updated weight rounded once into model_type (the typed step,
// adam_step_multi_ex; adam_step_multi is the case g_type f32, no model, no grad scale).
struct AdamEntry {
  float* p;
  const void* g;
  float* m;
  float* v;
  float* vmax;
  void* model;
  i64 n;
  float decay_scale;
  float bias_correction2_sqrt;
  float neg_step_size;
  int decay;
  DType g_type;
  DType model_type;
};

struct AdamTable {
  AdamEntry t[kMultiCap];
  i64 first_chunk[kMultiCap + 1];
  int count;
  int scale_grads;         // g = grad_scale * g first (the clip's coefficient)
  float grad_scale;
  cm::AdamScalars shared;  // the hyper-parameters every tensor shares
};

__global__ void __launch_bounds__(kMultiThreads) adam_multi_kernel(
    const __grid_constant__ AdamTable a) {
  const i64 chunks = a.first_chunk[a.count];
  for (i64 ch = blockIdx.x; ch < chunks; ch += gridDim.x) {
    const int ti = tensor_of(a.first_chunk, a.count, ch);
    const AdamEntry& t = a.t[ti];
    cm::AdamScalars k = a.shared;
    k.bias_correction2_sqrt = t.bias_correction2_sqrt;
    k.neg_step_size = t.neg_step_size;
    const i64 lo = (ch - a.first_chunk[ti]) * kMultiChunk;
    const i64 hi = t.n - lo < kMultiChunk ? t.n : lo + kMultiChunk;
    for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      float p = t.p[i];
      if (t.decay) p = cm::mul(t.decay_scale, p);  // AdamW's param.mul_(1 - lr * wd)
      float g = ld_elem(t.g, t.g_type, i);         // exact: the f32 copy's value
      if (a.scale_grads) g = cm::mul(a.grad_scale, g);  // the clip's scale_multi of that copy
      float m = t.m[i], v = t.v[i];
      cm::adam_update(p, g, m, v, k.amsgrad ? t.vmax + i : nullptr, k);
      t.p[i] = p;
      t.m[i] = m;
      t.v[i] = v;
      if (t.model != nullptr) st_elem(t.model, t.model_type, i, p);  // the cast, rounded once
    }
  }
}

// A list of f32 tensors (scale_multi, fill_multi): up to Cap of them, their chunks' prefix.
template <int Cap>
struct ListTable {
  float* x[Cap];
  i64 n[Cap];
  i64 first_chunk[Cap + 1];
  int count;
};

// The fill of new optimizer moments has a larger table than kMultiCap (24 bytes a tensor, within
// the 32764 bytes of a kernel's parameters), so that every moment of a GPT-2 124M's AdamW (296
// tensors; amsgrad 444) is zeroed in one launch.
constexpr int kFillCap = 1024;
static_assert(sizeof(ListTable<kFillCap>) <= 32764, "a kernel's parameters hold 32764 bytes");

// scale_multi: x = alpha * x (cm::mul, scale()'s); with `fill`, fill_multi: x = alpha.
template <int Cap>
__global__ void __launch_bounds__(kMultiThreads) list_multi_kernel(
    const __grid_constant__ ListTable<Cap> a, float alpha, bool fill) {
  const i64 chunks = a.first_chunk[a.count];
  for (i64 ch = blockIdx.x; ch < chunks; ch += gridDim.x) {
    const int ti = tensor_of(a.first_chunk, a.count, ch);
    float* x = a.x[ti];
    const i64 lo = (ch - a.first_chunk[ti]) * kMultiChunk;
    const i64 hi = a.n[ti] - lo < kMultiChunk ? a.n[ti] : lo + kMultiChunk;
    for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) x[i] = fill ? alpha : cm::mul(alpha, x[i]);
  }
}

// copy_multi: pieces (src, dst, n) of one dtype each side, up to kCopyCap a launch (32 bytes a
// piece: ZeRO-1's pieces of one bucket of GPT-2 124M, a few hundred, in one launch).
constexpr int kCopyCap = 1000;
struct CopyTable {
  const void* src[kCopyCap];
  void* dst[kCopyCap];
  i64 n[kCopyCap];
  i64 first_chunk[kCopyCap + 1];
  int count;
};
static_assert(sizeof(CopyTable) + 8 <= 32764, "a kernel's parameters hold 32764 bytes");

// from == to: dst[i] = src[i] as words U of the element's size (the bytes, exactly).
template <class U>
__global__ void __launch_bounds__(kMultiThreads) copy_multi_kernel(
    const __grid_constant__ CopyTable a) {
  const i64 chunks = a.first_chunk[a.count];
  for (i64 ch = blockIdx.x; ch < chunks; ch += gridDim.x) {
    const int ti = tensor_of(a.first_chunk, a.count, ch);
    const U* x = static_cast<const U*>(a.src[ti]);
    U* y = static_cast<U*>(a.dst[ti]);
    const i64 lo = (ch - a.first_chunk[ti]) * kMultiChunk;
    const i64 hi = a.n[ti] - lo < kMultiChunk ? a.n[ti] : lo + kMultiChunk;
    for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) y[i] = x[i];
  }
}

// f32 <-> bf16 / f16: each element widened as loaded (exact) and rounded once as stored (round
// to nearest even: cast's bits, cuda_kernels_dtype.cu and the simulator's).
__global__ void __launch_bounds__(kMultiThreads) cast_multi_kernel(
    const __grid_constant__ CopyTable a, DType from, DType to) {
  const i64 chunks = a.first_chunk[a.count];
  for (i64 ch = blockIdx.x; ch < chunks; ch += gridDim.x) {
    const int ti = tensor_of(a.first_chunk, a.count, ch);
    const i64 lo = (ch - a.first_chunk[ti]) * kMultiChunk;
    const i64 hi = a.n[ti] - lo < kMultiChunk ? a.n[ti] : lo + kMultiChunk;
    for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x)
      st_elem(a.dst[ti], to, i, ld_elem(a.src[ti], from, i));
  }
}

// Sums of squares: `first` counts leaves (bitwise: kSquaresBlock elements; fast: kMultiChunk).
// Tensor i holds n[i] elements of t[i] (f32, bf16, f16), widened as loaded (exact).
struct SquaresTable {
  const void* x[kMultiCap];
  i64 n[kMultiCap];
  i64 first[kMultiCap + 1];
  DType t[kMultiCap];
  int count;
};

// partial[j] = the bitwise chain of leaf j (gpt::squares_chain of its tensor's block, widened).
__global__ void squares_multi_leaves_kernel(const __grid_constant__ SquaresTable a,
                                            float* partial) {
  const i64 leaves = a.first[a.count];
  for (i64 j = global_thread(); j < leaves; j += grid_threads()) {
    const int ti = tensor_of(a.first, a.count, j);
    const i64 lo = (j - a.first[ti]) * gpt::kSquaresBlock;
    const i64 len = a.n[ti] - lo < gpt::kSquaresBlock ? a.n[ti] - lo : gpt::kSquaresBlock;
    const DType t = a.t[ti];
    if (t == DType::f32) {
      partial[j] = gpt::squares_chain(static_cast<const float*>(a.x[ti]) + lo, len);
    } else {  // gpt::squares_chain's order on the widened elements
      float acc = 0.0f;
      for (i64 i = 0; i < len; ++i) {
        const float x = ld_elem(a.x[ti], t, lo + i);
        acc = cm::fma(x, x, acc);
      }
      partial[j] = acc;
    }
  }
}

// Fast: partial[j] = sum (any order) of fma(x, x) over chunk j, a block per chunk.
__global__ void __launch_bounds__(kMultiThreads) squares_multi_fast_kernel(
    const __grid_constant__ SquaresTable a, float* partial) {
  const i64 chunks = a.first[a.count];
  for (i64 ch = blockIdx.x; ch < chunks; ch += gridDim.x) {
    const int ti = tensor_of(a.first, a.count, ch);
    const void* x = a.x[ti];
    const DType t = a.t[ti];
    const i64 lo = (ch - a.first[ti]) * kMultiChunk;
    const i64 hi = a.n[ti] - lo < kMultiChunk ? a.n[ti] : lo + kMultiChunk;
    float acc = 0.0f;
    for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      const float xi = ld_elem(x, t, i);
      acc = cm::fma(xi, xi, acc);
    }
    acc = block_sum_any_order(acc);
    if (threadIdx.x == 0) partial[ch] = acc;
    __syncthreads();  // block_sum_any_order's shared memory is reused by the next chunk
  }
}

// out[i] = tensor i's result from its leaves [first[i], first[i + 1]): bitwise, the canonical
// tree over them; fast, their sum in order; no leaves (n == 0): +0. A thread per tensor.
__global__ void squares_multi_sum_kernel(const __grid_constant__ SquaresTable a,
                                         const float* partial, bool bitwise, float* out) {
  for (i64 i = global_thread(); i < a.count; i += grid_threads()) {
    const i64 lo = a.first[i], n = a.first[i + 1] - lo;
    float acc = 0.0f;
    if (bitwise && n > 0)
      acc = tree_over<40>(partial + lo, n);
    else
      for (i64 j = 0; j < n; ++j) acc = cm::add(acc, partial[lo + j]);
    out[i] = acc;
  }
}

// The indices of the tensors of a multi-tensor call that have elements (size(i) > 0, i < n).
template <class Size>
std::vector<std::size_t> nonempty(std::size_t n, const Size& size) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < n; ++i)
    if (size(i) > 0) order.push_back(i);
  return order;
}

// The tables of a multi-tensor call: for each run [first, first + count) of at most kMultiCap of
// the indices in `order`, f(a, first) with a fresh Table `a` of a.count == count.
template <class Table, class F>
void for_each_table(const std::vector<std::size_t>& order, const F& f) {
  for (std::size_t b = 0; b < order.size(); b += kMultiCap) {
    Table a{};
    a.count = static_cast<int>(std::min<std::size_t>(kMultiCap, order.size() - b));
    f(a, b);
  }
}

// A table's prefix of leaves: first[j] = the leaves (of leaf_len elements, the last one shorter)
// of tensors [0, j), size(j) the elements of tensor j; returns first[count], the total.
template <class Size>
i64 fill_first(i64* first, int count, i64 leaf_len, const Size& size) {
  i64 leaves = 0;
  for (int j = 0; j < count; ++j) {
    first[j] = leaves;
    leaves += (size(j) + leaf_len - 1) / leaf_len;
  }
  first[count] = leaves;
  return leaves;
}

// The tables of a list call (scale_multi, fill_multi) over the tensors of xs with elements, at
// most Cap a table, each with its chunks' prefix (fill_first's): launch(a, blocks) once per
// table. (Written without lambdas: nvcc 13's front end aborts on one in this template.)
template <int Cap, class F>
void for_each_list_table(const std::vector<float*>& xs, const std::vector<i64>& ns,
                         const F& launch) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < xs.size(); ++i)
    if (ns[i] > 0) order.push_back(i);
  for (std::size_t b = 0; b < order.size(); b += Cap) {
    ListTable<Cap> a{};
    a.count = static_cast<int>(std::min<std::size_t>(Cap, order.size() - b));
    i64 chunks = 0;
    for (int j = 0; j < a.count; ++j) {
      const std::size_t i = order[b + static_cast<std::size_t>(j)];
      a.x[j] = xs[i];
      a.n[j] = ns[i];
      a.first_chunk[j] = chunks;
      chunks += (ns[i] + kMultiChunk - 1) / kMultiChunk;
    }
    a.first_chunk[a.count] = chunks;
    launch(a, static_cast<int>(std::min<i64>(chunks, kMaxBlocks)));
  }
}

// copy_multi's tables: the pieces with elements, at most kCopyCap a table, each with its chunks'
// prefix; launch(a, blocks) once per table.
template <class F>
void for_each_copy_table(const std::vector<const void*>& srcs, const std::vector<void*>& dsts,
                         const std::vector<i64>& ns, const F& launch) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < srcs.size(); ++i)
    if (ns[i] > 0) order.push_back(i);
  for (std::size_t b = 0; b < order.size(); b += kCopyCap) {
    CopyTable a{};
    a.count = static_cast<int>(std::min<std::size_t>(kCopyCap, order.size() - b));
    i64 chunks = 0;
    for (int j = 0; j < a.count; ++j) {
      const std::size_t i = order[b + static_cast<std::size_t>(j)];
      a.src[j] = srcs[i];
      a.dst[j] = dsts[i];
      a.n[j] = ns[i];
      a.first_chunk[j] = chunks;
      chunks += (ns[i] + kMultiChunk - 1) / kMultiChunk;
    }
    a.first_chunk[a.count] = chunks;
    launch(a, static_cast<int>(std::min<i64>(chunks, kMaxBlocks)));
  }
}

bool any_elements(const std::vector<i64>& ns) {
  return std::any_of(ns.begin(), ns.end(), [](i64 n) { return n > 0; });
}

}  // namespace

// ---- CudaGptKernels: multi-tensor --------------------------------------------------------------

// The f32 step is the typed one with f32 gradients, no model weights and no gradient scale (one
// kernel for both: the same chain per element).
void CudaGptKernels::adam_step_multi(Stream& s, const std::vector<AdamTensor>& tensors, double lr,
                                     double beta1, double beta2, double eps, double weight_decay,
                                     bool amsgrad) {
  const std::vector<AdamTensorEx> ex(tensors.begin(), tensors.end());
  adam_step_multi_ex(s, ex, lr, beta1, beta2, eps, weight_decay, amsgrad, false, 1.0f);
}

void CudaGptKernels::adam_step_multi_ex(Stream& s, const std::vector<AdamTensorEx>& tensors,
                                        double lr, double beta1, double beta2, double eps,
                                        double weight_decay, bool amsgrad, bool scale_grads,
                                        float grad_scale) {
  const auto order = nonempty(tensors.size(), [&](std::size_t i) { return tensors[i].n; });
  if (order.empty()) return;
  Launch l(backend_, s, "adam_step_multi");
  for_each_table<AdamTable>(order, [&](AdamTable& a, std::size_t b) {
    const int count = a.count;
    a.scale_grads = scale_grads ? 1 : 0;
    a.grad_scale = grad_scale;
    for (int j = 0; j < count; ++j) {
      const AdamTensorEx& t = tensors[order[b + static_cast<std::size_t>(j)]];
      const cm::AdamScalars k = cm::adam_scalars(lr, beta1, beta2, eps, weight_decay,
                                                 t.bias_correction1, t.bias_correction2, amsgrad);
      if (j == 0) a.shared = k;
      a.t[j] = AdamEntry{t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.max_exp_avg_sq, t.model,
                         t.n, t.decay_scale, k.bias_correction2_sqrt, k.neg_step_size,
                         t.decay ? 1 : 0, t.grad_type, t.model_type};
    }
    const i64 chunks =
        fill_first(a.first_chunk, count, kMultiChunk, [&](int j) { return a.t[j].n; });
    adam_multi_kernel<<<static_cast<int>(std::min<i64>(chunks, kMaxBlocks)), kMultiThreads, 0, l.get()>>>(a);
    l.check();
  });
}

void CudaGptKernels::scale_multi(Stream& s, const std::vector<float*>& xs,
                                 const std::vector<i64>& ns, float alpha) {
  if (!any_elements(ns)) return;
  Launch l(backend_, s, "scale_multi");
  for_each_list_table<kMultiCap>(xs, ns, [&](const ListTable<kMultiCap>& a, int blocks) {
    list_multi_kernel<kMultiCap><<<blocks, kMultiThreads, 0, l.get()>>>(a, alpha, false);
    l.check();
  });
}

void CudaGptKernels::fill_multi(Stream& s, const std::vector<float*>& xs,
                                const std::vector<i64>& ns, float value) {
  if (!any_elements(ns)) return;
  Launch l(backend_, s, "fill_multi");
  for_each_list_table<kFillCap>(xs, ns, [&](const ListTable<kFillCap>& a, int blocks) {
    list_multi_kernel<kFillCap><<<blocks, kMultiThreads, 0, l.get()>>>(a, value, true);
    l.check();
  });
}

void CudaGptKernels::copy_multi(Stream& s, DType from, DType to,
                                const std::vector<const void*>& srcs,
                                const std::vector<void*>& dsts, const std::vector<i64>& ns) {
  auto half = [](DType t) { return t == DType::bf16 || t == DType::f16; };
  const bool convert = (from == DType::f32 && half(to)) || (half(from) && to == DType::f32);
  if (from != to && !convert) return Kernels::copy_multi(s, from, to, srcs, dsts, ns);  // casts
  if (!any_elements(ns)) return;
  Launch l(backend_, s, from == to ? "copy_multi" : "cast_multi");
  const std::size_t size = dtype_size(from);
  for_each_copy_table(srcs, dsts, ns, [&](const CopyTable& a, int blocks) {
    if (from != to)
      cast_multi_kernel<<<blocks, kMultiThreads, 0, l.get()>>>(a, from, to);
    else if (size == 1)
      copy_multi_kernel<std::uint8_t><<<blocks, kMultiThreads, 0, l.get()>>>(a);
    else if (size == 2)
      copy_multi_kernel<std::uint16_t><<<blocks, kMultiThreads, 0, l.get()>>>(a);
    else if (size == 4)
      copy_multi_kernel<std::uint32_t><<<blocks, kMultiThreads, 0, l.get()>>>(a);
    else
      copy_multi_kernel<std::uint64_t><<<blocks, kMultiThreads, 0, l.get()>>>(a);
    l.check();
  });
}

void CudaGptKernels::sum_squares_multi(Stream& s, const std::vector<const float*>& xs,
                                       const std::vector<i64>& ns, float* out, Determinism mode) {
  const std::vector<const void*> x(xs.begin(), xs.end());
  sum_squares_multi_ex(s, x, std::vector<DType>(xs.size(), DType::f32), ns, out, mode);
}

void CudaGptKernels::sum_squares_multi_ex(Stream& s, const std::vector<const void*>& xs,
                                          const std::vector<DType>& types,
                                          const std::vector<i64>& ns, float* out,
                                          Determinism mode) {
  if (xs.empty()) return;
  Launch l(backend_, s, "sum_squares_multi");
  std::vector<std::size_t> all(xs.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  const bool bitwise = mode == Determinism::bitwise;
  const i64 leaf_len = bitwise ? gpt::kSquaresBlock : kMultiChunk;
  // Tensors with n == 0 stay in the table with no leaves: their sum is +0, as sum_squares'.
  for_each_table<SquaresTable>(all, [&](SquaresTable& a, std::size_t b) {
    const int count = a.count;
    for (int j = 0; j < count; ++j) {
      const std::size_t i = b + static_cast<std::size_t>(j);
      a.x[j] = xs[i];
      a.t[j] = types[i];
      a.n[j] = std::max<i64>(ns[i], 0);
    }
    const i64 leaves = fill_first(a.first, count, leaf_len, [&](int j) { return a.n[j]; });
    DeviceTemp partial(l, leaves);
    if (leaves > 0) {
      if (bitwise)
        squares_multi_leaves_kernel<<<blocks_for(leaves, 128), 128, 0, l.get()>>>(a,
                                                                                  partial.get());
      else
        squares_multi_fast_kernel<<<static_cast<int>(std::min<i64>(leaves, kMaxBlocks)),
                                    kMultiThreads, 0, l.get()>>>(a, partial.get());
      l.check();
    }
    squares_multi_sum_kernel<<<1, kMultiCap, 0, l.get()>>>(a, partial.get(), bitwise, out + b);
    l.check();
  });
}

}  // namespace ditto::cuda::kern
