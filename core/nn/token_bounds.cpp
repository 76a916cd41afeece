// token_bounds: a module's sample micro-shard bounds scaled to token rows.
#include "core/nn/token_bounds.h"

#include "core/numerics/micro_shards.h"
#include "core/runtime/ops.h"

namespace ditto::nn {

std::vector<std::int64_t> token_bounds(const Module& m, const std::string& who,
                                       std::int64_t samples, std::int64_t per_sample) {
  std::vector<std::int64_t> bounds = m.micro_shards().empty()
                                         ? micro_shard_bounds(samples, kDefaultMicroShards)
                                         : m.micro_shards();
  DITTO_CHECK(bounds.back() == samples, who, ".backward: micro-shards cover ", bounds.back(),
              " rows, the batch has ", samples, " (set_micro_shards before forward)");
  if (per_sample != 1)
    for (std::int64_t& b : bounds) b *= per_sample;
  return bounds;
}

void row_sums_into(const Tensor& x, Tensor& out, Determinism mode,
                   const std::vector<std::int64_t>& bounds, bool accumulate) {
  if (mode == Determinism::bitwise)
    ops::sum_rows_sharded(x, out, bounds, accumulate);
  else
    ops::sum_rows(x, out, accumulate ? 1.0f : 0.0f, mode);
}

void add_row_sums(const Tensor& x, Parameter& p, Determinism mode,
                  const std::vector<std::int64_t>& bounds) {
  const bool acc = p.grad.defined();
  // A new grad is written, not read (sum_rows with beta 0, sum_rows_sharded without
  // accumulate): no zero fill.
  new_grad(p, grad_dtype(p.data.dtype(), mode), x.device(), /*zero=*/false);
  Tensor out = p.grad.dim() == 1 ? p.grad : p.grad.view({-1});
  row_sums_into(x, out, mode, bounds, acc);
}

std::string describe(const Tensor& t) {
  return t.defined() ? t.str() : std::string("an undefined tensor");
}

}  // namespace ditto::nn
