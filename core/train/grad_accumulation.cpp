// Gradient accumulation (Note [Gradient accumulation] in grad_accumulation.h): micro-step rows,
// the config checks and the canonical tree over micro-steps.
#include "core/train/grad_accumulation.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/base/error.h"
#include "core/comm/comm.h"
#include "core/numerics/micro_shards.h"
#include "core/runtime/ops.h"
#include "core/train/trainer_config.h"

namespace ditto::train {

namespace {

bool is_power_of_two(std::int64_t v) { return v >= 1 && (v & (v - 1)) == 0; }

/// The smallest share that holds rows of a batch of `rows` rows over the ranks that split it in
/// fast mode (DistributedDataParallel::local_rows: torch.chunk's parts, comm::chunk_range), and
/// how many ranks it leaves without rows (they run their micro-steps empty).
std::pair<std::int64_t, int> smallest_share(std::int64_t rows, int world) {
  std::int64_t least = rows;
  int empty = 0;
  for (int r = 0; r < world; ++r) {
    const auto [lo, hi] = comm::chunk_range(rows, world, r);
    if (hi == lo)
      ++empty;
    else
      least = std::min(least, hi - lo);
  }
  return {least, empty};
}

}  // namespace

MicroBatch micro_batch(std::int64_t global_rows, std::int64_t micro_shards, int world, int rank,
                       std::int64_t steps, std::int64_t step, Determinism mode) {
  DITTO_CHECK(global_rows >= 0, "micro_batch: global_rows: expected >= 0, got ", global_rows);
  DITTO_CHECK(is_power_of_two(micro_shards),
              "micro_batch: micro_shards: expected a power of two, "
              "got ",
              micro_shards);
  DITTO_CHECK(world >= 1 && (world <= micro_shards || mode != Determinism::bitwise),
              "micro_batch: world: expected 1..micro_shards (", micro_shards,
              ") in bitwise mode, got ", world);
  DITTO_CHECK(rank >= 0 && rank < world, "micro_batch: rank: expected 0..", world - 1, ", got ",
              rank);
  DITTO_CHECK(steps >= 1, "micro_batch: steps: expected >= 1, got ", steps);
  DITTO_CHECK(step >= 0 && step < steps, "micro_batch: step: expected 0..", steps - 1, ", got ",
              step);
  MicroBatch m;
  if (mode == Determinism::bitwise) {
    const std::vector<std::int64_t> g = micro_shard_bounds(global_rows, micro_shards);
    DITTO_CHECK(micro_shards % (static_cast<std::int64_t>(world) * steps) == 0,
                "micro_batch: bitwise mode needs micro_shards divisible by world x steps, got ",
                micro_shards, " micro-shards, world ", world, ", steps ", steps);
    const std::int64_t per = micro_shards / (world * steps);
    const std::int64_t first = rank * (micro_shards / world) + step * per;
    m.first_row = g[static_cast<std::size_t>(first)];
    m.end_row = g[static_cast<std::size_t>(first + per)];
    m.shard_bounds = local_bounds(g, first, first + per);
    return m;
  }
  // Fast mode: the rank's rows as DistributedDataParallel::local_rows gives them (torch.chunk).
  const auto [lo, hi] = comm::chunk_range(global_rows, world, rank);
  const std::int64_t n = hi - lo;
  // floor(step * n / steps) without overflow: n = q * steps + r.
  auto cut = [&](std::int64_t s) { return s * (n / steps) + (s * (n % steps)) / steps; };
  m.first_row = lo + cut(step);
  m.end_row = lo + cut(step + 1);
  return m;
}

void check_grad_accumulation(const TrainerConfig& c, int devices) {
  const std::int64_t k = c.grad_accum_steps, m = c.micro_shards;
  DITTO_CHECK(k >= 1, c.name_of("grad_accum_steps"), ": expected >= 1, got ", k);
  if (k == 1) return;
  if (c.determinism == Determinism::bitwise) {
    DITTO_CHECK(is_power_of_two(k), c.name_of("grad_accum_steps"),
                ": bitwise mode folds the micro-steps with the canonical tree over a power of two "
                "of them (Note [Gradient accumulation]): expected a power of two, got ",
                k);
    // The micro-shards are a power of two: no count of them divides evenly over another
    // number of devices, whatever --micro-shards says (session 56: the advice to raise it could
    // never work on 3 devices).
    const std::string dev = devices_name(c, devices), mode = c.name_of("determinism");
    const std::string shards = c.name_of("micro_shards"), steps = c.name_of("grad_accum_steps");
    DITTO_CHECK(is_power_of_two(devices), steps, " x ", dev,
                ": bitwise mode gives every micro-step of every device whole micro-shards, and ",
                shards, " is a power of two: expected a power-of-two device count (1, 2, 4, ...) ",
                "with ", steps, " ", k, ", got ", dev, " ", devices, " (use ", mode,
                " fast, a power-of-two ", dev, ", or ", steps, " 1)");
    DITTO_CHECK(m % (k * devices) == 0, c.name_of("grad_accum_steps"), " x ", dev,
                ": bitwise mode gives every micro-step of every device whole "
                "micro-shards: expected ",
                c.name_of("micro_shards"), " (", m, ") divisible by ",
                c.name_of("grad_accum_steps"), " (", k, ") x ", dev, " (", devices,
                ") = ", k * devices, " (raise ", c.name_of("micro_shards"), " or lower ",
                c.name_of("grad_accum_steps"), ")");
    return;
  }
  check_micro_batch_rows(c, devices, c.batch_size);
}

void check_micro_batch_rows(const TrainerConfig& c, int devices, std::int64_t rows) {
  const std::int64_t k = c.grad_accum_steps;
  if (k == 1 || c.determinism == Determinism::bitwise) return;
  const int world = c.trainer == TrainerKind::ddp ? devices : 1;
  if (rows == 0) return;  // no rank holds rows
  const auto [least, empty] = smallest_share(rows, world);
  const std::string share =
      world == 1 ? detail::cat("the rows of a batch of ", rows)
      : empty == 0
          ? detail::cat("the smallest share of a batch of ", rows, " rows over ", world, " ranks")
          : detail::cat("the smallest share of a batch of ", rows, " rows over ", world,
                        " ranks, of the ", world - empty, " given rows; torch.chunk's split gives ",
                        empty,
                        empty == 1 ? " rank none, which runs its" : " ranks none, which run their",
                        " micro-steps empty");
  DITTO_CHECK(least >= k, c.name_of("grad_accum_steps"), ": every micro-step ",
              world == 1   ? ""
              : empty == 0 ? "of every rank "
                           : "of every rank holding rows ",
              "needs at least one row: expected at most ", least, " (", share, "), got ", k,
              " (raise ", c.name_of("batch_size"), " or lower ", c.name_of("grad_accum_steps"),
              ")");
}

void GradAccumulator::add_into(Entry& older, Entry& newer) {
  for (std::size_t i = 0; i < older.grads.size(); ++i) {
    Tensor& a = older.grads[i];
    Tensor& b = newer.grads[i];
    if (!b.defined()) continue;  // zeros
    if (!a.defined()) {
      a = std::move(b);
      continue;
    }
    // The tree node: a = a + b, one add per element (Note [Gradient accumulation]).
    ops::reduce_inputs({a, b}, a, /*sum=*/0, Determinism::bitwise);
  }
  older.size += newer.size;
}

void GradAccumulator::push(const std::vector<nn::Parameter*>& params) {
  DITTO_CHECK(stack_.empty() || stack_.back().grads.size() == params.size(),
              "GradAccumulator.push: params: expected ",
              stack_.empty() ? 0 : stack_.back().grads.size(),
              " parameters (as the first push), got ", params.size());
  Entry e;
  e.size = 1;
  e.grads.reserve(params.size());
  for (nn::Parameter* p : params) {
    e.grads.push_back(std::move(p->grad));
    p->grad = Tensor();
  }
  stack_.push_back(std::move(e));
  ++leaves_;
  // Binary counter: merge the top two while they are complete subtrees of the same size.
  while (stack_.size() >= 2 && stack_[stack_.size() - 2].size == stack_.back().size) {
    add_into(stack_[stack_.size() - 2], stack_.back());
    stack_.pop_back();
  }
}

void GradAccumulator::finish(const std::vector<nn::Parameter*>& params) {
  DITTO_CHECK(!stack_.empty(), "GradAccumulator.finish: nothing was pushed");
  DITTO_CHECK(stack_.back().grads.size() == params.size(),
              "GradAccumulator.finish: params: "
              "expected ",
              stack_.back().grads.size(), " parameters (as pushed), got ", params.size());
  // The rest of the canonical tree: fold from the top, v = entry + v (a power-of-two count of
  // leaves leaves one entry).
  while (stack_.size() >= 2) {
    add_into(stack_[stack_.size() - 2], stack_.back());
    stack_.pop_back();
  }
  for (std::size_t i = 0; i < params.size(); ++i)
    params[i]->grad = std::move(stack_.back().grads[i]);
  stack_.clear();
  leaves_ = 0;
}

}  // namespace ditto::train
