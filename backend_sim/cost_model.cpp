// The cost model's formulas (roofline kernels, alpha-beta collectives) and its per-device
// bookkeeping. Note [Virtual time] and Note [Collective model] are in cost_model.h.
#include "backend_sim/cost_model.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "backend_sim/sim_stream.h"
#include "backend_sim/trace.h"
#include "core/backend_api/cuda_launch_shapes.h"
#include "core/base/error.h"
#include "core/numerics/gpt_math.h"
#include "core/runtime/backend.h"

namespace ditto::sim {

using Kind = CollectiveKind;

const char* unit_name(PricedUnit u) {
  switch (u) {
    case PricedUnit::tensor_core_bf16: return "tensor core bf16";
    case PricedUnit::tensor_core_f16: return "tensor core f16";
    case PricedUnit::tensor_core_tf32: return "tensor core tf32";
    case PricedUnit::simt_library: return "SIMT f32 (cuBLASLt)";
    case PricedUnit::simt_ditto: return "SIMT f32 (ditto)";
    case PricedUnit::tensor_core_bf16_mma: return "tensor core bf16 mma";
    case PricedUnit::tensor_core_f16_mma: return "tensor core f16 mma";
    case PricedUnit::simt: return "SIMT f32";
    case PricedUnit::memory: return "memory";
    case PricedUnit::pcie: return "PCIe";
    case PricedUnit::interconnect: return "interconnect";
  }
  return "?";
}

KernelPrice kernel_price(const DeviceProfile& device, const KernelCost& cost, bool allow_tf32) {
  // Note [Compute units] (cost_model.h), Note [Achieved efficiency] (profiles.h). A peak a JSON
  // profile leaves at 0 falls back to the FP32 one.
  auto or_fp32 = [&](double peak) { return peak > 0 ? peak : device.fp32_flops; };
  const double simt_rate = device.fp32_flops * device.simt_efficiency;
  KernelPrice p;
  if (cost.gemm && cost.path == GemmPath::simt) {
    p.compute_unit = PricedUnit::simt_ditto;
    p.compute_s = cost.flops / simt_rate;
  } else if (cost.gemm) {
    double peak = device.fp32_flops;
    p.compute_unit = PricedUnit::simt_library;
    if (cost.operands == DType::bf16) {
      peak = or_fp32(device.bf16_flops);
      p.compute_unit = PricedUnit::tensor_core_bf16;
    } else if (cost.operands == DType::f16) {
      peak = or_fp32(device.f16_flops > 0 ? device.f16_flops : device.bf16_flops);
      p.compute_unit = PricedUnit::tensor_core_f16;
    } else if (allow_tf32) {
      peak = or_fp32(device.tf32_flops);
      p.compute_unit = PricedUnit::tensor_core_tf32;
    }
    p.compute_s = cost.flops / (peak * device.gemm_efficiency);
  } else {
    const double mm = std::min(std::max(cost.matmul_flops, 0.0), cost.flops);
    const bool half = cost.operands == DType::bf16 || cost.operands == DType::f16;
    if (cost.path == GemmPath::mma && half) {  // ditto's mma.sync kernel (Note [Typed kernels])
      const bool bf16 = cost.operands == DType::bf16;
      const double peak =
          or_fp32(bf16 || device.f16_flops <= 0 ? device.bf16_flops : device.f16_flops);
      p.compute_unit = mm <= 0 ? PricedUnit::simt
                       : bf16  ? PricedUnit::tensor_core_bf16_mma
                               : PricedUnit::tensor_core_f16_mma;
      p.compute_s = mm / (peak * device.mma_efficiency) + (cost.flops - mm) / device.fp32_flops;
    } else {
      p.compute_unit = mm > 0 ? PricedUnit::simt_ditto : PricedUnit::simt;
      p.compute_s = mm / simt_rate + (cost.flops - mm) / device.fp32_flops;
    }
  }
  p.memory_s = cost.bytes / (device.memory_bandwidth * device.memory_efficiency);
  p.unit = p.memory_s > p.compute_s ? PricedUnit::memory : p.compute_unit;
  p.seconds =
      device.launch_latency * std::max(cost.launches, 1) + std::max(p.compute_s, p.memory_s);
  return p;
}

double kernel_seconds(const DeviceProfile& device, const KernelCost& cost, bool allow_tf32) {
  return kernel_price(device, cost, allow_tf32).seconds;
}

KernelCost native_cost(const KernelCost& f32, DType storage) {
  if (storage != DType::bf16 && storage != DType::f16) return f32;
  KernelCost c = f32;
  c.bytes = f32.bytes * static_cast<double>(dtype_size(storage)) / 4.0;
  c.operands = storage;
  return c;
}

KernelCost gemm_ex_cost(const GemmExArgs& g) {
  const double M = static_cast<double>(g.M), N = static_cast<double>(g.N),
               K = static_cast<double>(g.K);
  const auto size = [](DType t) { return static_cast<double>(dtype_size(t)); };
  KernelCost c;
  c.flops = 2.0 * M * N * K;
  const bool bias = g.epilogue == GemmEpilogue::bias ||
                    (g.epilogue == GemmEpilogue::gelu_aux_bias && g.bias != nullptr);
  const bool aux = g.epilogue == GemmEpilogue::gelu_aux_bias || g.epilogue == GemmEpilogue::dgelu;
  c.bytes = M * K * size(g.a_type) + K * N * size(g.b_type) +
            (g.beta == 0.0f ? 1.0 : 2.0) * M * N * size(g.c_type) +
            (bias ? N * size(g.c_type) : 0.0) + (aux ? M * N * size(g.c_type) : 0.0);
  c.gemm = true;
  c.path = g.mode == Determinism::bitwise ? GemmPath::simt : GemmPath::library;
  c.operands = g.a_type;
  return c;
}

namespace {
bool float_storage(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }
}  // namespace

KernelCost attention_ex_cost(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t nh,
                             DType storage, Determinism mode, bool backward, bool dropout,
                             bool with_y) {
  const char* fn = backward ? "attention_ex_cost (backward)" : "attention_ex_cost (forward)";
  DITTO_CHECK(B >= 1 && T >= 1, fn, ": expected B >= 1 and T >= 1, got B = ", B, ", T = ", T);
  DITTO_CHECK(nh >= 1 && C >= nh && C % nh == 0, fn,
              ": expected C a positive multiple of nh >= 1, got C = ", C, ", nh = ", nh);
  DITTO_CHECK(float_storage(storage), fn, ": storage: expected f32, bf16 or f16, got ",
              dtype_name(storage));
  const double hd = static_cast<double>(C / nh);
  const double pairs = static_cast<double>(B) * static_cast<double>(nh) * static_cast<double>(T) *
                       (static_cast<double>(T) + 1.0) / 2.0;
  const double tokens = static_cast<double>(B) * static_cast<double>(T);
  const double rows = tokens * static_cast<double>(nh);  // (b, h, t): one softmax row each
  const double s = static_cast<double>(dtype_size(storage)), cd = static_cast<double>(C);
  // Per pair and kernel: scale, exp (~20), max, sum, the dS product (Note [Typed kernels]); a
  // dropout mask element (a quarter of a Philox block, ~17) and its scaling.
  const int kernels = backward ? 2 : 1;
  const double other = kernels * (backward ? 26.0 : 24.0) + (dropout ? kernels * 18.0 : 0.0);
  // The tensor-core kernels exist for head widths 64 and 128; other widths (and bitwise mode)
  // run the SIMT kernels with typed loads.
  const bool tensor_cores =
      mode == Determinism::fast && storage != DType::f32 && (C / nh == 64 || C / nh == 128);
  // Given y, the fast dq kernels (tensor-core and SIMT) read D = rowsum(dy * y)
  // (FlashAttention-2's) from it; bitwise recomputes it (the simulator's bits).
  const bool d_from_y = backward && with_y && mode == Determinism::fast;
  // T x T x hd matrix products over the pairs: forward S = q k^T, P v; backward (two kernels,
  // no atomics, cuda_attention.cu): the dq kernel's S, dP, dQ; the dk / dv kernel's S, dP, dV,
  // dK: 7, and 9 where D = rowsum(P dP) is recomputed in a first pass of the dq kernel (S, dP:
  // no y given, or bitwise mode).
  const double passes = backward ? (d_from_y ? 7.0 : 9.0) : 2.0;
  KernelCost c;
  c.matmul_flops = pairs * passes * 2.0 * hd;
  c.flops = c.matmul_flops + pairs * other + (d_from_y ? 2.0 * tokens * cd : 0.0);
  if (!backward)  // qkv read, y written; the stats {m, sum} written in f32
    c.bytes = tokens * cd * (3.0 + 1.0) * s + rows * 8.0;
  else  // each kernel reads q, k, v, dy (the dq kernel y for D); dqkv written; stats read
        // twice, pd written and read
    c.bytes =
        tokens * cd * (2.0 * 4.0 + 3.0 + (d_from_y ? 1.0 : 0.0)) * s + rows * (2.0 * 8.0 + 8.0);
  c.operands = storage;
  c.path = tensor_cores ? GemmPath::mma : GemmPath::simt;
  c.launches = kernels;
  return c;
}

KernelCost storage_cost(const KernelCost& f32, DType storage, double fixed_bytes) {
  DITTO_CHECK(float_storage(storage), "storage_cost: storage: expected f32, bf16 or f16, got ",
              dtype_name(storage));
  DITTO_CHECK(fixed_bytes >= 0 && fixed_bytes <= f32.bytes,
              "storage_cost: fixed_bytes: expected 0 <= fixed_bytes <= the f32 kernel's bytes ",
              f32.bytes, ", got ", fixed_bytes);
  KernelCost c = f32;
  c.bytes =
      (f32.bytes - fixed_bytes) * static_cast<double>(dtype_size(storage)) / 4.0 + fixed_bytes;
  c.operands = storage;
  return c;
}

KernelCost sum_rows_ex_cost(std::int64_t rows, std::int64_t cols, DType x_type, DType out_type) {
  DITTO_CHECK(float_storage(x_type) && float_storage(out_type),
              "sum_rows_ex_cost: expected x_type and out_type f32, bf16 or f16, got ",
              dtype_name(x_type), " and ", dtype_name(out_type));
  DITTO_CHECK(rows >= 0 && cols >= 0, "sum_rows_ex_cost: expected rows, cols >= 0, got ", rows,
              " and ", cols);
  KernelCost c{double(rows) * double(cols),
               double(rows) * double(cols) * double(dtype_size(x_type)) +
                   double(cols) * double(dtype_size(out_type))};
  c.operands = x_type;
  return c;
}

std::int64_t cuda_fast_row_chunks(std::int64_t rows, std::int64_t cols) {
  return detail::fast_row_chunks(rows, cols).chunks;
}

KernelCost fast_sum_rows_cost(std::int64_t rows, std::int64_t cols, DType x_type, DType out_type) {
  KernelCost c = sum_rows_ex_cost(rows, cols, x_type, out_type);
  const std::int64_t chunks = cuda_fast_row_chunks(rows, cols);
  if (chunks > 1) c.bytes += 8.0 * double(chunks) * double(cols);  // one launch
  return c;
}

std::int64_t cuda_layernorm_params_chunks(std::int64_t rows) {
  return detail::layernorm_params_split(rows).chunks;
}

KernelCost layernorm_backward_params_cost(std::int64_t N, std::int64_t C, DType storage,
                                          DType grad_type, bool residual, bool bias,
                                          bool accumulate_w, bool accumulate_b) {
  DITTO_CHECK(float_storage(storage) && float_storage(grad_type),
              "layernorm_backward_params_cost: expected storage and grad_type f32, bf16 or f16, "
              "got ",
              dtype_name(storage), " and ", dtype_name(grad_type));
  DITTO_CHECK(N >= 0 && C >= 1, "layernorm_backward_params_cost: expected N >= 0 and C >= 1, got ",
              N, " and ", C);
  const double n = double(N), c = double(C), es = double(dtype_size(storage)),
               gs = double(dtype_size(grad_type));
  KernelCost k;
  k.flops = (15.0 + (bias ? 1.0 : 0.0) + (residual ? 1.0 : 0.0)) * n * c;
  k.bytes = (3.0 + (residual ? 1.0 : 0.0)) * n * c * es + c * es + 8.0 * n +
            c * gs * (accumulate_w ? 2.0 : 1.0) +
            (bias ? c * gs * (accumulate_b ? 2.0 : 1.0) : 0.0);
  const detail::LnParamsSplit split = detail::layernorm_params_split(N);
  if (split.chunks > 1) {
    k.bytes += 16.0 * c * double(split.chunks + (split.groups > 1 ? split.groups : 0));
  }
  k.operands = storage;
  return k;
}

const char* algo_name(CollectiveAlgo a) {
  switch (a) {
    case CollectiveAlgo::local: return "local";
    case CollectiveAlgo::ring: return "ring";
    case CollectiveAlgo::tree: return "tree";
    case CollectiveAlgo::nvls: return "nvls";
    case CollectiveAlgo::hierarchical: return "hierarchical";
    case CollectiveAlgo::p2p: return "p2p";
  }
  return "?";
}

double busbw_factor(Kind kind, int n) {
  if (n <= 1) return 1.0;
  switch (kind) {
    case Kind::all_reduce: return 2.0 * (n - 1) / n;
    case Kind::all_gather:
    case Kind::reduce_scatter:
    case Kind::all_to_all:
    case Kind::all_to_all_v:
    case Kind::gather:
    case Kind::scatter: return static_cast<double>(n - 1) / n;
    default: return 1.0;
  }
}

CollectiveEstimate collective_time(const ClusterSpec& cluster, Kind kind, double bytes,
                                   const std::vector<int>& devices,
                                   std::optional<CollectiveAlgo> force) {
  // A send to itself is a copy inside the device, whether it names the device once or twice.
  const bool self_p2p =
      (kind == Kind::send || kind == Kind::recv) && devices.size() == 2 && devices[0] == devices[1];
  const int n = self_p2p ? 1 : static_cast<int>(devices.size());
  const DeviceProfile& dev = cluster.device;
  const InterconnectProfile& ic = cluster.interconnect;
  if (n <= 1) {
    DITTO_CHECK(!force || *force == CollectiveAlgo::local, "collective_time: algorithm ",
                algo_name(*force), " needs more than one rank");
    return {dev.launch_latency + 2.0 * bytes / dev.memory_bandwidth, CollectiveAlgo::local};
  }
  std::map<int, int> per_node;
  for (int d : devices) ++per_node[cluster.node_of(d)];
  const int m = static_cast<int>(per_node.size());
  int g = 0;
  for (const auto& [node, count] : per_node) g = std::max(g, count);

  const double a = ic.base_latency, h = ic.hop_latency, hn = ic.net_hop_latency;
  const double B = ic.link_bandwidth;
  const double net = static_cast<double>(std::min(ic.nics_per_node, g)) * ic.nic_bandwidth;
  const double b_ring = m > 1 ? std::min(B, net) : B;
  // Latency of `steps` ring steps of which `inter` cross nodes.
  auto steps_lat = [&](int steps, int inter) { return (steps - inter) * h + inter * hn; };
  const double S = bytes;

  switch (kind) {
    case Kind::all_gather:
    case Kind::reduce_scatter:
      return {a + steps_lat(n - 1, m - 1) + (n - 1.0) / n * S / b_ring, CollectiveAlgo::ring};
    case Kind::broadcast:
    case Kind::reduce: return {a + steps_lat(n - 1, m - 1) + S / b_ring, CollectiveAlgo::ring};
    case Kind::all_to_all:
    case Kind::all_to_all_v:
    case Kind::gather:
    case Kind::scatter:
      return {a + steps_lat(n - 1, m - 1) + (n - 1.0) / n * S / b_ring, CollectiveAlgo::p2p};
    case Kind::send:
    case Kind::recv: return {a + (m > 1 ? hn : h) + S / b_ring, CollectiveAlgo::p2p};
    case Kind::all_reduce:
    case Kind::barrier: break;
  }

  std::vector<CollectiveEstimate> cands;
  cands.push_back({a + steps_lat(2 * (n - 1), 2 * (m - 1)) + 2.0 * (n - 1) / n * S / b_ring,
                   CollectiveAlgo::ring});
  const int log2m = m > 1 ? static_cast<int>(std::ceil(std::log2(static_cast<double>(m)))) : 0;
  cands.push_back({a + 2.0 * ((g - 1) * h + log2m * hn) + 2.0 * S / b_ring, CollectiveAlgo::tree});
  const bool nvls = ic.nvls_efficiency > 0;
  if (nvls && m == 1)
    cands.push_back(
        {a + 2 * h + (n + 1.0) / n * S / (B * ic.nvls_efficiency), CollectiveAlgo::nvls});
  if (m > 1 && g > 1) {
    const double intra = nvls ? 2 * h + (g + 1.0) / g * S / (B * ic.nvls_efficiency)
                              : 2.0 * (g - 1) * h + 2.0 * (g - 1) / g * S / B;
    const double inter = 2.0 * (m - 1) * hn + 2.0 * (m - 1) / m * (S / g) / ic.nic_bandwidth;
    cands.push_back({a + intra + inter, CollectiveAlgo::hierarchical});
  }
  if (force) {
    for (const auto& c : cands)
      if (c.algo == *force) return c;
    throw InvalidArgument(detail::cat("collective_time: algorithm ", algo_name(*force),
                                      " does not apply to ", n, " ranks on ", m, " node(s) of ",
                                      ic.key));
  }
  return *std::min_element(cands.begin(), cands.end(),
                           [](const auto& x, const auto& y) { return x.seconds < y.seconds; });
}

// ---- CostModel ------------------------------------------------------------------------------

namespace {

// Runs of at most `cap` of the tensors that `take` (their indices in order), as
// cuda_multi_tensor.cu cuts a call into tables.
template <class Take>
std::vector<std::vector<std::size_t>> multi_tensor_tables(std::size_t n, const Take& take,
                                                          std::size_t cap = kCudaMultiTensorCap) {
  std::vector<std::vector<std::size_t>> tables;
  for (std::size_t i = 0; i < n; ++i) {
    if (!take(i)) continue;
    if (tables.empty() || tables.back().size() == cap) tables.emplace_back();
    tables.back().push_back(i);
  }
  return tables;
}

}  // namespace

std::vector<KernelCost> adam_step_multi_costs(const std::vector<std::int64_t>& ns,
                                              const std::vector<bool>& decay, bool amsgrad) {
  return adam_step_multi_ex_costs(ns, decay, {}, {}, amsgrad, false);
}

std::vector<KernelCost> adam_step_multi_ex_costs(const std::vector<std::int64_t>& ns,
                                                 const std::vector<bool>& decay,
                                                 const std::vector<int>& grad_bytes,
                                                 const std::vector<int>& model_bytes, bool amsgrad,
                                                 bool scale_grads) {
  std::vector<KernelCost> out;
  for (const auto& table :
       multi_tensor_tables(ns.size(), [&](std::size_t i) { return ns[i] > 0; })) {
    KernelCost c;
    for (std::size_t i : table) {
      const double n = static_cast<double>(ns[i]);
      const double g = i < grad_bytes.size() ? grad_bytes[i] : 4.0;
      const double w = i < model_bytes.size() ? model_bytes[i] : 0.0;
      c.flops += ((i < decay.size() && decay[i] ? 17.0 : 16.0) + (scale_grads ? 1.0 : 0.0)) * n;
      c.bytes += ((amsgrad ? 32.0 : 24.0) + g + w) * n;
    }
    out.push_back(c);
  }
  return out;
}

std::vector<KernelCost> sum_squares_multi_costs(const std::vector<std::int64_t>& ns,
                                                Determinism mode) {
  return sum_squares_multi_ex_costs(ns, {}, mode);
}

std::vector<KernelCost> sum_squares_multi_ex_costs(const std::vector<std::int64_t>& ns,
                                                   const std::vector<int>& elem_bytes,
                                                   Determinism mode) {
  const std::int64_t leaf =
      mode == Determinism::bitwise ? gpt::kSquaresBlock : kCudaMultiTensorChunk;
  std::vector<KernelCost> out;
  for (const auto& table : multi_tensor_tables(ns.size(), [](std::size_t) { return true; })) {
    double elems = 0, bytes = 0, leaves = 0;
    for (std::size_t i : table) {
      const std::int64_t n = std::max<std::int64_t>(ns[i], 0);
      elems += static_cast<double>(n);
      bytes += (i < elem_bytes.size() ? elem_bytes[i] : 4.0) * static_cast<double>(n);
      leaves += static_cast<double>((n + leaf - 1) / leaf);
    }
    if (leaves > 0) out.push_back(KernelCost{2.0 * elems, bytes + 4.0 * leaves});
    out.push_back(KernelCost{leaves, 4.0 * leaves + 4.0 * static_cast<double>(table.size())});
  }
  return out;
}

std::vector<KernelCost> scale_multi_costs(const std::vector<std::int64_t>& ns) {
  std::vector<KernelCost> out;
  for (const auto& table :
       multi_tensor_tables(ns.size(), [&](std::size_t i) { return ns[i] > 0; })) {
    double elems = 0;
    for (std::size_t i : table) elems += static_cast<double>(ns[i]);
    out.push_back(KernelCost{elems, 8.0 * elems});
  }
  return out;
}

std::vector<KernelCost> fill_multi_costs(const std::vector<std::int64_t>& ns) {
  std::vector<KernelCost> out;
  for (const auto& table : multi_tensor_tables(
           ns.size(), [&](std::size_t i) { return ns[i] > 0; }, kCudaFillMultiCap)) {
    double elems = 0;
    for (std::size_t i : table) elems += static_cast<double>(ns[i]);
    out.push_back(KernelCost{0.0, 4.0 * elems});
  }
  return out;
}

std::vector<KernelCost> copy_multi_costs(const std::vector<std::int64_t>& ns, DType from,
                                         DType to) {
  std::vector<KernelCost> out;
  const double per = static_cast<double>(dtype_size(from) + dtype_size(to));
  for (const auto& table : multi_tensor_tables(
           ns.size(), [&](std::size_t i) { return ns[i] > 0; }, kCudaCopyMultiCap)) {
    double elems = 0;
    for (std::size_t i : table) elems += static_cast<double>(ns[i]);
    out.push_back(KernelCost{from == to ? 0.0 : elems, per * elems});
  }
  return out;
}

CostModel::CostModel(int device_count, ClusterSpec cluster) : cluster_(std::move(cluster)) {
  devices_.reserve(static_cast<std::size_t>(device_count));
  for (int i = 0; i < device_count; ++i) devices_.push_back(std::make_unique<PerDevice>());
  trace_ = std::make_unique<TraceRecorder>();
}

CostModel::~CostModel() = default;

void CostModel::configure(const ClusterSpec& cluster) {
  DITTO_CHECK(cluster.nodes >= 1 && cluster.devices_per_node >= 1,
              "CostModel::configure: expected nodes >= 1 and devices_per_node >= 1, got ",
              cluster.nodes, " and ", cluster.devices_per_node);
  cluster_ = cluster;
}

void CostModel::set_slowdown(int device, double factor) {
  DITTO_CHECK(device >= 0 && device < device_count(), "set_slowdown: device: expected 0..",
              device_count() - 1, ", got ", device);
  DITTO_CHECK(std::isfinite(factor) && factor >= kMinSlowdown && factor <= kMaxSlowdown,
              "set_slowdown: factor: expected ", kMinSlowdown, " <= factor <= ", kMaxSlowdown,
              ", got ", factor);
  devices_[static_cast<std::size_t>(device)]->slowdown = factor;
}

double CostModel::slowdown(int device) const {
  return devices_[static_cast<std::size_t>(device)]->slowdown;
}

void CostModel::set_tracing(bool on) { tracing_.store(on, std::memory_order_relaxed); }

void CostModel::write_trace(const std::string& path) const {
  DITTO_CHECK(tracing(), "write_trace: tracing is off (enable it before the run with "
                         "set_tracing(true))");
  trace_->write_chrome_json(path, cluster_.device.name, device_count());
}

void CostModel::set_trace_max_events(std::size_t max_events) { trace_->set_max_events(max_events); }

TraceStats CostModel::trace_stats() const { return trace_->stats(); }

namespace {
void atomic_max(std::atomic<VTime>& a, VTime v) {
  VTime old = a.load(std::memory_order_relaxed);
  while (v > old && !a.compare_exchange_weak(old, v, std::memory_order_relaxed)) {
  }
}
// a += v (v >= 0), saturating at kVTimeMax like every virtual-time sum.
void atomic_add_sat(std::atomic<VTime>& a, VTime v) {
  VTime old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, vtime_add(old, v), std::memory_order_relaxed)) {
  }
}
}  // namespace

