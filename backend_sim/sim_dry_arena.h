// DryArena: the addresses a dry-run device hands out (Note [Dry run], sim_backend.h). One
// reservation of address space per device, mmap(PROT_NONE, MAP_NORESERVE): it costs no host
// memory and no swap, any access to it faults (so a kernel that would touch a dry tensor's data
// crashes at once instead of reading garbage), and live allocations get distinct, non-overlapping
// address ranges, as the pointer arithmetic of the collectives' overlap checks and
// SimBackend::owner_of expect.
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

  /// An address range of `bytes` (0 gives a unique one of kAlign bytes), first fit. On the first
  /// call reserves `reserve_bytes` (rounded up to pages) of address space. When no reservation
  /// has a free range that large (frees still pending in stream order: a dry run charges
  /// MixedOp's f32 scratch, whose churn can outrun a stream parked in a collective), it reserves
  /// another max(reserve_bytes, bytes). Returns nullptr when no reservation can be made (the
  /// caller reports it).
  void* allocate(std::size_t bytes, std::size_t reserve_bytes);
  /// Gives back a range from allocate() of the same `bytes`. Never throws.
  void deallocate(void* p, std::size_t bytes) noexcept;
  /// Bytes of address space reserved, all reservations (0 before the first allocate).
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
