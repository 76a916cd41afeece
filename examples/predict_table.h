// The prediction tables as ditto-predict-table prints them (backend_sim/published.h), which
// `ditto-train --predict-table`, its alias, prints too: one function, so the alias is that
// program, and its ctest checks only that it gets here (DittoTrainCli.PredictTable).
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>

#include "backend_sim/published.h"

namespace ditto_cli {

/// Prints the NCCL table and the training table on stdout; returns the exit status: 1 when a row
/// is outside its tolerance and not a known gap ("PROG: N rows outside ..." on stderr) or on an
/// error ("PROG: error: ..."), else 0. stdout is tried first with a write of 0 bytes, so that one
/// that cannot take the table (/dev/full) fails at once, before the dry runs: "PROG: error:
/// cannot write the table to stdout: No space left on device".
inline int print_prediction_tables(const char* prog) {
  if (::write(STDOUT_FILENO, "", 0) < 0) {
    std::fprintf(stderr, "%s: error: cannot write the table to stdout: %s\n", prog,
                 std::strerror(errno));
    return 1;
  }
  try {
    const ditto::sim::PredictionTables t = ditto::sim::prediction_tables();
    std::fputs(t.text.c_str(), stdout);
    if (t.unexplained > 0) std::fprintf(stderr, "%s: %s\n", prog, t.failure().c_str());
    return t.unexplained > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", prog, e.what());
    return 1;
  }
}

}  // namespace ditto_cli