void CostModel::finish(SimStream& stream, int device, VTime start, VTime end, const char* name,
                       const char* cat, std::atomic<VTime>* busy) {
  stream.virtual_now = end;
  PerDevice& pd = *devices_[static_cast<std::size_t>(device)];
  if (busy) atomic_add_sat(*busy, end - start);
  atomic_max(pd.end, end);
  if (tracing()) trace_->add({device, stream.track, name, cat, start, end - start, false, 0});
}

void CostModel::record(int device, const char* name, PricedUnit unit, double flops, double bytes,
                       VTime duration, std::int64_t launches) {
  PerDevice& pd = *devices_[static_cast<std::size_t>(device)];
  std::lock_guard<std::mutex> lock(pd.ledger_mu);
  LedgerRow* row = nullptr;
  for (LedgerRow& r : pd.ledger)
    if (r.unit == unit && r.name == name) {
      row = &r;
      break;
    }
  if (!row) {
    pd.ledger.push_back(LedgerRow{name, unit, 0, 0, 0, 0});
    row = &pd.ledger.back();
  }
  row->count += launches;
  row->flops += flops;
  row->bytes += bytes;
  row->time = vtime_add(row->time, duration);
}

std::vector<CostModel::LedgerRow> CostModel::ledger(int device) const {
  DITTO_CHECK(device >= 0 && device < device_count(), "CostModel::ledger: device: expected 0..",
              device_count() - 1, ", got ", device);
  const PerDevice& pd = *devices_[static_cast<std::size_t>(device)];
  std::lock_guard<std::mutex> lock(pd.ledger_mu);
  return pd.ledger;
}

