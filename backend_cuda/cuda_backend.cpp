// CudaBackend (cuda_backend.h): logical devices over the visible GPUs, stream-ordered memory with
// capacity and peak accounting, host<->device and peer copies, streams, events and cuBLAS handles.
// Kernels live in cuda_kernels.cu, cuda_gemm.cu, cuda_kernels_gpt.cu, cuda_attention.cu,
// cuda_fused.cu (the transformer's) and cuda_multi_tensor.cu (the optimizer's multi-tensor ones),
// communicators in cuda_communicator.cpp (and cuda_communicator_mpi.cpp, with cuda_nccl.cpp and
// cuda_bitwise.cpp beside them).
#include "backend_cuda/cuda_backend.h"

#include <cstdint>
#include <cstdlib>
#include <iomanip>
#include <mutex>
#include <sstream>

#include "backend_cuda/cublas_lazy.h"
#include "backend_cuda/cuda_check.h"
#include "core/base/error.h"

namespace ditto {

std::shared_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  return std::make_shared<cuda::CudaBackend>(options);
}

namespace cuda {

namespace {

constexpr int kMaxLogicalDevices = 1024;
/// A zero-byte request still gets its own small block, so that its pointer is unique.
constexpr std::size_t kZeroByteBlock = 256;

std::string bytes_str(std::size_t b) {
  std::ostringstream os;
  os << b << " bytes";
  if (b >= (1u << 20)) os << " (" << std::fixed << std::setprecision(2) << b / 1048576.0 << " MiB)";
  return os.str();
}

/// Why no GPU can be used, from cudaGetDeviceCount's error, in words.
std::string no_device_reason(cudaError_t err) {
  std::string reason = cudaGetErrorString(err);
  if (err == cudaErrorInsufficientDriver) {
    int driver = 0, runtime = 0;
    (void)cudaDriverGetVersion(&driver);
    (void)cudaRuntimeGetVersion(&runtime);
    auto ver = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
    if (driver == 0)  // libcuda.so.1 could not be loaded at all
      reason = "no NVIDIA driver loaded (cudaGetDeviceCount: " + reason + "; CUDA runtime " +
               ver(runtime) + ")";
    else
      reason += " (the driver supports CUDA " + ver(driver) + ", ditto needs " + ver(runtime) + ")";
  }
  (void)cudaGetLastError();
  return reason;
}

std::string visible_devices_note() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v ? std::string(" (CUDA_VISIBLE_DEVICES=") + v + ")" : std::string();
}

}  // namespace

static_assert(peer_access_granted(cudaSuccess) &&
              peer_access_granted(cudaErrorPeerAccessAlreadyEnabled) &&
              !peer_access_granted(cudaErrorTooManyPeers) &&
              !peer_access_granted(cudaErrorPeerAccessUnsupported));

bool ensure_peer_access(int p, int q) {
  static std::mutex mu;
  static PeerPairs peers;  // the process's: peer access belongs to its primary contexts
  std::lock_guard lk(mu);
  return peers.ensure(p, q, [&] {
    DeviceGuard g(p);
    const cudaError_t e = cudaDeviceEnablePeerAccess(q, 0);
    // Not sticky: cleared, so that no later launch check reports it (incl.
    // cudaErrorPeerAccessAlreadyEnabled where someone else, PyTorch, enabled the pair).
    if (e != cudaSuccess) (void)cudaGetLastError();
    return static_cast<int>(e);
  });
}

