// Micro-shard bounds of a layer whose input rows are tokens: the module holds bounds over the
// samples of the batch (dim 0, what DataParallel sets); a layer whose input is [B, T, C] reduces
// over its B * T rows, so it scales the bounds by T (Note [Micro-shards] in
// core/numerics/micro_shards.h: the shards still cut the batch between samples, so any device
// count holding whole shards gives the same bits).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/nn/module.h"

namespace ditto::nn {

/// Token-row bounds for a backward over `samples` samples of `per_sample` rows each: the
/// module's micro_shards() (or micro_shard_bounds(samples, kDefaultMicroShards) when empty), each
/// entry times per_sample. Throws InvalidArgument naming `who` when the module's bounds do not
/// end at `samples` ("micro-shards cover X rows, the batch has Y (set_micro_shards before
/// forward)").
std::vector<std::int64_t> token_bounds(const Module& m, const std::string& who,
                                       std::int64_t samples, std::int64_t per_sample);

/// out (+)= the column sums of x [rows, cols] (out: cols elements, contiguous; accumulate: add
/// to it). bitwise: ops::sum_rows_sharded over `bounds` (row offsets); fast: ops::sum_rows
/// (bounds unused). The one place that picks the batch reduction for a column sum.
void row_sums_into(const Tensor& x, Tensor& out, Determinism mode,
                   const std::vector<std::int64_t>& bounds, bool accumulate);

/// p.grad (+)= the column sums of x [rows, cols] (cols == p.data.numel()): allocated on first
/// use, accumulated after. bitwise: ops::sum_rows_sharded over `bounds` (token rows); fast:
/// ops::sum_rows (bounds unused). A bias or LayerNorm parameter's gradient.
void add_row_sums(const Tensor& x, Parameter& p, Determinism mode,
                  const std::vector<std::int64_t>& bounds);

/// "[2, 3] f32 on sim:0", or "an undefined tensor" (for error messages).
std::string describe(const Tensor& t);

}  // namespace ditto::nn
