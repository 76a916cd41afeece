// Backend registry and per-thread current streams.
#include "core/runtime/backend.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/base/error.h"
#include "core/numerics/gpt_math.h"
#include "core/runtime/backend_init.h"

namespace ditto {

// Default transformer kernels: a backend that does not implement one says so.
namespace {
[[noreturn]] void no_kernel(const char* name) {
  throw InvalidArgument(std::string("Kernels::") + name + ": this backend has no kernel " + name);
}
}  // namespace

bool Kernels::has_gemm_ex(DType, DType, DType, Determinism) const { return false; }
void Kernels::gemm_ex(Stream&, const GemmExArgs&) { no_kernel("gemm_ex"); }
bool Kernels::has_gemm_gelu_epilogue(DType, Determinism) const { return false; }
bool Kernels::has_gemm_tn_sharded_ex(DType, DType, DType) const { return false; }
void Kernels::gemm_tn_sharded_ex(Stream&, std::int64_t, std::int64_t, const void*, DType,
                                 std::int64_t, const void*, DType, std::int64_t,
                                 const std::vector<std::int64_t>&, void*, DType, std::int64_t,
                                 bool) {
  no_kernel("gemm_tn_sharded_ex");
}

void Kernels::embedding_forward(Stream&, const std::int64_t*, const float*, const float*,
                                std::int64_t, std::int64_t, std::int64_t, float*) {
  no_kernel("embedding_forward");
}
void Kernels::embedding_backward(Stream&, const std::int64_t*, const float*, std::int64_t,
                                 std::int64_t, std::int64_t, const std::vector<std::int64_t>&,
                                 float*, bool) {
  no_kernel("embedding_backward");
}
void Kernels::layernorm_forward(Stream&, const float*, const float*, const float*, std::int64_t,
                                std::int64_t, float, float*, float*, float*) {
  no_kernel("layernorm_forward");
}
void Kernels::layernorm_backward(Stream&, const float*, const float*, const float*, const float*,
                                 const float*, std::int64_t, std::int64_t, float*, float*) {
  no_kernel("layernorm_backward");
}
void Kernels::gelu_forward(Stream&, const float*, float*, std::int64_t) {
  no_kernel("gelu_forward");
}
void Kernels::gelu_backward(Stream&, const float*, const float*, float*, std::int64_t) {
  no_kernel("gelu_backward");
}
void Kernels::attention_forward(Stream&, const float*, std::int64_t, std::int64_t, std::int64_t,
                                std::int64_t, float*, float*, float, std::uint64_t, std::uint64_t,
                                std::uint64_t, Determinism) {
  no_kernel("attention_forward");
}
void Kernels::attention_backward(Stream&, const float*, const float*, const float*, const float*,
                                 std::int64_t, std::int64_t, std::int64_t, std::int64_t, float*,
                                 float*, float, std::uint64_t, std::uint64_t, std::uint64_t,
                                 Determinism) {
  no_kernel("attention_backward");
}
bool Kernels::has_attention_ex(DType, std::int64_t, Determinism) const { return false; }
void Kernels::attention_forward_ex(Stream&, const void*, DType, std::int64_t, std::int64_t,
                                   std::int64_t, std::int64_t, void*, float*, float, std::uint64_t,
                                   std::uint64_t, std::uint64_t, Determinism) {
  no_kernel("attention_forward_ex");
}
void Kernels::attention_backward_ex(Stream&, const void*, const void*, const void*, DType,
                                    const float*, std::int64_t, std::int64_t, std::int64_t,
                                    std::int64_t, void*, float*, float, std::uint64_t,
                                    std::uint64_t, std::uint64_t, Determinism) {
  no_kernel("attention_backward_ex");
}
void Kernels::dropout_forward(Stream&, const float*, float*, std::int64_t, float, std::uint64_t,
                              std::uint64_t, std::uint64_t) {
  no_kernel("dropout_forward");
}
void Kernels::dropout_backward(Stream&, const float*, float*, std::int64_t, float, std::uint64_t,
                               std::uint64_t, std::uint64_t) {
  no_kernel("dropout_backward");
}
void Kernels::sum_squares(Stream&, const float*, std::int64_t, float*, Determinism) {
  no_kernel("sum_squares");
}
void Kernels::sum_squares_blocks(Stream& s, const float* x, std::int64_t n, float* out) {
  for (std::int64_t j = 0, lo = 0; lo < n; ++j, lo += gpt::kSquaresBlock)
    sum_squares(s, x + lo, std::min(gpt::kSquaresBlock, n - lo), out + j, Determinism::bitwise);
}
bool Kernels::has_sum_rows_ex(DType, DType, Determinism) const { return false; }
void Kernels::sum_rows_ex(Stream&, const void*, DType, std::int64_t, std::int64_t, float, void*,
                          DType, Determinism) {
  no_kernel("sum_rows_ex");
}
void Kernels::sum_rows_sharded_ex(Stream&, const void*, DType, std::int64_t, std::int64_t,
                                  const std::vector<std::int64_t>&, void*, DType, bool) {
  no_kernel("sum_rows_sharded_ex");
}
bool Kernels::has_rows_ex(DType, Determinism) const { return false; }
void Kernels::embedding_forward_ex(Stream&, DType, const std::int64_t*, const void*, const void*,
                                   std::int64_t, std::int64_t, std::int64_t, void*) {
  no_kernel("embedding_forward_ex");
}
void Kernels::embedding_backward_ex(Stream&, DType, const std::int64_t*, const void*, std::int64_t,
                                    std::int64_t, std::int64_t, const std::vector<std::int64_t>&,
                                    DType, void*, bool) {
  no_kernel("embedding_backward_ex");
}
void Kernels::layernorm_forward_ex(Stream&, DType, const void*, const void*, const void*,
                                   std::int64_t, std::int64_t, float, void*, float*, float*) {
  no_kernel("layernorm_forward_ex");
}
void Kernels::layernorm_backward_ex(Stream&, DType, const void*, const void*, const void*,
                                    const float*, const float*, std::int64_t, std::int64_t, void*,
                                    void*) {
  no_kernel("layernorm_backward_ex");
}
bool Kernels::has_layernorm_forward_add(DType) const { return false; }
void Kernels::layernorm_forward_add(Stream&, DType, const void*, const void*, const void*,
                                    const void*, std::int64_t, std::int64_t, float, void*, void*,
                                    float*, float*) {
  no_kernel("layernorm_forward_add");
}
bool Kernels::has_layernorm_backward_add(DType) const { return false; }
void Kernels::layernorm_backward_add(Stream&, DType, const void*, const void*, const void*,
                                     const float*, const float*, const void*, std::int64_t,
                                     std::int64_t, void*, void*) {
  no_kernel("layernorm_backward_add");
}
bool Kernels::has_layernorm_backward_params(DType, Determinism) const { return false; }
void Kernels::layernorm_backward_params(Stream&, DType, const void*, const void*, const void*,
                                        const float*, const float*, const void*, std::int64_t,
                                        std::int64_t, void*, DType, void*, bool, void*, bool) {
  no_kernel("layernorm_backward_params");
}
bool Kernels::has_cross_entropy_fused(DType, Determinism) const { return false; }
void Kernels::cross_entropy_fused(Stream&, DType, void*, const std::int64_t*, std::int64_t,
                                  std::int64_t, const float*, float, float*) {
  no_kernel("cross_entropy_fused");
}
void Kernels::gelu_forward_ex(Stream&, DType, const void*, void*, std::int64_t) {
  no_kernel("gelu_forward_ex");
}
void Kernels::gelu_backward_ex(Stream&, DType, const void*, const void*, void*, std::int64_t) {
  no_kernel("gelu_backward_ex");
}
void Kernels::cross_entropy_ex(Stream&, DType, const void*, const std::int64_t*, std::int64_t,
                               std::int64_t, float*) {
  no_kernel("cross_entropy_ex");
}
void Kernels::cross_entropy_backward_ex(Stream&, DType, const void*, const std::int64_t*,
                                        std::int64_t, std::int64_t, const float*, float, void*) {
  no_kernel("cross_entropy_backward_ex");
}
void Kernels::dropout_forward_ex(Stream&, DType, const void*, void*, std::int64_t, float,
                                 std::uint64_t, std::uint64_t, std::uint64_t) {
  no_kernel("dropout_forward_ex");
}
void Kernels::dropout_backward_ex(Stream&, DType, const void*, void*, std::int64_t, float,
                                  std::uint64_t, std::uint64_t, std::uint64_t) {
  no_kernel("dropout_backward_ex");
}

void Kernels::cast(Stream&, const void*, DType, void*, DType, std::int64_t) { no_kernel("cast"); }
void Kernels::fill_bits(Stream&, void*, std::size_t, std::uint64_t, std::int64_t) {
  no_kernel("fill_bits");
}
void Kernels::add_any(Stream&, DType, const void*, const void*, void*, std::int64_t) {
  no_kernel("add_any");
}
void Kernels::scale_any(Stream&, DType, void*, double, std::int64_t) { no_kernel("scale_any"); }
void Kernels::reduce_inputs(Stream&, DType, const void* const*, int, void*, std::int64_t, int,
                            Determinism) {
  no_kernel("reduce_inputs");
}

// Multi-tensor defaults: the per-tensor kernels in list order (the bits the fused ones match).
void Kernels::adam_step_multi(Stream& s, const std::vector<AdamTensor>& tensors, double lr,
                              double beta1, double beta2, double eps, double weight_decay,
                              bool amsgrad) {
  for (const AdamTensor& t : tensors) {
    if (t.n <= 0) continue;
    if (t.decay) scale(s, t.decay_scale, t.param, t.n);
    adam_step(s, t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.max_exp_avg_sq, t.n, lr, beta1, beta2,
              eps, weight_decay, t.bias_correction1, t.bias_correction2, amsgrad);
  }
}
void Kernels::sum_squares_multi(Stream& s, const std::vector<const float*>& xs,
                                const std::vector<std::int64_t>& ns, float* out, Determinism mode) {
  for (std::size_t i = 0; i < xs.size(); ++i) sum_squares(s, xs[i], ns[i], out + i, mode);
}
void Kernels::scale_multi(Stream& s, const std::vector<float*>& xs,
                          const std::vector<std::int64_t>& ns, float alpha) {
  for (std::size_t i = 0; i < xs.size(); ++i)
    if (ns[i] > 0) scale(s, alpha, xs[i], ns[i]);
}
void Kernels::fill_multi(Stream& s, const std::vector<float*>& xs,
                         const std::vector<std::int64_t>& ns, float value) {
  for (std::size_t i = 0; i < xs.size(); ++i)
    if (ns[i] > 0) fill_f32(s, xs[i], value, ns[i]);
}
void Kernels::copy_multi(Stream& s, DType from, DType to, const std::vector<const void*>& srcs,
                         const std::vector<void*>& dsts, const std::vector<std::int64_t>& ns) {
  for (std::size_t i = 0; i < srcs.size(); ++i)
    if (ns[i] > 0) cast(s, srcs[i], from, dsts[i], to, ns[i]);
}
bool Kernels::has_multi_tensor_ex(DType) const { return false; }
void Kernels::adam_step_multi_ex(Stream&, const std::vector<AdamTensorEx>&, double, double, double,
                                 double, double, bool, bool, float) {
  no_kernel("adam_step_multi_ex");
}
void Kernels::sum_squares_multi_ex(Stream&, const std::vector<const void*>&,
                                   const std::vector<DType>&, const std::vector<std::int64_t>&,
                                   float*, Determinism) {
  no_kernel("sum_squares_multi_ex");
}

namespace {

struct Registry {
  std::mutex mu;
  std::vector<std::pair<std::string, BackendFactory>> factories;
  std::map<std::string, detail::ProcessCommunicatorFactory> process_factories;
  std::map<std::string, std::shared_ptr<Backend>> instances;
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry();  // never destroyed: backends may be used from static dtors
    detail::register_builtin_backends(
        [reg](const std::string& n, BackendFactory f, detail::ProcessCommunicatorFactory pf) {
          reg->factories.emplace_back(n, std::move(f));
          if (pf) reg->process_factories[n] = std::move(pf);
        });
    return reg;
  }();
  return *r;
}

// Note [Backend lookup cache]
// Every device operation looks its backend up by name (Device::backend()). Through the registry
// that is a global mutex, a map lookup and a shared_ptr copy (two atomic updates of one shared
// counter), which the replica threads of a DataParallel step and the simulator's stream workers
// contend on. get_backend() (the reference form) first looks in a small per-thread cache of
// (name, instance) valid for one registry generation; the generation changes whenever an
// instance is created or replaced, so a stale entry is never used. The reference it returns is
// as valid as before (the registry still holds the instance until init_backend replaces it).
std::atomic<std::uint64_t> g_generation{1};

struct CachedBackend {
  std::uint64_t generation = 0;
  std::string name;
  Backend* backend = nullptr;
};
thread_local std::array<CachedBackend, 4> t_backend_cache;
thread_local std::size_t t_backend_cache_next = 0;

BackendFactory* find_factory(Registry& r, const std::string& name) {
  for (auto& [n, f] : r.factories)
    if (n == name) return &f;
  return nullptr;
}

std::string known_names(Registry& r) {
  std::string s;
  for (auto& [n, f] : r.factories) s += (s.empty() ? "" : ", ") + n;
  return s + ", auto";
}

}  // namespace