CudaBackend::CudaBackend(const BackendOptions& options) : allow_tf32_(options.allow_tf32) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess)
    throw BackendError("no CUDA device: " + no_device_reason(err) + visible_devices_note());
  if (count <= 0) throw BackendError("no CUDA device: no GPU visible" + visible_devices_note());
  physical_count_ = count;

  const int logical = options.device_count.value_or(count);
  DITTO_CHECK(logical >= 1 && logical <= kMaxLogicalDevices,
              "cuda backend: device_count: expected 1..", kMaxLogicalDevices, " (more than the ",
              count, " visible GPUs oversubscribes them), got ", logical);

  // Physical GPUs: properties. Memory comes from one pool per logical device (below).
  physical_.resize(static_cast<std::size_t>(count));
  for (int p = 0; p < count; ++p) {
    const std::string gpu = "GPU " + std::to_string(p);
    cudaDeviceProp prop{};
    DITTO_CUDA_CHECK(cudaGetDeviceProperties(&prop, p), gpu);
    PhysicalDevice& pd = physical_[static_cast<std::size_t>(p)];
    pd.name = prop.name;
    pd.total_memory = prop.totalGlobalMem;
    pd.max_pitch = prop.memPitch;
    int pools = 0;
    DITTO_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, p), gpu);
    pd.memory_pools = pools != 0;
  }

  // Peer access between physical GPUs where the hardware allows it (NVLink, PCIe P2P); the
  // pools grant it to their memory below. Where it does not, cudaMemcpy*Async with
  // cudaMemcpyDefault still copies between GPUs (staged through the host), so failures here only
  // cost speed and are ignored here (the in-GPU transport, which needs it, asks again and refuses
  // without it). Each pair once per process (ensure_peer_access).
  for (int p = 0; p < count; ++p) {
    for (int q = 0; q < count; ++q) {
      if (p == q) continue;
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, p, q) != cudaSuccess || !can) {
        (void)cudaGetLastError();
        continue;
      }
      (void)ensure_peer_access(p, q);
    }
  }

  // Logical devices, each with its own memory pool on its GPU (cudaMemPoolCreate): logical
  // devices sharing a GPU never hand each other's freed blocks to streams that did not wait for
  // them, and an allocation failure trims them all (reclaim_gpu_memory). Each pool keeps freed
  // memory for reuse up to its share of a finite release threshold (pool_release_threshold), so
  // NCCL's and cuBLAS's own cudaMalloc still find memory.
  devices_.reserve(static_cast<std::size_t>(logical));
  for (int i = 0; i < logical; ++i) {
    auto d = std::make_unique<LogicalDevice>();
    d->physical = i % count;
    d->stream = std::make_unique<CudaStream>(Device("cuda", i), d->physical);
    const PhysicalDevice& pd = physical_[static_cast<std::size_t>(d->physical)];
    d->mem.capacity = pd.total_memory;
    devices_.push_back(std::move(d));
    LogicalDevice& ld = *devices_.back();
    if (!pd.memory_pools) continue;
    const std::string w = where(i);
    DeviceGuard g(ld.physical);
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = ld.physical;
    DITTO_CUDA_CHECK(cudaMemPoolCreate(&ld.pool, &props), w);
    const int sharing = logical / count + (ld.physical < logical % count ? 1 : 0);
    std::uint64_t keep = pool_release_threshold(pd.total_memory, sharing);
    DITTO_CUDA_CHECK(cudaMemPoolSetAttribute(ld.pool, cudaMemPoolAttrReleaseThreshold, &keep), w);
    // Peers that can reach this GPU may read and write the pool's memory (in-GPU collectives
    // across GPUs); where they cannot, copies between GPUs still work (staged), only slower.
    for (int q = 0; q < count; ++q) {
      int can = 0;
      if (q == ld.physical || cudaDeviceCanAccessPeer(&can, q, ld.physical) != cudaSuccess ||
          !can) {
        (void)cudaGetLastError();
        continue;
      }
      cudaMemAccessDesc desc{};
      desc.location.type = cudaMemLocationTypeDevice;
      desc.location.id = q;
      desc.flags = cudaMemAccessFlagsProtReadWrite;
      if (cudaMemPoolSetAccess(ld.pool, &desc, 1) != cudaSuccess) (void)cudaGetLastError();
    }
  }
  kernels_ = make_cuda_kernels(*this);
}

CudaBackend::~CudaBackend() {
  kernels_.reset();  // may free workspaces through deallocate(), which needs the streams
  for (auto& d : devices_) {
    DeviceGuard g(d->physical, std::nothrow);
    if (cudaStreamSynchronize(d->stream->get()) != cudaSuccess) (void)cudaGetLastError();
    d->stream.reset();  // its cuBLAS handle too
  }
  for (auto& d : devices_) {
    if (!d->pool) continue;
    DeviceGuard g(d->physical, std::nothrow);
    if (cudaDeviceSynchronize() != cudaSuccess || cudaMemPoolDestroy(d->pool) != cudaSuccess)
      (void)cudaGetLastError();
    d->pool = nullptr;
  }
}

std::string CudaBackend::where(int index) const {
  return cuda::where(Device("cuda", index), devices_[static_cast<std::size_t>(index)]->physical);
}

