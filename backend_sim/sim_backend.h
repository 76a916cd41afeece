// SimBackend: N virtual GPUs on the CPU. Each virtual device has its own memory (host memory with a
// capacity and live/peak byte counts), a default stream (run on the simulator's bounded thread
// pool, Note [Sim executor]), Eigen kernels (sim_kernels.cpp), shared-memory collectives
// (sim_communicator.cpp) and injectable faults (sim_faults.h).
//
// Note [Dry run]
// BackendOptions::dry_run makes the simulator a pure cost model of the same work: a laptop
// predicts a GPT-2 1.5B step on 8 GPUs without holding 8 x 40 GB (issue 14).
//   allocate()     charges capacity, in-use and peak exactly as a real run (OutOfMemory at the
//                  same request, with the same numbers) but hands out an address from the
//                  device's DryArena (sim_dry_arena.h): an address no host mapping holds,
//                  faulting if touched (Note [Dry addresses]). No host memory per tensor, and
//                  no host address space per device.
//   kernels        enqueued and priced as usual (launch in sim_kernels.cpp), work skipped;
//                  where the CUDA backend runs the work differently (the typed GEMM, MixedOp's
//                  f32 scratch, the optimizer's multi-tensor kernels, attention's backward in
//                  two launches) the dry run takes CUDA's path and prices it (Note [Predicted
//                  launches], cost_model.h);
//   copies         copy_2d priced, not run; copy_from_host priced, nothing written;
//                  copy_to_host priced and fills the host destination with zeros (so losses,
//                  norms and checksums of a dry run read 0);
//   collectives    rendezvous, timeouts, mismatch checks and pricing as usual, data not moved
//                  (sim_communicator.cpp, sim_communicator_p2p.cpp).
// The virtual clocks, the trace and the memory counters then match a real run of the same work
// exactly (tests/test_dry_run.cpp: a model without those paths; with them, every other kernel
// row), because the cost model never looks at data. The memory matches to the byte in bitwise
// mode, where both run the same kernels; in fast mode CUDA's paths allocate other temporaries
// than the simulator's own (the fused loss writes its gradient over the logits, with no
// [tokens, V] buffer), so the peaks differ by some MiB, either way (tester 6, F2: f32 ddp real
// 68.55 / dry 67.25 MiB, dp 79.38 / 79.98), f32 or not: the dry run's is the GPU's figure. What
// does depend on data is not priced differently either: there is no data-dependent control flow in
// ditto's kernels, except clip_grad_norm_'s choice to scale, which a dry run always prices
// (core/optim/clip.cpp). Code outside the backend asks Backend::dry_run() (is_dry_run) to skip
// work whose only purpose is data: drawing initial weights on the host (core/nn/init.h,
// dry_upload), reading parameters back for the checksum. The MPI communicator does not run dry.
//
// Note [Memory accounting]
// A device's in_use and peak (memory_stats, OutOfMemory) count the bytes of the allocations the
// host holds: allocate() adds at once, deallocate() subtracts at once (host order), as
// torch.cuda.memory_allocated() and max_memory_allocated() do under the caching allocator, whose
// freed blocks the same stream may reuse right away. The host memory itself (or, dry, the
// address range) is released in stream order, after the work enqueued before the free. So the
// numbers depend only on the program's order of allocations and frees per device, never on how
// fast the simulator's threads run: a dry run and a real run of the same work report the same
// peak, byte for byte. (Until issue 14 the counters dropped in stream order, and a real run's
// peak varied from run to run by a few KiB.) The trace's memory counter stays stream-ordered.
//
// Note [Block cache]
// The host blocks behind a device's allocations are cached per device, as PyTorch's CUDA caching
// allocator caches device blocks: a block freed (in stream order) waits in its device's cache,
// keyed by its size rounded up to 64 bytes, and the device's next allocation of that size takes
// it without malloc, free or the process-wide owners_ map (a cached block stays in the map, so
// owner_of still finds its device). Training allocates the same sizes step after step; before the
// cache, malloc, free and the map's lock took about a fifth of a small model's step at 4 devices.
// Only blocks up to kCacheMaxBlock are kept, at most kCacheMaxBytes per device (a free beyond that
// goes to the host); none in a dry run (its arena is already a free list) or for the uncharged
// f32 scratch of bf16 / f16 ops. The counters of Note [Memory accounting] never see the cache:
// in_use and peak count live allocations only, as torch.cuda.memory_allocated() does. Under ASan
// a cached block is poisoned until it is handed out again, so a use after free is still reported.
// DITTO_SIM_CACHE=0 turns the cache off (every free goes to the host at once).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "backend_sim/cost_model.h"
#include "backend_sim/sim_faults.h"
#include "backend_sim/sim_stream.h"
#include "core/comm/communicator.h"
#include "core/runtime/backend.h"
#include "core/runtime/extensions.h"

