// Internal, for backends: the launch shapes of the CUDA backend's kernels that split their work
// by the tensor's shape alone, so that the dry run prices what CUDA launches. backend_cuda's
// kernels launch them (cuda_kernels.cu's fast sum_rows, cuda_fused.cu's LayerNorm backward with
// its parameter gradients; cuda_host_logic.h brings them into ditto::cuda) and the simulator's
// cost model (backend_sim/cost_model.cpp) prices their partial sums: one definition, where each
// side once had its own copy of the arithmetic. Plain C++, no CUDA header: the simulator builds
// without CUDA.
#pragma once

#include <algorithm>
#include <cstdint>

namespace ditto::detail {

// ---- fast sum_rows' split over row chunks (cuda_kernels.cu, Note [CUDA row sums]) -------------

/// Blocks of 32 columns x 8 row groups the fast sum_rows aims at (about 8 resident blocks of 256
/// threads on each of an H100's / H200's 132 SMs).
inline constexpr std::int64_t kRowSumTargetBlocks = 1024;
/// Fewest rows of one chunk (8 a thread), and most rows summed in one pass (64 a thread).
inline constexpr std::int64_t kRowSumMinChunk = 64;
inline constexpr std::int64_t kRowSumOnePassRows = 512;

/// How CUDA's fast sum_rows / sum_rows_ex splits a [rows, cols] x: `chunks` chunks of
/// `chunk_rows` rows (the last one the rest), each summed per column by its own blocks into f32
/// partials; in the same launch the last block of each 32 columns to finish (elected by an atomic
/// ticket) adds their partials in chunk order (the same bits whichever block is last, run to run).
/// chunks == 1 (chunk_rows == rows): no partials. A function of the shape alone (not of the GPU),
/// so the dry run (backend_sim/cost_model.cpp) prices what CUDA does.
struct RowChunks {
  std::int64_t chunk_rows, chunks;
};
constexpr RowChunks fast_row_chunks(std::int64_t rows, std::int64_t cols) {
  if (rows <= kRowSumOnePassRows || cols <= 0) return {rows, 1};
  const std::int64_t col_blocks = (cols + 31) / 32;
  const std::int64_t want = (kRowSumTargetBlocks + col_blocks - 1) / col_blocks;
  std::int64_t chunk = std::max((rows + want - 1) / want, kRowSumMinChunk);
  chunk = (chunk + 7) / 8 * 8;  // the same rows for each of a block's 8 row groups
  const std::int64_t chunks = (rows + chunk - 1) / chunk;
  return chunks <= 1 ? RowChunks{rows, 1} : RowChunks{chunk, chunks};
}

// ---- the LayerNorm backward with its parameter gradients (cuda_fused.cu, Note [CUDA LayerNorm
// parameter gradients]) -----------------------------------------------------------------------

/// Blocks the fused LayerNorm backward aims at (about 4 resident blocks of 256 threads on each of
/// an H100's / H200's 132 SMs), the fewest rows of one block's chunk, and the chunks whose
/// partials one block adds before the last block adds the groups' sums.
inline constexpr std::int64_t kLnParamsTargetBlocks = 512;
inline constexpr std::int64_t kLnParamsMinChunk = 16;
inline constexpr std::int64_t kLnParamsGroup = 16;

/// How CUDA's layernorm_backward_params splits N rows: `chunks` chunks of `chunk_rows` rows (a
/// multiple of 8, the last chunk the rest), a block each, whose f32 partials [2 C] are added in
/// `groups` groups of kLnParamsGroup consecutive chunks (ascending chunk order, by the block that
/// draws its group's last ticket), then the groups' sums in ascending group order (by the block
/// that draws the last group ticket), in the same launch: the same bits whichever block is last.
/// chunks == 1: no partials. A function of N alone (the block covers all C columns), so the dry
/// run (backend_sim/cost_model.cpp) prices what CUDA does.
struct LnParamsSplit {
  std::int64_t chunk_rows, chunks, groups;
};
constexpr LnParamsSplit layernorm_params_split(std::int64_t rows) {
  if (rows <= kLnParamsMinChunk) return {rows, 1, 1};
  std::int64_t chunk =
      std::max((rows + kLnParamsTargetBlocks - 1) / kLnParamsTargetBlocks, kLnParamsMinChunk);
  chunk = (chunk + 7) / 8 * 8;
  const std::int64_t chunks = (rows + chunk - 1) / chunk;
  if (chunks <= 1) return {rows, 1, 1};
  return {chunk, chunks, (chunks + kLnParamsGroup - 1) / kLnParamsGroup};
}

}  // namespace ditto::detail
