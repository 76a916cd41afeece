// The dry runs of the published training runs (backend_sim/published.h): each case's ditto-train
// args as a TrainerConfig through train::configure_gpt, run in this process.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend_sim/published.h"
#include "backend_sim/sim_run.h"
#include "core/base/error.h"
#include "core/numerics/determinism.h"
#include "core/train/gpt_recipe.h"
#include "core/train/trainer.h"

namespace ditto::sim {

namespace {

/// The run of `args` (ditto-train's options of a GPT dry run: llmc_run's) as ditto-train builds it.
TrainingComparison run_case(const TrainingCase& tc) {
  TrainingComparison row;
  row.c = tc;
  train::TrainerConfig c;
  train::GptSettings g;
  SimRunOptions sim;
  const std::vector<std::string>& a = tc.args;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == "--dry-run") {
      c.dry_run = true;
      continue;
    }
    DITTO_CHECK(i + 1 < a.size(), "run_training_cases: ", tc.what, ": expected a value after ",
                a[i]);
    const std::string& v = a[++i];
    const std::int64_t n = std::atoll(v.c_str());
    if (a[i - 1] == "--model")
      DITTO_CHECK(v == "gpt", "run_training_cases: expected --model gpt");
    else if (a[i - 1] == "--preset")
      g.preset = v;
    else if (a[i - 1] == "--profile")
      sim.profile = v;
    else if (a[i - 1] == "--devices")
      c.devices = static_cast<int>(n);
    else if (a[i - 1] == "--trainer")
      c.trainer = train::parse_trainer_kind(v, "--trainer");
    else if (a[i - 1] == "--batch-size")
      c.batch_size = n, g.given.insert("batch_size");
    else if (a[i - 1] == "--dtype")
      c.dtype = v == "bf16" ? DType::bf16 : v == "f16" ? DType::f16 : DType::f32;
    else if (a[i - 1] == "--zero-stage")
      c.zero_stage = static_cast<int>(n);
    else if (a[i - 1] == "--determinism")
      c.determinism = parse_determinism(v);
    else if (a[i - 1] == "--max-iters")
      g.max_iters = n, g.given.insert("max_iters");
    else if (a[i - 1] == "--eval-iters")
      g.eval_iters = n, g.given.insert("eval_iters");
    else if (a[i - 1] == "--sample")
      g.sample = n, g.given.insert("sample");
    else if (a[i - 1] == "--grad-accum-steps")
      c.grad_accum_steps = n;
    else
      DITTO_CHECK(false, "run_training_cases: ", tc.what,
                  ": expected an option of a GPT dry "
                  "run, got ",
                  a[i - 1]);
  }
  try {
    train::GptRun run = train::configure_gpt(g, c);
    add_sim_run(c, sim);
    const train::FitResult r = train::Trainer(c, run.source).fit();
    if (const auto& p = r.prediction) {
      row.predicted_step_s = p->step_time_s;
      row.predicted = p->samples_per_s * static_cast<double>(tc.seq_len);
    } else {
      row.error = "the run made no prediction";
    }
    for (const train::DeviceMemory& m : r.memory)
      row.peak_memory_gib =
          std::max(row.peak_memory_gib, static_cast<double>(m.stats.peak) / 1073741824.0);
  } catch (const std::exception& e) {
    row.error = e.what();
  }
  return row;
}

}  // namespace

std::vector<TrainingComparison> run_training_cases() {
  std::vector<TrainingComparison> rows;
  for (const TrainingCase& tc : training_cases()) rows.push_back(run_case(tc));
  return rows;
}

std::string PredictionTables::failure() const {
  if (unexplained == 0) return "";
  return detail::cat(unexplained, " row", unexplained > 1 ? "s" : "", " outside ",
                     unexplained > 1 ? "their" : "its",
                     " tolerance and not a known gap (marked "
                     "FAIL)");
}

PredictionTables prediction_tables() {
  // Note [Published figures]: a row outside its tolerance that is not a known gap counts, so the
  // ctest fails instead of the table drifting silently.
  PredictionTables t;
  const auto nccl = published_comparisons();
  t.text = format_published_table(nccl) + "\n";
  const auto training = run_training_cases();
  t.text += format_training_table(training);
  for (const auto& r : nccl) t.unexplained += !r.within_tolerance() && !r.known_gap;
  for (const auto& r : training) t.unexplained += !r.within_tolerance() && !r.c.known_gap;
  return t;
}

}  // namespace ditto::sim