namespace ditto::sim {

class DryArena;  // sim_dry_arena.h (not installed: only sim_backend.cpp uses it)

/// Stream of the simulator; throws InvalidArgument naming `call` when `s` belongs to another
/// backend.
SimStream& as_sim(Stream& s, const char* call);

std::unique_ptr<Kernels> make_sim_kernels(std::shared_ptr<CostModel> cost);
/// `cost`: the backend's cost model (virtual time of the collectives, Note [Virtual time]).
/// `faults` (may be null): the backend's skip-collective faults and timeout override
/// (sim_faults.h).
std::shared_ptr<CommunicatorImpl> make_sim_communicator(
    const std::vector<int>& devices, const CommOptions& options, std::shared_ptr<CostModel> cost,
    std::shared_ptr<FaultState> faults = nullptr);

class SimBackend final : public Backend {
 public:
  /// Backend::extension<SimBackend>() gives the simulator itself (tests and tools of the
  /// simulator; other callers use the interfaces of core/runtime/extensions.h).
  static constexpr std::string_view kExtensionName = "ditto.sim.backend";

  explicit SimBackend(const BackendOptions& options);
  ~SimBackend() override;

  std::string name() const override { return "sim"; }
  int device_count() const override { return static_cast<int>(devices_.size()); }
  DeviceProperties properties(int index) const override;
  MemoryStats memory_stats(int index) const override;
  void reset_peak_memory(int index) override;
  /// BackendOptions::dry_run (Note [Dry run]).
  bool dry_run() const override { return dry_run_; }
  /// Bytes of the dry run's span of addresses reserved for device `index` (0 when not dry, or
  /// before its first allocation): neither host memory nor host address space (Note [Dry
  /// addresses], sim_dry_arena.h).
  std::size_t dry_reserved_bytes(int index) const;

  void* allocate(int index, std::size_t bytes) override;
  void deallocate(int index, void* ptr, std::size_t bytes) noexcept override;

  Stream& default_stream(int index) override { return *devices_[index]->stream; }
  std::unique_ptr<Stream> create_stream(int index) override;
  std::unique_ptr<Event> create_event(int index) override;

  void copy_from_host(Stream& s, void* dst, const void* src, std::size_t bytes) override;
  void copy_to_host(Stream& s, void* dst, const void* src, std::size_t bytes) override;
  void copy_2d(Stream& s, void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
               std::size_t row_bytes, std::size_t rows) override;

  Kernels& kernels() override { return *kernels_; }
  std::shared_ptr<CommunicatorImpl> create_communicator(const std::vector<int>& devices,
                                                        const CommOptions& options) override;

  /// The cost model (Note [Virtual time], cost_model.h). Its cluster defaults to one node of
  /// H100 SXM GPUs on NVLink; configure it (and set_slowdown, set_tracing) before enqueueing
  /// work.
  CostModel& cost_model() { return *cost_; }

