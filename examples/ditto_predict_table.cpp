// ditto-predict-table: the cost model against published figures (backend_sim/published.h, Note
// [Published figures]): nccl-tests' all_reduce bus bandwidth and small-message time next to the
// cost model's, then dry runs of llm.c's GPT-2 training runs next to their published tokens/s.
// Exit status 1 when a row is outside its tolerance and not a known gap (the ctest then fails
// instead of the table drifting silently). `ditto-train --predict-table` prints the same.
//
//   build/bin/ditto-predict-table
#include <CLI/CLI.hpp>

#include "core/io/file.h"
#include "examples/cli_common.h"
#include "examples/predict_table.h"

int main(int argc, char** argv) {
  ditto::io::occupy_closed_std_fds();  // Note [Lost output], core/io/file.h
  CLI::App app{"ditto-predict-table: the cost model's all_reduce figures and dry runs of llm.c's "
               "GPT-2 runs next to the published figures (status 1 if a row is outside its "
               "tolerance and not a known gap)"};
  ditto_cli::add_version(app, "ditto-predict-table");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ditto_cli::parse_error(app, e, "ditto-predict-table");
  }
  const int rc = ditto_cli::print_prediction_tables("ditto-predict-table");
  return ditto::io::close_stdout(rc, "ditto-predict-table");
}