std::uint64_t detail::backend_generation() noexcept {
  return g_generation.load(std::memory_order_acquire);
}

void register_backend(const std::string& name, BackendFactory factory) {
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  for (auto& [n, f] : r.factories)
    if (n == name) {
      f = std::move(factory);
      return;
    }
  r.factories.emplace_back(name, std::move(factory));
}

detail::ProcessCommunicatorFactory detail::process_communicator_factory(const std::string& name) {
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  DITTO_CHECK(find_factory(r, name) != nullptr,
              "process_communicator_factory: name: expected one of ", known_names(r), ", got '",
              name, "'");
  auto it = r.process_factories.find(name);
  return it == r.process_factories.end() ? detail::ProcessCommunicatorFactory{} : it->second;
}

std::vector<std::string> registered_backends() {
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  std::vector<std::string> names;
  for (auto& [n, f] : r.factories) names.push_back(n);
  return names;
}

std::string resolve_backend_name(const std::string& name, std::string* reason) {
  if (name != "auto") return name;
  Registry& r = registry();
  BackendFactory* cuda = nullptr;
  {
    std::lock_guard lk(r.mu);
    cuda = find_factory(r, "cuda");
    if (!cuda) {
      if (reason) *reason = "ditto was built without the CUDA backend";
      return "sim";
    }
  }
  try {
    get_backend("cuda");
    return "cuda";
  } catch (const Error& e) {
    if (reason) *reason = e.what();
    return "sim";
  }
}

