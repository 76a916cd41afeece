// crc32_update: zlib's CRC-32 over any number of bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ditto::io {

/// zlib's CRC-32 (the one of gzip and PNG) of `n` bytes at `data`, continuing `crc` (0 to start):
/// zlib's crc32 in chunks, as it takes a uInt length. A checkpoint's "ditto.crc32"
/// (core/checkpoint/checkpoint.cpp) and the Trainer's check that every rank got the same eval
/// batch (core/train/replica.cpp).
std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t n);

}  // namespace ditto::io