DeviceProperties CudaBackend::properties(int index) const {
  const auto& d = *devices_[static_cast<std::size_t>(index)];
  return {physical_[static_cast<std::size_t>(d.physical)].name, d.mem.capacity};
}

MemoryStats CudaBackend::memory_stats(int index) const {
  const auto& d = *devices_[static_cast<std::size_t>(index)];
  std::lock_guard lk(d.mem_mu);
  return {d.mem.committed, d.mem.peak, d.mem.capacity};
}

void CudaBackend::reset_peak_memory(int index) {
  auto& d = *devices_[static_cast<std::size_t>(index)];
  std::lock_guard lk(d.mem_mu);
  d.mem.peak = d.mem.committed;
}

void* CudaBackend::device_malloc(LogicalDevice& d, std::size_t bytes, cudaStream_t stream,
                                 cudaError_t* err) {
  void* p = nullptr;
  if (d.pool)
    *err = cudaMallocFromPoolAsync(&p, bytes, d.pool, stream);
  else
    *err = cudaMalloc(&p, bytes);
  return *err == cudaSuccess ? p : nullptr;
}

void* CudaBackend::allocate(int index, std::size_t bytes) {
  return allocate_on(index, bytes, devices_[static_cast<std::size_t>(index)]->stream->get());
}

void CudaBackend::deallocate(int index, void* ptr, std::size_t bytes) noexcept {
  deallocate_on(index, ptr, bytes, devices_[static_cast<std::size_t>(index)]->stream->get());
}

void CudaBackend::reclaim_gpu_memory(int physical) {
  const std::string gpu = "GPU " + std::to_string(physical);
  DeviceGuard g(physical);
  // Every stream of the GPU, not only the allocating one: blocks freed on another logical
  // device's (or another thread's) stream return to their pool only once that stream gets there.
  DITTO_CUDA_CHECK(cudaDeviceSynchronize(), gpu);
  for (auto& d : devices_)
    if (d->physical == physical && d->pool) (void)cudaMemPoolTrimTo(d->pool, 0);
  (void)cudaGetLastError();
}

void* CudaBackend::allocate_on(int index, std::size_t bytes, cudaStream_t stream) {
  auto& d = *devices_[static_cast<std::size_t>(index)];
  auto oom = [&](const std::string& extra) {
    std::lock_guard lk(d.mem_mu);
    return OutOfMemory(
        detail::cat(where(index), ": out of memory: tried to allocate ", bytes_str(bytes), "; ",
                    bytes_str(d.mem.committed), " in use of capacity ", bytes_str(d.mem.capacity),
                    " (peak ", bytes_str(d.mem.peak), ")", extra),
        OutOfMemory::Kind::device);
  };
  // Our own accounting first, like the simulator: a request past the capacity fails before CUDA
  // is asked. The peak counts the request only once CUDA granted it (MemoryAccount).
  {
    std::unique_lock lk(d.mem_mu);
    if (!d.mem.reserve(bytes)) {
      lk.unlock();
      throw oom("");
    }
  }
  struct Unreserve {
    LogicalDevice& d;
    std::size_t bytes;
    bool armed = true;
    ~Unreserve() {
      if (!armed) return;
      std::lock_guard lk(d.mem_mu);
      d.mem.release(bytes, false);
    }
  } unreserve{d, bytes};

  DeviceGuard g(d.physical);
  const std::size_t request = bytes == 0 ? kZeroByteBlock : bytes;
  cudaError_t err = cudaSuccess;
  void* p = device_malloc(d, request, stream, &err);
  if (err == cudaErrorMemoryAllocation) {
    // The pools may hold memory freed on other streams or not yet returned: let every stream of
    // the GPU complete, give unused pool memory back to the driver, and try once more.
    (void)cudaGetLastError();
    reclaim_gpu_memory(d.physical);
    p = device_malloc(d, request, stream, &err);
  }
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    std::size_t free_b = 0, total_b = 0;
    std::string extra =
        detail::cat("; CUDA: ", device_malloc_call(d.pool != nullptr), " out of memory");
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
      extra += ", " + bytes_str(free_b) + " free on GPU " + std::to_string(d.physical);
    (void)cudaGetLastError();
    throw oom(extra);
  }
  if (err != cudaSuccess)
    throw_cuda_error(err, device_malloc_call(d.pool != nullptr), __FILE__, __LINE__, where(index));
  unreserve.armed = false;
  std::lock_guard lk(d.mem_mu);
  d.mem.commit(bytes);
  return p;
}

