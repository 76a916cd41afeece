// DryArena: the addresses a dry-run device hands out (Note [Dry run], sim_backend.h).
//
// Note [Dry addresses]
// A dry tensor's address is never read or written, so it need not be host memory at all: every
// DryArena takes its ranges from one process-wide span of addresses that no host mapping can
// hold (non-canonical on x86-64: [2^57, 2^62), past the 56 bits of user space even with 5-level
// paging; elsewhere [2^52, 2^56), past a 52-bit user space and below the top byte that AArch64
// ignores). Nothing is mapped, so a dry run costs no host memory, swap or address space however
// many devices it simulates and however large they are (until issue 29 each device reserved
// mmap(PROT_NONE) address space of twice its capacity, and 128 TiB of user space ran out at
// about 819 simulated 80 GiB devices); any access to a dry tensor's data still faults at once
// (SIGSEGV) instead of reading garbage; and live allocations get distinct, non-overlapping
// ranges, as the pointer arithmetic of the collectives' overlap checks and SimBackend::owner_of
// expect (distinct across the arenas of all backends of the process too). The span,
// kAddressSpace bytes (about 4 EiB on x86-64), is the one limit left: SimBackend (and, naming
// ditto-train's options, SimRun::plan) refuses up front a dry run whose devices' capacities
// together exceed it; a device first reserves twice its capacity, or its share of the span when
// that is less (at least its capacity), and more only as its frees wait in stream order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace ditto::sim {

class DryArena {
 public:
  /// Nothing is reserved until the first allocate().
  DryArena() = default;
  ~DryArena();
  DryArena(const DryArena&) = delete;
  DryArena& operator=(const DryArena&) = delete;

  /// Alignment of every address (cudaMalloc's 256 bytes).
  static constexpr std::size_t kAlign = 256;
  /// The process-wide span the arenas share, [kSpanBegin, kSpanBegin + kAddressSpace) (Note
  /// [Dry addresses]).
#if defined(__x86_64__)
  static constexpr std::uintptr_t kSpanBegin = std::uintptr_t(1) << 57;
  static constexpr std::size_t kAddressSpace = (std::size_t(1) << 62) - kSpanBegin;
#else
  static constexpr std::uintptr_t kSpanBegin = std::uintptr_t(1) << 52;
  static constexpr std::size_t kAddressSpace = (std::size_t(1) << 56) - kSpanBegin;
#endif
  static_assert(sizeof(void*) == 8, "Note [Dry addresses] needs 64-bit addresses");

  /// An address range of `bytes` (0 gives a unique one of kAlign bytes), first fit. On the first
  /// call reserves `reserve_bytes` (rounded up to 64 KiB) of the span of Note [Dry addresses]
  /// (nothing is mapped). When no reservation
  /// has a free range that large (frees still pending in stream order: a dry run charges
  /// MixedOp's f32 scratch, whose churn can outrun a stream parked in a collective), it reserves
  /// another max(reserve_bytes, bytes). Returns nullptr when the span has no free range that
  /// large left (the caller reports it).
  void* allocate(std::size_t bytes, std::size_t reserve_bytes);
  /// Gives back a range from allocate() of the same `bytes`. Never throws.
  void deallocate(void* p, std::size_t bytes) noexcept;
  /// Bytes of the span reserved, all reservations (0 before the first allocate).
  std::size_t reserved() const;

 private:
  static std::size_t rounded(std::size_t bytes);
  struct Region {
    char* base = nullptr;
    std::size_t size = 0;
    std::map<std::size_t, std::size_t> free;  // offset -> length, disjoint, coalesced
  };
  mutable std::mutex mu_;
  std::vector<Region> regions_;  // in reservation order
};

}  // namespace ditto::sim
