// crc32_update (crc32.h).
#include "core/io/crc32.h"

#include <zlib.h>

#include <algorithm>

namespace ditto::io {

std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const uInt len = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    crc = static_cast<std::uint32_t>(::crc32(crc, p, len));
    p += len;
    n -= len;
  }
  return crc;
}

}  // namespace ditto::io
