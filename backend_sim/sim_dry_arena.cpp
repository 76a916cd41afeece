// DryArena (sim_dry_arena.h): first fit over one PROT_NONE reservation, coalescing on free.
#include "backend_sim/sim_dry_arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <iterator>

namespace ditto::sim {

DryArena::~DryArena() {
  if (base_) ::munmap(base_, size_);
  for (const auto& [p, len] : overflow_) ::munmap(reinterpret_cast<void*>(p), len);
}

std::size_t DryArena::rounded(std::size_t bytes) {
  const std::size_t b = bytes == 0 ? 1 : bytes;
  return (b + kAlign - 1) / kAlign * kAlign;
}

void* DryArena::allocate(std::size_t bytes, std::size_t reserve_bytes) {
  if (bytes > (std::size_t(1) << 62)) return nullptr;
  const std::size_t need = rounded(bytes);
  std::lock_guard lk(mu_);
  if (!base_) {
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t size = (reserve_bytes + page - 1) / page * page;
    void* p = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    base_ = static_cast<char*>(p);
    size_ = size;
    free_[0] = size;
  }
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const std::size_t off = it->first, len = it->second;
    free_.erase(it);
    if (len > need) free_[off + need] = len - need;
    return base_ + off;
  }
  // No room: the frees still pending in stream order hold it. A reservation of its own.
  void* p = ::mmap(nullptr, need, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  overflow_[reinterpret_cast<std::uintptr_t>(p)] = need;
  return p;
}

void DryArena::deallocate(void* p, std::size_t bytes) noexcept {
  std::lock_guard lk(mu_);
  if (!base_ || !p) return;
  if (auto o = overflow_.find(reinterpret_cast<std::uintptr_t>(p)); o != overflow_.end()) {
    ::munmap(p, o->second);
    overflow_.erase(o);
    return;
  }
  std::size_t off = static_cast<std::size_t>(static_cast<char*>(p) - base_);
  std::size_t len = rounded(bytes);
  auto next = free_.lower_bound(off);
  if (next != free_.end() && off + len == next->first) {  // merge with the range after
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {  // merge with the range before
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += len;
      return;
    }
  }
  free_.emplace_hint(next, off, len);
}

std::size_t DryArena::reserved() const {
  std::lock_guard lk(mu_);
  return size_;
}

}  // namespace ditto::sim
