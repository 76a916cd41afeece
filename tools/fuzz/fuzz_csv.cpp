// libFuzzer target: data::read_csv (core/data/csv.h) on a file holding the input.
// Input: one byte of options, then the file's bytes. Options byte: bits 0-1 header
// (auto_detect, yes, no, no), bit 2 regression, bits 3-4 delimiter (',' ';' '\t' '|'),
// bits 5-7 label_column (-1, -2, 0, 1, 2, -3, 3, 100). Seeds: corpus/csv/.
// A ditto::Error is the expected refusal; any other exception or a crash is a finding.
#include <cstdint>
#include <cstring>
#include <string>

#include "core/base/error.h"
#include "core/data/csv.h"
#include "tools/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  ditto::data::CsvOptions o;
  const std::uint8_t opt = data[0];
  static const ditto::data::CsvHeader headers[] = {
      ditto::data::CsvHeader::auto_detect, ditto::data::CsvHeader::yes, ditto::data::CsvHeader::no,
      ditto::data::CsvHeader::no};
  o.header = headers[opt & 3];
  o.regression = (opt >> 2) & 1;
  o.delimiter = ",;\t|"[(opt >> 3) & 3];
  static const std::int64_t labels[] = {-1, -2, 0, 1, 2, -3, 3, 100};
  o.label_column = labels[(opt >> 5) & 7];
  const std::string path = ditto_fuzz::scratch_dir() + "/input.csv";
  ditto_fuzz::write_bytes(path,
                          std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  try {
    ditto::data::Dataset d = ditto::data::read_csv(path, o);
    // A dataset it accepts has consistent shapes.
    const std::int64_t rows = d.features.shape()[0];
    if (o.regression ? d.targets.shape()[0] != rows : d.labels.shape()[0] != rows) std::abort();
  } catch (const ditto::Error&) {
  }
  return 0;
}