void CudaBackend::deallocate_on(int index, void* ptr, std::size_t bytes,
                                cudaStream_t stream) noexcept {
  auto& d = *devices_[static_cast<std::size_t>(index)];
  if (ptr) {
    DeviceGuard g(d.physical, std::nothrow);
    cudaError_t err = d.pool ? cudaFreeAsync(ptr, stream) : cudaFree(ptr);
    if (err != cudaSuccess) (void)cudaGetLastError();  // e.g. the context is already lost
  }
  std::lock_guard lk(d.mem_mu);
  d.mem.release(bytes, true);
}

std::unique_ptr<Stream> CudaBackend::create_stream(int index) {
  return std::make_unique<CudaStream>(Device("cuda", index),
                                      devices_[static_cast<std::size_t>(index)]->physical);
}

std::unique_ptr<Event> CudaBackend::create_event(int index) {
  return std::make_unique<CudaEvent>(devices_[static_cast<std::size_t>(index)]->physical);
}

namespace {
// A host copy on `s` that returns once done (copy_from_host, copy_to_host).
void copy_blocking(Stream& s, void* dst, const void* src, std::size_t bytes, const char* call) {
  CudaStream& cs = as_cuda(s, call);
  if (bytes == 0) return;
  const std::string w = cuda::where(cs.device(), cs.physical_device());
  DeviceGuard g(cs.physical_device());
  DITTO_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cs.get()), w);
  cs.synchronize();  // watched where NCCL work may hang the stream (Note [Waiting on NCCL work])
}
}  // namespace

void CudaBackend::copy_from_host(Stream& s, void* dst, const void* src, std::size_t bytes) {
  copy_blocking(s, dst, src, bytes, "copy_from_host");
}

void CudaBackend::copy_to_host(Stream& s, void* dst, const void* src, std::size_t bytes) {
  copy_blocking(s, dst, src, bytes, "copy_to_host");
}

void CudaBackend::copy_2d(Stream& s, void* dst, std::size_t dst_pitch, const void* src,
                          std::size_t src_pitch, std::size_t row_bytes, std::size_t rows) {
  CudaStream& cs = as_cuda(s, "copy_2d");
  if (rows == 0 || row_bytes == 0) return;
  DeviceGuard g(cs.physical_device());
  // cudaMemcpyDefault: the pointers say which GPU (UVA), so one call copies within a GPU, between
  // GPUs (peer-to-peer where enabled) and from or to host memory.
  if (rows == 1 || (dst_pitch == row_bytes && src_pitch == row_bytes)) {
    DITTO_CUDA_CHECK(cudaMemcpyAsync(dst, src, rows * row_bytes, cudaMemcpyDefault, cs.get()),
                     cuda::where(cs.device(), cs.physical_device()));
    return;
  }
  const std::size_t max_pitch = physical_[static_cast<std::size_t>(cs.physical_device())].max_pitch;
  if (dst_pitch <= max_pitch && src_pitch <= max_pitch) {
    DITTO_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows,
                                       cudaMemcpyDefault, cs.get()),
                     cuda::where(cs.device(), cs.physical_device()));
    return;
  }
  // Pitches past cudaMemcpy2D's limit (memPitch, 2 GiB on current GPUs): one copy per row.
  auto* dp = static_cast<char*>(dst);
  auto* sp = static_cast<const char*>(src);
  for (std::size_t r = 0; r < rows; ++r)
    DITTO_CUDA_CHECK(cudaMemcpyAsync(dp + r * dst_pitch, sp + r * src_pitch, row_bytes,
                                     cudaMemcpyDefault, cs.get()),
                     cuda::where(cs.device(), cs.physical_device()));
}

CudaBackend& as_cuda_backend(Backend& b, const char* call) {
  auto* p = dynamic_cast<CudaBackend*>(&b);
  DITTO_CHECK(p, call, ": expected the cuda backend, got backend ", b.name());
  return *p;
}

std::shared_ptr<CommunicatorImpl> CudaBackend::create_communicator(const std::vector<int>& devices,
                                                                   const CommOptions& options) {
  return make_cuda_communicator(*this, devices, options);
}

}  // namespace cuda
}  // namespace ditto