void CostModel::on_kernel(SimStream& stream, const char* name, const KernelCost& cost) {
  const int d = stream.device_index();
  PerDevice& pd = *devices_[static_cast<std::size_t>(d)];
  const VTime start = stream.virtual_now;
  const KernelPrice price = kernel_price(cluster_.device, cost, allow_tf32_);
  const VTime end = vtime_add(start, to_vtime(price.seconds * pd.slowdown));
  if (cost.gemm) gemm_flops_.fetch_add(static_cast<std::uint64_t>(cost.flops));
  record(d, name, price.unit, cost.flops, cost.bytes, end - start, std::max(cost.launches, 1));
  finish(stream, d, start, end, name, "kernel", &pd.compute);
}

void CostModel::on_host_copy(SimStream& stream, const char* name, std::size_t bytes) {
  const int d = stream.device_index();
  const DeviceProfile& dev = cluster_.device;
  const VTime start = stream.virtual_now;
  const VTime end = vtime_add(
      start, to_vtime(dev.host_latency + static_cast<double>(bytes) / dev.host_bandwidth));
  record(d, name, PricedUnit::pcie, 0, static_cast<double>(bytes), end - start);
  finish(stream, d, start, end, name, "copy", &devices_[static_cast<std::size_t>(d)]->host_copy);
}

