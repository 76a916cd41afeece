// DryArena (sim_dry_arena.h): first fit over one PROT_NONE reservation, coalescing on free.
#include "backend_sim/sim_dry_arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <iterator>

namespace ditto::sim {

DryArena::~DryArena() {
  for (const Region& r : regions_) ::munmap(r.base, r.size);
}

std::size_t DryArena::rounded(std::size_t bytes) {
  const std::size_t b = bytes == 0 ? 1 : bytes;
  return (b + kAlign - 1) / kAlign * kAlign;
}

void* DryArena::allocate(std::size_t bytes, std::size_t reserve_bytes) {
  if (bytes > (std::size_t(1) << 62)) return nullptr;
  const std::size_t need = rounded(bytes);
  std::lock_guard lk(mu_);
  for (Region& r : regions_)
    for (auto it = r.free.begin(); it != r.free.end(); ++it) {
      if (it->second < need) continue;
      const std::size_t off = it->first, len = it->second;
      r.free.erase(it);
      if (len > need) r.free[off + need] = len - need;
      return r.base + off;
    }
  // None has room (the first call; or frees still pending in stream order): a new reservation.
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t want = reserve_bytes > need ? reserve_bytes : need;
  const std::size_t size = (want + page - 1) / page * page;
  void* p = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  Region r;
  r.base = static_cast<char*>(p);
  r.size = size;
  if (size > need) r.free[need] = size - need;
  regions_.push_back(std::move(r));
  return p;
}

void DryArena::deallocate(void* p, std::size_t bytes) noexcept {
  std::lock_guard lk(mu_);
  if (!p) return;
  char* c = static_cast<char*>(p);
  for (Region& r : regions_) {
    if (c < r.base || c >= r.base + r.size) continue;
    std::size_t off = static_cast<std::size_t>(c - r.base);
    std::size_t len = rounded(bytes);
    auto next = r.free.lower_bound(off);
    if (next != r.free.end() && off + len == next->first) {  // merge with the range after
      len += next->second;
      next = r.free.erase(next);
    }
    if (next != r.free.begin()) {  // merge with the range before
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        prev->second += len;
        return;
      }
    }
    r.free.emplace_hint(next, off, len);
    return;
  }
}

std::size_t DryArena::reserved() const {
  std::lock_guard lk(mu_);
  std::size_t n = 0;
  for (const Region& r : regions_) n += r.size;
  return n;
}

}  // namespace ditto::sim
