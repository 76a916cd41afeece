// The cost model against published measurements: all_reduce bus bandwidth (nccl-tests' busbw)
// at large sizes and small-message latency, for the built-in profiles, each row with the
// published figure and its source. Printed by `ditto-train --predict-table`, copied into the
// README, and checked by tests/test_cost_model.cpp (each ratio within 15%).
#pragma once

#include <string>
#include <vector>

namespace ditto::sim {

struct PublishedComparison {
  std::string what;        ///< e.g. "all_reduce busbw, 8x H100 SXM, NVLink, ring"
  std::string unit;        ///< "GB/s" (busbw) or "us" (time of one call)
  double predicted = 0;    ///< the cost model's figure
  std::string algorithm;   ///< the algorithm the model used
  double published = 0;    ///< the published figure; 0 when none was found
  std::string published_text;  ///< e.g. "370" or "460-480 (midpoint)"
  std::string source;
  double ratio() const { return published > 0 ? predicted / published : 0.0; }
};

/// The rows of the table, with the cost model's predictions computed now.
std::vector<PublishedComparison> published_comparisons();

/// The table as aligned text (what --predict-table prints).
std::string format_published_table(const std::vector<PublishedComparison>& rows);

}  // namespace ditto::sim
