// canonical_nan_bits, is_nan_bits, canonicalize_nans (nan_bits.h, Note [NaN bits]).
#include "core/runtime/nan_bits.h"

#include <cstring>

namespace ditto {
namespace {

// A float format's NaN test on its bits u (sign included): |u| above inf's bits, or for e4m3
// (no inf) the one NaN pattern S.1111.111.
struct NanFormat {
  int bytes;
  std::uint64_t magnitude_mask, inf_bits, canonical;
  bool only_all_ones;  // f8_e4m3: NaN iff the magnitude is all ones
};

bool nan_format(DType t, NanFormat& f) {
  switch (t) {
    case DType::f32: f = {4, 0x7fffffffull, 0x7f800000ull, 0x7fffffffull, false}; return true;
    case DType::f64:
      f = {8, 0x7fffffffffffffffull, 0x7ff0000000000000ull, 0x7fffffffffffffffull, false};
      return true;
    case DType::f16: f = {2, 0x7fffull, 0x7c00ull, 0x7fffull, false}; return true;
    case DType::bf16: f = {2, 0x7fffull, 0x7f80ull, 0x7fffull, false}; return true;
    case DType::f8_e5m2: f = {1, 0x7full, 0x7cull, 0x7full, false}; return true;
    case DType::f8_e4m3: f = {1, 0x7full, 0x7full, 0x7full, true}; return true;
    default: return false;
  }
}

bool is_nan(const NanFormat& f, std::uint64_t u) {
  const std::uint64_t m = u & f.magnitude_mask;
  return f.only_all_ones ? m == f.magnitude_mask : m > f.inf_bits;
}

std::uint64_t load_bits(const unsigned char* p, int bytes) {
  std::uint64_t u = 0;
  std::memcpy(&u, p, static_cast<std::size_t>(bytes));  // little-endian: the low bytes
  return u;
}

}  // namespace

std::uint64_t canonical_nan_bits(DType t) {
  NanFormat f;
  DITTO_CHECK(nan_format(t, f), "canonical_nan_bits: t: expected a floating-point dtype, got ",
              dtype_name(t));
  return f.canonical;
}

bool is_nan_bits(DType t, const void* p) {
  NanFormat f;
  return nan_format(t, f) && is_nan(f, load_bits(static_cast<const unsigned char*>(p), f.bytes));
}

std::int64_t canonicalize_nans(DType t, void* p, std::int64_t n) {
  NanFormat f;
  if (!nan_format(t, f)) return 0;
  auto* b = static_cast<unsigned char*>(p);
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < n; ++i, b += f.bytes)
    if (is_nan(f, load_bits(b, f.bytes))) {
      std::memcpy(b, &f.canonical, static_cast<std::size_t>(f.bytes));
      ++count;
    }
  return count;
}

}  // namespace ditto