void CostModel::on_device_copy(SimStream& stream, int src, std::size_t bytes) {
  const int d = stream.device_index();
  PerDevice& pd = *devices_[static_cast<std::size_t>(d)];
  const double b = static_cast<double>(bytes);
  const VTime start = stream.virtual_now;
  if (src < 0 || src == d) {  // inside one device: read + write at memory bandwidth
    const double s = cluster_.device.launch_latency + 2.0 * b / cluster_.device.memory_bandwidth;
    const VTime end = vtime_add(start, to_vtime(s * pd.slowdown));
    record(d, "copy_d2d", PricedUnit::memory, 0, 2.0 * b, end - start);
    finish(stream, d, start, end, "copy_d2d", "copy", &pd.compute);
    return;
  }
  const InterconnectProfile& ic = cluster_.interconnect;
  const bool same_node = cluster_.node_of(src) == cluster_.node_of(d);
  const double s = same_node ? ic.hop_latency + b / ic.link_bandwidth
                             : ic.net_hop_latency + b / ic.nic_bandwidth;
  const char* name = same_node ? "copy_peer" : "copy_net";
  const VTime end = vtime_add(start, to_vtime(s));
  record(d, name, PricedUnit::interconnect, 0, b, end - start);
  finish(stream, d, start, end, name, "comm", &pd.comm);
}

void CostModel::on_collective(SimStream& stream, const char* name, VTime start,
                              const CollectiveEstimate& estimate, double bytes) {
  const int d = stream.device_index();
  const VTime end = vtime_add(start, to_vtime(estimate.seconds));
  record(d, name, PricedUnit::interconnect, 0, bytes, end - start);
  finish(stream, d, start, end, name, "comm", &devices_[static_cast<std::size_t>(d)]->comm);
}

void CostModel::on_memory(SimStream& stream, std::int64_t delta_bytes) {
  const int d = stream.device_index();
  const std::int64_t now =
      devices_[static_cast<std::size_t>(d)]->mem.fetch_add(delta_bytes) + delta_bytes;
  if (tracing()) trace_->add({d, 0, "memory", "memory", stream.virtual_now, 0, true, now});
}

CostTotals CostModel::totals() const {
  CostTotals t;
  for (const auto& p : devices_) {
    t.end.push_back(p->end.load());
    t.compute.push_back(p->compute.load());
    t.comm.push_back(p->comm.load());
    t.host_copy.push_back(p->host_copy.load());
    t.now = std::max(t.now, t.end.back());
  }
  t.gemm_flops = gemm_flops_.load();
  return t;
}

}  // namespace ditto::sim
