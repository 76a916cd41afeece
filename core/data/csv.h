// data::read_csv: numeric CSV files (features then a label column, or the label anywhere) into a
// host Dataset, with errors that name file, line and column.
#pragma once

#include <cstdint>
#include <string>

#include "core/data/dataset.h"

namespace ditto::data {

enum class CsvHeader : std::uint8_t {
  auto_detect,  ///< the first non-blank line is a header when one of its cells is text (not
                ///< empty and not number-like: "nan", "inf", "1e999", "0x10" and "\"1\"" count
                ///< as bad numbers) and the same cell of the next non-blank line is not (Note
                ///< [CSV header detection] in csv.cpp)
  yes,          ///< skip the first non-blank line (e.g. scikit-learn's "569,30,malignant,benign")
  no,           ///< every line is data
};

struct CsvOptions {
  /// Column holding the label; negative counts from the end (-1 = last column).
  std::int64_t label_column = -1;
  CsvHeader header = CsvHeader::auto_detect;
  char delimiter = ',';
  /// false: labels are non-negative integer class indices (Dataset::labels, i64);
  /// true: the label column is a real-valued target (Dataset::targets [N, 1] f32).
  bool regression = false;
  /// Most cells a line may have (>= 2): a wider line is refused at once, naming it, before its
  /// cells are parsed (a 4-row file of 10^6 columns would make a model of 10^6 inputs).
  std::int64_t max_columns = std::int64_t{1} << 16;
};

/// Read `path`, streamed in chunks (Note [Bounded CSV] in csv.cpp: memory is the numbers read
/// plus one line, never the whole file): every non-blank data line has the same number of cells
/// (>= 2, <= max_columns); each cell is a
/// decimal number (surrounding spaces allowed; CRLF line ends allowed; no quoting; a leading
/// UTF-8 byte-order mark EF BB BF is skipped before the header is detected). The header
/// line, when present, is skipped and may have any number of cells. Features keep their column
/// order with the label column removed. Columns in messages are 1-based cell numbers.
/// Throws ParseError for a file that cannot be opened ("read_csv: cannot open 'x.csv': No such
/// file or directory"), one that is not a regular file ("read_csv: '/dev/zero' is a character
/// device, expected a regular file") or has more than 4 GiB (io::kMaxDataBytes; Note [Bounded
/// reads] in core/io/file.h), an empty file or one with no data rows, a cell that is not a finite
/// number ("x.csv:12:5: expected a number, got 'abc'"; the cell quoted with at most 60 bytes,
/// other bytes than printable ASCII escaped as \xNN), ragged rows ("x.csv:3: expected 65
/// columns (as on line 1), got 64"), a class label that is not a non-negative integer, a NUL
/// byte ("x.csv:1: a NUL byte at byte 1 of the line: expected CSV text, got binary data"), a
/// line of more than 64 MiB or more than max_columns cells;
/// InvalidArgument for a label_column outside the file's columns, max_columns < 2, or a delimiter
/// that is a digit, sign, '.', space or line break.
Dataset read_csv(const std::string& path, const CsvOptions& options = {});

}  // namespace ditto::data