  /// Fails the devices whose `fail:` fault has step <= `step` (sim_faults.h).
  void begin_step(std::int64_t step) override;

  /// Replaces the injected faults (sim_faults.h): every device becomes healthy again and the
  /// allocation counts restart from zero; communicators created afterwards see the new
  /// skip-collective faults and timeout. Throws InvalidArgument naming the spec when a device
  /// or a skip-collective rank is out of range (0..device_count()-1), or comm_timeout_ms is not
  /// in 1..kMaxCommTimeoutMs.
  void set_faults(const FaultConfig& faults);

  /// The specs of the faults set by set_faults() that have not taken effect yet (e.g. a
  /// skip-collective fault in a run that issues no communicator collective).
  std::vector<std::string> unfired_faults() const;

  /// CostModelExtension, FaultExtension (core/runtime/extensions.h) and kExtensionName.
  void* extension(std::string_view name) override;
  using Backend::extension;

 private:
  /// Device whose allocation holds `p`, or -1 (for the cost of copy_2d).
  int owner_of(const void* p) const;

  struct VirtualDevice {
    std::unique_ptr<SimStream> stream;
    std::shared_ptr<DeviceHealth> health = std::make_shared<DeviceHealth>();
    std::atomic<std::int64_t> allocations{0};  ///< allocate() calls since set_faults
    std::size_t capacity = 0;
    std::atomic<std::size_t> in_use{0};
    std::atomic<std::size_t> peak{0};
    std::unique_ptr<DryArena> arena;  ///< dry run: where the addresses come from (else null)
    // Note [Block cache]: freed host blocks of this device, by rounded size, for its next
    // allocations of that size.
    std::mutex cache_mu;
    std::unordered_map<std::size_t, std::vector<void*>> cache;
    std::size_t cached_bytes = 0;  // guarded by cache_mu
  };
  /// A cached block of `rounded` bytes of device d, or null (Note [Block cache]).
  void* cache_take(VirtualDevice& d, std::size_t rounded);
  /// Keeps `p` (`rounded` bytes) in d's cache; false when the cache is full (the caller frees).
  bool cache_put(VirtualDevice& d, void* p, std::size_t rounded);
  /// Frees every cached block of d (host out of memory, or the backend's end).
  void cache_clear(VirtualDevice& d);
  bool cache_enabled_ = true;
  bool dry_run_ = false;
  std::size_t dry_reserve_ = 0;  ///< dry run: each device's first range (Note [Dry addresses])
  std::vector<std::unique_ptr<VirtualDevice>> devices_;
  std::shared_ptr<CostModel> cost_;
  std::unique_ptr<Kernels> kernels_;
  std::vector<std::unique_ptr<std::atomic<int>>> next_track_;  // per device: next stream index
  mutable std::mutex owners_mu_;
  std::map<std::uintptr_t, std::pair<std::size_t, int>> owners_;  // start -> (bytes, device)
  // Starts of the live allocations not charged to their device: the f32 scratch of an op over
  // bf16 / f16 tensors (Note [Mixed precision], core/runtime/mixed_precision.h), marked when
  // allocated so that their free is not subtracted either. Guarded by owners_mu_.
  std::set<std::uintptr_t> uncharged_;
  std::atomic<std::int64_t> uncharged_live_{
      0};  // uncharged_.size(): deallocate() skips the lock at 0
  mutable std::mutex faults_mu_;
  std::shared_ptr<FaultState> faults_ = std::make_shared<FaultState>(FaultConfig{});
  // Whether faults_ holds a fail_alloc fault (written with faults_mu_ held): allocate() takes
  // faults_mu_ only then (a process-wide lock per allocation was contended by DDP's rank threads).
  std::atomic<bool> alloc_faults_{false};
  std::unique_ptr<CostModelExtension> cost_extension_;
  std::unique_ptr<FaultExtension> fault_extension_;
};

}  // namespace ditto::sim
