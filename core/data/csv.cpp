// read_csv: a small strict parser for numeric CSV (no quoting), one pass over the file's text.
#include "core/data/csv.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>
#include <vector>

#include "core/io/file.h"
#include "core/runtime/error.h"

namespace ditto::data {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

void split(std::string_view line, char delim, std::vector<std::string_view>& cells) {
  cells.clear();
  std::size_t start = 0;
  for (;;) {
    std::size_t pos = line.find(delim, start);
    if (pos == std::string_view::npos) {
      cells.push_back(trim(line.substr(start)));
      return;
    }
    cells.push_back(trim(line.substr(start, pos - start)));
    start = pos + 1;
  }
}

// Parse a whole cell as a finite number of type T (float or double); false otherwise.
template <typename T>
bool parse_number(std::string_view cell, T& out) {
  if (!cell.empty() && cell.front() == '+') cell.remove_prefix(1);  // from_chars rejects '+'
  if (cell.empty() || cell.front() == '+' || cell.front() == ' ') return false;
  const char* end = cell.data() + cell.size();
  auto [ptr, ec] = std::from_chars(cell.data(), end, out, std::chars_format::general);
  return ec == std::errc() && ptr == end && std::isfinite(out);
}

// A header cell: non-empty and not even number-like (empty cells, "nan" and "inf" count as bad
// data, so a first data line with such a cell is reported rather than skipped as a header).
bool is_text(std::string_view cell) {
  if (cell.empty()) return false;
  if (cell.front() == '+') cell.remove_prefix(1);
  double v;
  const char* end = cell.data() + cell.size();
  auto [ptr, ec] = std::from_chars(cell.data(), end, v, std::chars_format::general);
  return !(ptr == end && (ec == std::errc() || ec == std::errc::result_out_of_range));
}

}  // namespace

Dataset read_csv(const std::string& path, const CsvOptions& options) {
  const char delim = options.delimiter;
  DITTO_CHECK(delim != '\0' && std::strchr("0123456789+-.eE \r\n", delim) == nullptr,
              "read_csv: delimiter: expected a character that cannot appear in a number, got '",
              delim, "'");

  std::string text;
  try {
    text = io::read_file(path, io::kMaxDataBytes, "read_csv");  // Note [Bounded reads]
  } catch (const ParseError&) {
    throw;
  } catch (const Error& e) {
    throw ParseError(e.what());
  }

  std::vector<float> features;
  std::vector<std::int64_t> labels;
  std::vector<float> targets;
  std::vector<std::string_view> cells;
  std::int64_t ncols = -1, first_data_line = 0, label_col = 0, rows = 0;
  bool seen_first_line = false;
  std::int64_t line_no = 0;
  // A UTF-8 byte-order mark (Excel's "CSV UTF-8", Notepad) is not part of the first cell: left
  // in, it made a first data line text, so a header, silently.
  std::size_t pos = text.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (trim(line).empty()) continue;
    split(line, delim, cells);

    if (!seen_first_line) {
      seen_first_line = true;
      bool header = options.header == CsvHeader::yes;
      if (options.header == CsvHeader::auto_detect) {
        for (auto c : cells) header = header || is_text(c);
      }
      if (header) continue;
    }

    const auto n = static_cast<std::int64_t>(cells.size());
    if (ncols < 0) {
      ncols = n;
      first_data_line = line_no;
      if (ncols < 2)
        throw ParseError(detail::cat(path, ":", line_no, ": expected at least 2 columns ",
                                     "(features and a label), got ", ncols));
      DITTO_CHECK(options.label_column >= -ncols && options.label_column < ncols,
                  "read_csv: label_column: expected a column in [", -ncols, ", ", ncols - 1,
                  "] for '", path, "' (", ncols, " columns), got ", options.label_column);
      label_col = options.label_column < 0 ? ncols + options.label_column : options.label_column;
    } else if (n != ncols) {
      throw ParseError(detail::cat(path, ":", line_no, ": expected ", ncols,
                                   " columns (as on line ", first_data_line, "), got ", n));
    }

    for (std::int64_t c = 0; c < ncols; ++c) {
      const std::string_view cell = cells[static_cast<std::size_t>(c)];
      if (c == label_col) {
        double v;
        if (!parse_number(cell, v))
          throw ParseError(
              detail::cat(path, ":", line_no, ":", c + 1, ": expected a number, got '", cell, "'"));
        if (options.regression) {
          targets.push_back(static_cast<float>(v));
        } else {
          if (!(v >= 0.0 && v < 9007199254740992.0 && v == std::floor(v)))
            throw ParseError(detail::cat(path, ":", line_no, ":", c + 1,
                                         ": expected a non-negative integer class label, got '",
                                         cell, "'"));
          labels.push_back(static_cast<std::int64_t>(v));
        }
      } else {
        float v;
        if (!parse_number(cell, v))
          throw ParseError(
              detail::cat(path, ":", line_no, ":", c + 1, ": expected a number, got '", cell, "'"));
        features.push_back(v);
      }
    }
    ++rows;
  }

  if (!seen_first_line) throw ParseError(detail::cat("read_csv: '", path, "' is empty"));
  if (rows == 0)
    throw ParseError(detail::cat("read_csv: '", path, "' has a header line but no data rows"));

  Dataset d;
  d.features = Tensor::from_vector(features, {rows, ncols - 1});
  if (options.regression)
    d.targets = Tensor::from_vector(targets, {rows, 1});
  else
    d.labels = Tensor::from_vector(labels, {rows});
  return d;
}

}  // namespace ditto::data
