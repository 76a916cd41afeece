// Counter-based random numbers: Philox 4x32-10 (Random123, as in cuRAND), keyed by a seed, a
// stream id and the logical index of what is drawn, never by thread or device, so that parameter
// initialisation, shuffling and splitting give the same numbers on every backend and any device
// count (../DESIGN.md, determinism rule 5).
//
// Note [Philox layout]
// philox_u32(seed, stream, index) runs Philox4x32-10 with key = {seed lo, seed hi} and counter =
// {(index/4) lo, (index/4) hi, stream lo, stream hi} and returns lane index % 4 of the 4-word
// block. This is the layout of cuRAND's curandStatePhilox4_32_10_t after
// curand_init(seed, subsequence = stream, offset = index), so a CUDA kernel can draw the same
// numbers with cuRAND or with Random123 directly. The Random123 header is included only in
// random.cpp; this header has no dependency on it.
//
// Note [Random streams]
// Stream ids are 64 bits: kind << 48 | sub (stream_id below). Kinds in use:
//   kStreamInit      (1): parameter initialisation; sub = layer id (nn::Linear's layer_id; nn::mlp
//                         numbers its Linear layers 0, 1, 2, ...). Within a layer's stream the
//                         weight takes indices [0, out*in) and the bias [out*in, out*in + out).
//   kStreamShuffle   (2): data::DataLoader's per-epoch permutation; sub = epoch.
//   kStreamSplit     (3): data::train_val_split's permutation; sub = 0.
//   kStreamSynthetic (4): synthetic data sets in tests, examples and benchmarks; sub = free for the
//                         caller (e.g. 0 features, 1 labels).
//   kStreamDropout   (5): dropout masks of sites < 256; sub = step << 8 | site (Note [Dropout
//                         masks] in core/numerics/gpt_math.h); index = the element's index in the
//                         global batch.
//   kStreamSample    (6): nn::GPT::generate's sampling; sub = 0, index = the generated token's
//   index. kStreamBatch     (7): train::TextDataSource's batch windows; sub = step, index = window
//   j. kStreamEvalBatch (8): train::TextDataSource's evaluation windows; sub = split << 32 | batch
//                         (split 0 train, 1 val), index = window j (Note [Text batches]).
//   kStreamDropoutWide (9): dropout masks of sites 256 .. 2^16 - 1 (GPTs deeper than 85 layers);
//                         sub = step << 16 | site, index as kStreamDropout's (Note [Dropout
//                         masks]).
// Kind 0 is left for callers' ad-hoc use; add new kinds here, never reuse one.
#pragma once

#include <cstdint>
#include <vector>

namespace ditto {

constexpr std::uint64_t kStreamInit = 1;
constexpr std::uint64_t kStreamShuffle = 2;
constexpr std::uint64_t kStreamSplit = 3;
constexpr std::uint64_t kStreamSynthetic = 4;
constexpr std::uint64_t kStreamDropout = 5;
constexpr std::uint64_t kStreamSample = 6;
constexpr std::uint64_t kStreamBatch = 7;
constexpr std::uint64_t kStreamEvalBatch = 8;
constexpr std::uint64_t kStreamDropoutWide = 9;

/// The stream id for `kind` (one of the kStream* constants) and `sub` (< 2^48; higher bits are
/// dropped) (Note [Random streams]).
constexpr std::uint64_t stream_id(std::uint64_t kind, std::uint64_t sub) {
  return (kind << 48) | (sub & ((std::uint64_t(1) << 48) - 1));
}

/// The raw Philox4x32-10 block for a counter and key (Random123's philox4x32): out[0..3].
void philox4x32_10(const std::uint32_t counter[4], const std::uint32_t key[2],
                   std::uint32_t out[4]);

/// Random 32-bit word number `index` of stream `stream` under `seed` (Note [Philox layout]).
std::uint32_t philox_u32(std::uint64_t seed, std::uint64_t stream, std::uint64_t index);

/// Random 64-bit word: philox_u32(.., 2*index) in the high half, philox_u32(.., 2*index+1) low.
std::uint64_t philox_u64(std::uint64_t seed, std::uint64_t stream, std::uint64_t index);

/// Uniform float in [0, 1) with 24 random bits: (philox_u32 >> 8) * 2^-24 (exact).
float uniform01(std::uint64_t seed, std::uint64_t stream, std::uint64_t index);

/// Uniform float in [lo, hi): lo + (hi - lo) * uniform01 (like torch.Tensor.uniform_), with a
/// result that rounds up to hi replaced by the largest float below hi. Throws InvalidArgument
/// unless lo < hi (both finite).
float uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index, float lo, float hi);

/// A random permutation of 0..n-1: indices sorted by their 64-bit keys philox_u64(seed, stream,
/// i), ties by index. Identical on every platform (unlike std::shuffle, whose algorithm is
/// implementation-defined). Throws InvalidArgument for n < 0.
std::vector<std::int64_t> permutation(std::int64_t n, std::uint64_t seed, std::uint64_t stream);

}  // namespace ditto
