// The cost model against published measurements, each row with the published figure, its source
// (a URL and the words quoted) and the tolerance the tests hold it to:
//  - published_comparisons(): all_reduce bus bandwidth (nccl-tests' busbw) at large sizes and
//    small-message time, for the built-in profiles;
//  - training_cases(): published training runs (llm.c's GPT-2 on 8 A100s / 8 H100s) and the
//    ditto-train dry run that predicts each (same model, batch, dtype and ZeRO stage), made in
//    this process by run_training_cases (backend_sim/published_training.cpp: the Trainer on
//    train::configure_gpt, as ditto-train --model gpt builds it).
// Printed by `ditto-predict-table` (and its alias `ditto-train --predict-table`), copied into the
// docs/prediction.md, and checked by tests/test_cost_model.cpp (NCCL rows) and the PredictTable
// ctests.
//
// Note [Published figures]: a row is a primary public measurement (NVIDIA's NCCL developers, a
// cloud vendor's published nccl-tests output, the training project's own scripts and logs), never
// a figure the cost model was fitted to: the model's constants come from data sheets, NCCL's
// source and micro-benchmarks (backend_sim/profiles.cpp), and this table is the comparison. A
// row whose ratio is outside its tolerance stays in the table marked as a known gap (with why),
// and the tests check that it is still outside, so fixing the model shows up as a test to update
// rather than the gap disappearing silently.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace ditto::sim {

struct PublishedComparison {
  std::string what;            ///< e.g. "all_reduce busbw, 8x H100 SXM, NVLink, ring"
  std::string unit;            ///< "GB/s" (busbw) or "us" (time of one call)
  double predicted = 0;        ///< the cost model's figure
  std::string algorithm;       ///< the algorithm the model used
  double published = 0;        ///< the published figure (> 0)
  std::string published_text;  ///< e.g. "479.98" or "460-480 (midpoint)"
  std::string source;          ///< who published it, where (URL), and the words or table quoted
  double tolerance = 0.15;     ///< |ratio - 1| the tests allow
  /// Outside the tolerance, known and explained in `source` (the tests check it stays outside).
  bool known_gap = false;
  double ratio() const { return published > 0 ? predicted / published : 0.0; }
  bool within_tolerance() const { return published > 0 && std::abs(ratio() - 1.0) <= tolerance; }
};

/// The rows of the NCCL table, with the cost model's predictions computed now.
std::vector<PublishedComparison> published_comparisons();

/// The NCCL table as aligned text (what --predict-table prints first).
std::string format_published_table(const std::vector<PublishedComparison>& rows);

/// One published training run and the ditto-train dry run that predicts it.
struct TrainingCase {
  std::string what;               ///< e.g. "GPT-2 124M, 8x A100 80GB SXM, llm.c"
  std::vector<std::string> args;  ///< the ditto-train arguments of the dry run (no program name)
  std::string metric;             ///< "tokens/s" (the only metric so far)
  std::int64_t seq_len = 1024;    ///< tokens per sample (llm.c's -t): tokens/s = samples/s x this
  std::int64_t tokens_per_step = 0;  ///< the published run's tokens per optimizer step
  double published_step_s = 0;       ///< the published step time (seconds)
  std::string published_text;        ///< the figure as published, e.g. "~300 ms/iter"
  std::string source;                ///< URL and the words quoted
  double tolerance = 0.20;           ///< |ratio - 1| the ctest allows
  bool known_gap = false;            ///< outside the tolerance, known (see `gap`)
  std::string gap;                   ///< why, when known_gap
  /// The published tokens/s: tokens_per_step / published_step_s.
  double published() const { return published_step_s > 0 ? tokens_per_step / published_step_s : 0; }
};

/// A training case and what its dry run predicted.
struct TrainingComparison {
  TrainingCase c;
  double predicted = 0;         ///< tokens/s of the dry run (0: the run failed)
  double predicted_step_s = 0;  ///< its step time
  double peak_memory_gib = 0;   ///< its largest per-device peak (GiB)
  std::string error;            ///< the run's error (e.g. OutOfMemory), else ""
  double ratio() const { return c.published() > 0 ? predicted / c.published() : 0.0; }
  bool within_tolerance() const {
    return error.empty() && predicted > 0 && std::abs(ratio() - 1.0) <= c.tolerance;
  }
};

/// The published training runs (llm.c on 8x A100 80GB and 8x H100) with their dry runs' args.
std::vector<TrainingCase> training_cases();

/// `ditto-train <args>` as one line (for the table and the README).
std::string command_line(const TrainingCase& c);

/// Each training case's dry run (its args as ditto-train --model gpt takes them, made in this
/// process on the Trainer), its tokens/s (samples/s x seq_len) and largest per-device peak
/// memory; a run that fails (out of memory) has its error in its row. Throws InvalidArgument for
/// an arg that ditto-train's dry runs here do not take.
std::vector<TrainingComparison> run_training_cases();

/// Both tables as ditto-predict-table prints them: the NCCL table, a blank line, the training
/// table; `unexplained` the rows outside their tolerance that are not known gaps (marked FAIL).
struct PredictionTables {
  std::string text;
  int unexplained = 0;
  /// "N rows outside their tolerance and not a known gap (marked FAIL)"; "" when none.
  std::string failure() const;
};
PredictionTables prediction_tables();

/// The training table as aligned text; each row says "ok" (within its tolerance), "GAP" (outside,
/// known) or "FAIL" (outside, not known), and the sources and commands follow.
std::string format_training_table(const std::vector<TrainingComparison>& rows);

}  // namespace ditto::sim
