// DryArena (sim_dry_arena.h): first fit over ranges of the span of Note [Dry addresses], coalescing
// on free; the span itself is handed out the same way, process-wide.
#include "backend_sim/sim_dry_arena.h"

#include <iterator>

namespace ditto::sim {

namespace {

/// Adds [off, off + len) to a free list of disjoint, coalesced ranges (offset -> length).
void give_back(std::map<std::size_t, std::size_t>& free, std::size_t off, std::size_t len) {
  auto next = free.lower_bound(off);
  if (next != free.end() && off + len == next->first) {  // merge with the range after
    len += next->second;
    next = free.erase(next);
  }
  if (next != free.begin()) {  // merge with the range before
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += len;
      return;
    }
  }
  free.emplace_hint(next, off, len);
}

/// First fit of `len` bytes in a free list; false when no range is that large.
bool take_first_fit(std::map<std::size_t, std::size_t>& free, std::size_t len,
                    std::size_t& off_out) {
  for (auto it = free.begin(); it != free.end(); ++it) {
    if (it->second < len) continue;
    const std::size_t off = it->first, have = it->second;
    free.erase(it);
    if (have > len) free[off + len] = have - len;
    off_out = off;
    return true;
  }
  return false;
}

/// The span every arena of the process reserves from (offsets from DryArena::kSpanBegin). Never
/// destroyed: an arena in a static object may be destroyed after it.
struct Span {
  std::mutex mu;
  std::map<std::size_t, std::size_t> free{{0, DryArena::kAddressSpace}};
};
Span& span() {
  static Span* s = new Span;
  return *s;
}

}  // namespace

DryArena::~DryArena() {
  Span& s = span();
  std::lock_guard lk(s.mu);
  for (const Region& r : regions_)
    give_back(s.free, reinterpret_cast<std::uintptr_t>(r.base) - kSpanBegin, r.size);
}

std::size_t DryArena::rounded(std::size_t bytes) {
  const std::size_t b = bytes == 0 ? 1 : bytes;
  return (b + kAlign - 1) / kAlign * kAlign;
}

void* DryArena::allocate(std::size_t bytes, std::size_t reserve_bytes) {
  if (bytes > kAddressSpace) return nullptr;
  const std::size_t need = rounded(bytes);
  std::lock_guard lk(mu_);
  for (Region& r : regions_) {
    std::size_t off = 0;
    if (take_first_fit(r.free, need, off)) return r.base + off;
  }
  // None has room (the first call; or frees still pending in stream order): a new reservation.
  constexpr std::size_t kGrain = std::size_t(64) << 10;
  std::size_t want = reserve_bytes > need ? reserve_bytes : need;
  if (want > kAddressSpace) want = kAddressSpace;
  const std::size_t size = (want + kGrain - 1) / kGrain * kGrain;
  std::size_t off = 0;
  {
    Span& s = span();
    std::lock_guard slk(s.mu);
    if (!take_first_fit(s.free, size, off)) return nullptr;
  }
  Region r;
  // Note [Dry addresses]: an address no host mapping holds, never dereferenced.
  r.base = reinterpret_cast<char*>(kSpanBegin + off);
  r.size = size;
  if (size > need) r.free[need] = size - need;
  regions_.push_back(std::move(r));
  return regions_.back().base;
}

void DryArena::deallocate(void* p, std::size_t bytes) noexcept {
  std::lock_guard lk(mu_);
  if (!p) return;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  for (Region& r : regions_) {
    const auto base = reinterpret_cast<std::uintptr_t>(r.base);
    if (a < base || a >= base + r.size) continue;
    give_back(r.free, a - base, rounded(bytes));
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