bool is_dry_run(const Device& device) { return !device.is_cpu() && device.backend().dry_run(); }

Backend& init_backend(const std::string& name_in, const BackendOptions& options) {
  std::string name = resolve_backend_name(name_in);
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  BackendFactory* f = find_factory(r, name);
  DITTO_CHECK(f, "init_backend: unknown backend '", name, "' (known: ", known_names(r), ")");
  auto inst = (*f)(options);
  DITTO_ASSERT(inst);
  DITTO_CHECK(!options.dry_run || inst->dry_run(),
              "init_backend: BackendOptions::dry_run: "
              "expected a backend that runs dry (sim), got '",
              name, "'");
  r.instances[name] = inst;
  g_generation.fetch_add(1, std::memory_order_acq_rel);  // Note [Backend lookup cache]
  return *inst;
}

std::shared_ptr<Backend> get_backend_ptr(const std::string& name_in) {
  std::string name = name_in == "auto" ? resolve_backend_name(name_in) : name_in;
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  auto it = r.instances.find(name);
  if (it != r.instances.end()) return it->second;
  BackendFactory* f = find_factory(r, name);
  DITTO_CHECK(f, "get_backend: unknown backend '", name, "' (known: ", known_names(r), ")");
  auto inst = (*f)(BackendOptions{});
  DITTO_ASSERT(inst);
  r.instances[name] = inst;
  g_generation.fetch_add(1, std::memory_order_acq_rel);  // Note [Backend lookup cache]
  return inst;
}

