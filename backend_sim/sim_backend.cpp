#include "backend_sim/sim_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "backend_sim/sim_dry_arena.h"
#include "backend_sim/sim_executor.h"
#include "backend_sim/sim_extensions.h"
#include "core/backend_api/asan.h"
#include "core/base/error.h"
#include "core/runtime/mixed_precision.h"

namespace ditto {

std::shared_ptr<Backend> make_sim_backend(const BackendOptions& options) {
  return std::make_shared<sim::SimBackend>(options);
}

namespace sim {

namespace {
constexpr int kMaxDevices = 65536;
constexpr int kDefaultDevices = 8;
// Note [Block cache] (sim_backend.h).
constexpr std::size_t kCacheMaxBlock = std::size_t(1) << 20;
constexpr std::size_t kCacheMaxBytes = std::size_t(32) << 20;

/// Bytes of the host block (or, dry, the address range) behind an allocation of `bytes`: a whole
/// number of 64-byte lines, at least one.
std::size_t host_block_bytes(std::size_t bytes) { return bytes == 0 ? 64 : (bytes + 63) / 64 * 64; }

bool cache_from_env() {
  const char* env = std::getenv("DITTO_SIM_CACHE");
  return !(env && std::string_view(env) == "0");
}

std::string bytes_str(std::size_t b) {
  std::ostringstream os;
  os << b << " bytes";
  if (b >= (1u << 20)) os << " (" << std::fixed << std::setprecision(2) << b / 1048576.0 << " MiB)";
  return os.str();
}

/// A host allocation behind a simulated device failed (tester 6, F11): the simulated devices'
/// memory is this machine's RAM, which a model sized for GPUs can exceed; a dry run holds none.
std::string host_oom(int index, std::size_t bytes, std::size_t held, std::size_t devices,
                     const char* what) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  const std::size_t ram = pages > 0 && page > 0 ? std::size_t(pages) * std::size_t(page) : 0;
  return detail::cat("sim:", index, ": host out of memory allocating ", bytes_str(bytes), what,
                     ": the simulated devices' memory lives in this machine's RAM (the simulator "
                     "holds ",
                     bytes_str(held), " across its ", devices,
                     devices == 1 ? " device" : " devices", "; this machine has ", bytes_str(ram),
                     ", less under a ulimit): --dry-run predicts a model larger than the machine "
                     "without holding its tensors");
}
}  // namespace

SimStream& as_sim(Stream& s, const char* call) {
  auto* p = dynamic_cast<SimStream*>(&s);
  DITTO_CHECK(p, call, ": stream of device ", s.device().str(), " is not a sim stream");
  return *p;
}

SimBackend::SimBackend(const BackendOptions& options) {
  const int count =
      options.device_count.value_or(options.one_rank_per_process ? 1 : kDefaultDevices);
  DITTO_CHECK(count >= 1 && count <= kMaxDevices, "sim backend: device_count: expected 1..",
              kMaxDevices, ", got ", count);
  DITTO_CHECK(options.memory_capacity > 0, "sim backend: memory_capacity must be positive");
  // Note [Dry addresses] (sim_dry_arena.h): the devices' capacities must fit in the span their
  // addresses come from; each first reserves twice its capacity, or its share of the span.
  DITTO_CHECK(!options.dry_run || options.memory_capacity <= DryArena::kAddressSpace / count,
              "sim backend: dry run: device_count x memory_capacity: expected at most ",
              bytes_str(DryArena::kAddressSpace),
              " in all (the span of addresses a dry run's devices share), got ", count, " x ",
              bytes_str(options.memory_capacity));
  if (options.dry_run)
    dry_reserve_ = std::min(2 * options.memory_capacity + (std::size_t(1) << 20),
                            DryArena::kAddressSpace / count);
  (void)Executor::configured_threads();  // says now, once, if DITTO_SIM_THREADS is not used
  devices_.reserve(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) {
    auto d = std::make_unique<VirtualDevice>();
    d->stream = std::make_unique<SimStream>(Device("sim", i), d->health);
    d->capacity = options.memory_capacity;
    if (options.dry_run) d->arena = std::make_unique<DryArena>();
    devices_.push_back(std::move(d));
    next_track_.push_back(std::make_unique<std::atomic<int>>(1));
  }
  ClusterSpec cluster{device_profile("h100-sxm"), interconnect_profile("nvlink"), 1, count};
  cost_ = std::make_shared<CostModel>(count, cluster);
  dry_run_ = options.dry_run;
  cache_enabled_ = !dry_run_ && cache_from_env();
  cost_->set_dry_run(dry_run_);
  cost_->set_allow_tf32(options.allow_tf32);  // Note [Compute units] (cost_model.h)
  kernels_ = make_sim_kernels(cost_);
  cost_extension_ = make_cost_model_extension(*cost_);
  fault_extension_ = make_fault_extension(*this);
}

void* SimBackend::extension(std::string_view name) {
  if (name == CostModelExtension::kExtensionName) return cost_extension_.get();
  if (name == FaultExtension::kExtensionName) return fault_extension_.get();
  if (name == kExtensionName) return this;
  return nullptr;
}

SimBackend::~SimBackend() {
  for (auto& d : devices_) d->stream.reset();  // let every queue drain first
  for (auto& d : devices_) cache_clear(*d);
}

void* SimBackend::cache_take(VirtualDevice& d, std::size_t rounded) {
  std::lock_guard lk(d.cache_mu);
  auto it = d.cache.find(rounded);
  if (it == d.cache.end() || it->second.empty()) return nullptr;
  void* p = it->second.back();
  it->second.pop_back();
  d.cached_bytes -= rounded;
#if DITTO_ASAN
  ASAN_UNPOISON_MEMORY_REGION(p, rounded);
#endif
  return p;
}

bool SimBackend::cache_put(VirtualDevice& d, void* p, std::size_t rounded) {
  std::lock_guard lk(d.cache_mu);
  if (d.cached_bytes + rounded > kCacheMaxBytes) return false;
  d.cache[rounded].push_back(p);
  d.cached_bytes += rounded;
#if DITTO_ASAN
  ASAN_POISON_MEMORY_REGION(p, rounded);
#endif
  return true;
}

void SimBackend::cache_clear(VirtualDevice& d) {
  std::vector<void*> blocks;
  {
    std::lock_guard lk(d.cache_mu);
    for (auto& [rounded, v] : d.cache)
      for (void* p : v) {
#if DITTO_ASAN
        ASAN_UNPOISON_MEMORY_REGION(p, rounded);
#endif
        blocks.push_back(p);
      }
    d.cache.clear();
    d.cached_bytes = 0;
  }
  if (blocks.empty()) return;
  {
    std::lock_guard lk(owners_mu_);
    for (void* p : blocks) owners_.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  for (void* p : blocks) std::free(p);
}

DeviceProperties SimBackend::properties(int index) const {
  return {"simulated GPU", devices_[index]->capacity};
}

MemoryStats SimBackend::memory_stats(int index) const {
  const auto& d = *devices_[index];
  return {d.in_use.load(), d.peak.load(), d.capacity};
}

std::size_t SimBackend::dry_reserved_bytes(int index) const {
  const auto& a = devices_[static_cast<std::size_t>(index)]->arena;
  return a ? a->reserved() : 0;
}

void SimBackend::reset_peak_memory(int index) {
  auto& d = *devices_[index];
  d.peak.store(d.in_use.load());
}

void* SimBackend::allocate(int index, std::size_t bytes) {
  auto& d = *devices_[index];
  const auto held_bytes = [&] {  // every device's charged bytes
    std::size_t held = 0;
    for (const auto& dev : devices_) held += dev->in_use.load();
    return held;
  };
  if (d.health->failed.load()) throw BackendError(d.health->failure());
  // Note [Mixed precision]: the f32 scratch of an op over bf16 / f16 tensors (allocated inside
  // its StorageDTypeScope or ConversionScope) holds host memory for the data but is charged to
  // nothing: a native bf16 kernel would not hold it. A dry run charges it, as the CUDA backend
  // holds it (Note [Predicted launches], cost_model.h).
  if (!dry_run_ && (in_conversion_scope() || current_storage_dtype() != DType::f32)) {
    void* p = std::aligned_alloc(64, host_block_bytes(bytes));
    if (!p)
      throw OutOfMemory(host_oom(index, bytes, held_bytes(), devices_.size(),
                                 " (f32 scratch of a bf16 / f16 op)"),
                        OutOfMemory::Kind::host);
    std::lock_guard lk(owners_mu_);
    owners_[reinterpret_cast<std::uintptr_t>(p)] = {bytes, index};
    uncharged_.insert(reinterpret_cast<std::uintptr_t>(p));
    uncharged_live_.fetch_add(1);
    return p;
  }
  const std::int64_t ordinal = d.allocations.fetch_add(1);
  if (alloc_faults_.load(std::memory_order_acquire)) {
    std::lock_guard lk(faults_mu_);
    const auto& faults = faults_->config.faults;
    for (std::size_t i = 0; i < faults.size(); ++i) {
      const Fault& f = faults[i];
      if (f.kind != Fault::Kind::fail_alloc || f.device != index || f.after != ordinal) continue;
      faults_->fired[i].store(true);
      throw OutOfMemory(
          detail::cat("sim:", index, ": out of memory: tried to allocate ", bytes_str(bytes), "; ",
                      bytes_str(d.in_use.load()), " in use of capacity ", bytes_str(d.capacity),
                      " (injected fault ", f.spec, ": allocation #", ordinal + 1,
                      " on this device fails)"),
          OutOfMemory::Kind::device);
    }
  }
  std::size_t cur = d.in_use.load();
  for (;;) {
    if (bytes > d.capacity || cur > d.capacity - bytes)
      throw OutOfMemory(
          detail::cat("sim:", index, ": out of memory: tried to allocate ", bytes_str(bytes), "; ",
                      bytes_str(cur), " in use of capacity ", bytes_str(d.capacity), " (peak ",
                      bytes_str(d.peak.load()), ")"),
          OutOfMemory::Kind::device);
    if (d.in_use.compare_exchange_weak(cur, cur + bytes)) break;
  }
  std::size_t now = cur + bytes, old = d.peak.load();
  while (now > old && !d.peak.compare_exchange_weak(old, now)) {
  }
  void* p = nullptr;
  bool from_cache = false;
  if (dry_run_) {
    // Twice the capacity (or the device's share of the span, at least its capacity): live
    // allocations never exceed the capacity, so first fit always finds room short of
    // pathological fragmentation (Note [Dry run], Note [Dry addresses]).
    p = d.arena->allocate(bytes, dry_reserve_);
    if (!p) {
      d.in_use.fetch_sub(bytes);
      throw OutOfMemory(
          detail::cat(
              "sim:", index, ": dry run: no free address range of ", bytes_str(bytes),
              " left in the ", bytes_str(DryArena::kAddressSpace),
              " of addresses all dry-run devices of the process share (Note [Dry addresses]; ",
              bytes_str(d.arena->reserved()), " reserved by this device, ", bytes_str(cur),
              " in use of capacity ", bytes_str(d.capacity), ")"),
          OutOfMemory::Kind::device);
    }
  } else {
    const std::size_t rounded = host_block_bytes(bytes);
    if (cache_enabled_ && rounded <= kCacheMaxBlock) p = cache_take(d, rounded);
    from_cache = p != nullptr;  // a cached block is still in owners_ (Note [Block cache])
    if (!p) p = std::aligned_alloc(64, rounded);
    if (!p) {  // give the device's cached blocks back to the host and try once more
      cache_clear(d);
      p = std::aligned_alloc(64, rounded);
    }
    if (!p) {
      d.in_use.fetch_sub(bytes);
      throw OutOfMemory(host_oom(index, bytes, held_bytes(), devices_.size(), ""),
                        OutOfMemory::Kind::host);
    }
  }
  if (!from_cache) {
    // The rounded size for a host block: a cached block may come back for any size that rounds
    // to the same (owner_of then still covers the whole request).
    std::lock_guard lk(owners_mu_);
    owners_[reinterpret_cast<std::uintptr_t>(p)] = {dry_run_ ? bytes : host_block_bytes(bytes),
                                                    index};
  }
  if (cost_->tracing()) {  // stream-ordered memory counter of the trace
    CostModel* cm = cost_.get();
    SimStream* s = d.stream.get();
    s->enqueue_internal([cm, s, bytes] { cm->on_memory(*s, static_cast<std::int64_t>(bytes)); });
  }
  return p;
}

int SimBackend::owner_of(const void* p) const {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lk(owners_mu_);
  auto it = owners_.upper_bound(a);
  if (it == owners_.begin()) return -1;
  --it;
  return a < it->first + std::max<std::size_t>(it->second.first, 1) ? it->second.second : -1;
}

void SimBackend::deallocate(int index, void* ptr, std::size_t bytes) noexcept {
  auto* d = devices_[index].get();
  auto forget = [this, ptr] {
    std::lock_guard lk(owners_mu_);
    owners_.erase(reinterpret_cast<std::uintptr_t>(ptr));
  };
  bool uncharged = false;
  if (uncharged_live_.load() > 0) {
    // An uncharged allocation (marked by allocate) gives back nothing; its address stays owned
    // until the free below runs, so no other allocation can take it before.
    std::lock_guard lk(owners_mu_);
    uncharged = uncharged_.erase(reinterpret_cast<std::uintptr_t>(ptr)) > 0;
    if (uncharged) uncharged_live_.fetch_sub(1);
  }
  CostModel* cm = cost_->tracing() && !uncharged ? cost_.get() : nullptr;
  // The device's counters drop now, in host order (Note [Memory accounting], sim_backend.h);
  // the host memory is released in stream order, after the work that may still use it.
  if (!uncharged) d->in_use.fetch_sub(bytes);
  const bool dry = dry_run_;
  const std::size_t rounded = host_block_bytes(bytes);
  const bool cacheable = cache_enabled_ && !uncharged && rounded <= kCacheMaxBlock;
  auto release = [d, ptr, bytes, dry] {
    if (dry)  // Note [Dry run]: never touched (a dry run charges every allocation)
      d->arena->deallocate(ptr, bytes);
    else
      std::free(ptr);
  };
  try {
    // The stream by pointer: while ~SimBackend drains it, d->stream is already null.
    SimStream* s = d->stream.get();
    s->enqueue_internal_short([this, d, ptr, rounded, cacheable, s, bytes, forget, release,
                               cm] {  // frees even on a failed device
      if (!cacheable || !cache_put(*d, ptr, rounded)) {
        forget();  // before free: the address may be handed out again right after
        release();
      }
      if (cm) cm->on_memory(*s, -static_cast<std::int64_t>(bytes));
    });
  } catch (...) {  // could not enqueue (out of host memory): free now
    forget();
    release();
  }
}

std::unique_ptr<Stream> SimBackend::create_stream(int index) {
  auto s = std::make_unique<SimStream>(Device("sim", index), devices_[index]->health);
  s->track = next_track_[static_cast<std::size_t>(index)]->fetch_add(1);
  return s;
}

std::unique_ptr<Event> SimBackend::create_event(int) { return std::make_unique<SimEvent>(); }

void SimBackend::copy_from_host(Stream& s, void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  SimStream& ss = as_sim(s, "copy_from_host");
  ss.run_sync([=, &ss, cm = cost_, dry = dry_run_] {
    if (!dry) std::memcpy(dst, src, bytes);  // dry: nothing to write to (Note [Dry run])
    cm->on_host_copy(ss, "copy_h2d", bytes);
  });
}

void SimBackend::copy_to_host(Stream& s, void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  SimStream& ss = as_sim(s, "copy_to_host");
  ss.run_sync([=, &ss, cm = cost_, dry = dry_run_] {
    if (dry)
      std::memset(dst, 0, bytes);  // a dry device reads as zeros (Note [Dry run])
    else
      std::memcpy(dst, src, bytes);
    cm->on_host_copy(ss, "copy_d2h", bytes);
  });
}

namespace {
constexpr std::size_t kInlineCopyBytes = std::size_t(256) << 10;
}  // namespace

void SimBackend::copy_2d(Stream& s, void* dst, std::size_t dst_pitch, const void* src,
                         std::size_t src_pitch, std::size_t row_bytes, std::size_t rows) {
  if (rows == 0 || row_bytes == 0) return;
  SimStream& ss = as_sim(s, "copy_2d");
  const int src_device = owner_of(src);
  auto task = [=, &ss, cm = cost_, dry = dry_run_] {
    if (dry) {  // priced, not run (Note [Dry run])
      cm->on_device_copy(ss, src_device, rows * row_bytes);
      return;
    }
    auto* dp = static_cast<char*>(dst);
    auto* sp = static_cast<const char*>(src);
    if (dst_pitch == row_bytes && src_pitch == row_bytes) {
      std::memmove(dp, sp, rows * row_bytes);
    } else {
      for (std::size_t r = 0; r < rows; ++r)
        std::memmove(dp + r * dst_pitch, sp + r * src_pitch, row_bytes);
    }
    cm->on_device_copy(ss, src_device, rows * row_bytes);
  };
  // A small copy may run on this thread at once (Note [Inline work], sim_stream.cpp), as a
  // small kernel does: DDP packs each gradient into its bucket with one.
  if (rows * row_bytes <= kInlineCopyBytes)
    ss.enqueue_short(std::move(task));
  else
    ss.enqueue(std::move(task));
}

std::shared_ptr<CommunicatorImpl> SimBackend::create_communicator(const std::vector<int>& devices,
                                                                  const CommOptions& options) {
  std::lock_guard lk(faults_mu_);
  return make_sim_communicator(devices, options, cost_, faults_);
}

void SimBackend::begin_step(std::int64_t step) {
  std::lock_guard lk(faults_mu_);
  const auto& faults = faults_->config.faults;
  for (std::size_t i = 0; i < faults.size(); ++i) {
    const Fault& f = faults[i];
    if (f.kind != Fault::Kind::fail_device || f.step > step) continue;
    faults_->fired[i].store(true);
    devices_[static_cast<std::size_t>(f.device)]->health->fail(detail::cat(
        "sim:", f.device, ": device failed (injected fault ", f.spec, ", at step ", step, ")"));
  }
}

std::vector<std::string> SimBackend::unfired_faults() const {
  std::lock_guard lk(faults_mu_);
  std::vector<std::string> out;
  for (std::size_t i = 0; i < faults_->config.faults.size(); ++i)
    if (!faults_->fired[i].load()) out.push_back(faults_->config.faults[i].spec);
  return out;
}

void SimBackend::set_faults(const FaultConfig& faults) {
  for (const Fault& f : faults.faults)
    DITTO_CHECK(
        f.kind == Fault::Kind::skip_collective || (f.device >= 0 && f.device < device_count()),
        "SimBackend::set_faults: fault '", f.spec, "': device ", f.device,
        " out of range: expected 0..", device_count() - 1);
  // A communicator's ranks are distinct devices: a larger rank is in no communicator, never fires.
  for (const Fault& f : faults.faults)
    DITTO_CHECK(f.kind != Fault::Kind::skip_collective || (f.rank >= 0 && f.rank < device_count()),
                "SimBackend::set_faults: fault '", f.spec, "': rank ", f.rank,
                " out of range: expected 0..", device_count() - 1,
                " (a communicator has at most one rank per device)");
  DITTO_CHECK(!faults.comm_timeout_ms ||
                  (*faults.comm_timeout_ms > 0 && *faults.comm_timeout_ms <= kMaxCommTimeoutMs),
              "SimBackend::set_faults: comm_timeout_ms: expected a positive number of ms <= ",
              kMaxCommTimeoutMs, " (2^31, about 24.9 days), got ",
              faults.comm_timeout_ms.value_or(0));
  std::lock_guard lk(faults_mu_);
  faults_ = std::make_shared<FaultState>(faults);
  alloc_faults_.store(std::any_of(faults.faults.begin(), faults.faults.end(),
                                  [](const Fault& f) { return f.kind == Fault::Kind::fail_alloc; }),
                      std::memory_order_release);
  for (auto& d : devices_) {
    d->health->reset();
    d->allocations.store(0);
  }
}

}  // namespace sim
}  // namespace ditto