Backend& get_backend(const std::string& name) {
  if (name == "auto") return *get_backend_ptr(name);
  const std::uint64_t gen = g_generation.load(std::memory_order_acquire);
  for (const CachedBackend& c : t_backend_cache)
    if (c.generation == gen && c.name == name) return *c.backend;
  std::shared_ptr<Backend> b = get_backend_ptr(name);
  CachedBackend& slot = t_backend_cache[t_backend_cache_next++ % t_backend_cache.size()];
  slot.generation = gen;  // read before the lookup: an instance made since has a newer one
  slot.name = name;
  slot.backend = b.get();
  return *b;
}

std::vector<Device> devices(const std::string& backend, int n) {
  Backend& b = get_backend(backend);
  DITTO_CHECK(n >= 1 && n <= b.device_count(), "devices: expected a count in [1, ",
              b.device_count(), "] for backend ", b.name(), ", got ", n);
  std::vector<Device> out;
  for (int i = 0; i < n; ++i) out.emplace_back(b.name(), i);
  return out;
}

// ---- current streams -------------------------------------------------------------------------

namespace {
thread_local std::unordered_map<Device, Stream*>* t_current = nullptr;
}

Stream& current_stream(const Device& device) {
  if (t_current) {
    auto it = t_current->find(device);
    if (it != t_current->end() && it->second) return *it->second;
  }
  return device.backend().default_stream(device.index);
}

StreamGuard::StreamGuard(Stream& stream) : device_(stream.device()) {
  if (!t_current) t_current = new std::unordered_map<Device, Stream*>();  // per thread, tiny
  auto it = t_current->find(device_);
  previous_ = it == t_current->end() ? nullptr : it->second;
  (*t_current)[device_] = &stream;
}

StreamGuard::~StreamGuard() {
  if (previous_) {
    (*t_current)[device_] = previous_;
    return;
  }
  // The outermost guard of this device on this thread: drop the entry, and the map with the last
  // one, so a thread that ends (a DDP rank's) leaves nothing behind.
  t_current->erase(device_);
  if (t_current->empty()) {
    delete t_current;
    t_current = nullptr;
  }
}

}  // namespace ditto
