// read_csv: a small strict parser for numeric CSV (no quoting), streamed line by line: the file is
// read in chunks, never whole (Note [Bounded CSV]).
#include "core/data/csv.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include "core/base/error.h"
#include "core/io/file.h"

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

// A number in some notation, accepted as data or not: decimal (also out of range, "nan", "inf"),
// hexadecimal ("0x10", "-0X1p3"), or either inside one pair of quotes ("\"1\"", "'2'"). Such a
// cell is bad data, never a column name: a first line of them is reported, not skipped.
bool is_number_like(std::string_view cell) {
  if (cell.size() >= 2 && (cell.front() == '"' || cell.front() == '\'') &&
      cell.back() == cell.front())
    cell = trim(cell.substr(1, cell.size() - 2));
  if (!cell.empty() && (cell.front() == '+' || cell.front() == '-')) cell.remove_prefix(1);
  auto fmt = std::chars_format::general;
  if (cell.size() > 2 && cell[0] == '0' && (cell[1] == 'x' || cell[1] == 'X')) {
    cell.remove_prefix(2);
    fmt = std::chars_format::hex;
  }
  if (cell.empty()) return false;
  double v;
  const char* end = cell.data() + cell.size();
  auto [ptr, ec] = std::from_chars(cell.data(), end, v, fmt);
  return ptr == end && (ec == std::errc() || ec == std::errc::result_out_of_range);
}

// Why a refused data cell that is a number in some notation (out of range, nan, inf,
// hexadecimal, quoted) is not taken: 1e308 is a number, but not one an f32 feature holds. "" for
// a cell that is no number at all.
const char* why_not_a_number(std::string_view cell, bool f32) {
  if (!is_number_like(cell)) return "";
  return f32 ? " (features are finite decimal numbers within f32's range, |x| <= 3.4028235e38, "
               "unquoted; hexadecimal, nan and inf are refused)"
             : " (labels are finite decimal numbers, unquoted; hexadecimal, nan and inf are "
               "refused)";
}

// A header cell: non-empty and not number-like (empty cells, "nan" and "inf" count as bad data,
// so a first data line with such a cell is reported rather than skipped as a header).
bool is_text(std::string_view cell) { return !cell.empty() && !is_number_like(cell); }

// Note [CSV header detection]
// CsvHeader::auto_detect takes the first non-blank line as a header when one of its cells is text
// (is_text) and the same cell of the next non-blank line is not (a number, or a bad number that
// the data line then reports), or that line has no such cell, or there is no next line. So a
// first line that is data in a form read_csv rejects ("1","2","0" quoted; 0x10 hexadecimal;
// "1;2;0" with another delimiter) is reported on line 1, where the problem is, instead of being
// dropped silently and the same problem reported on line 2: the header decision follows how the
// data cells are parsed.
bool is_header(const std::vector<std::string_view>& first,
               const std::vector<std::string_view>* next) {
  for (std::size_t c = 0; c < first.size(); ++c) {
    if (!is_text(first[c])) continue;
    if (next == nullptr || c >= next->size() || !is_text((*next)[c])) return true;
  }
  return false;
}

// A cell (or line) quoted for a message: at most kQuoteBytes bytes, a backslash and every byte
// outside printable ASCII escaped (\\, \xNN), the length said when cut, so that a 10 MB cell or
// one with NUL bytes gives a short message that is whole.
constexpr std::size_t kQuoteBytes = 60;
std::string quoted(std::string_view cell) {
  std::string out = "'";
  const std::size_t n = std::min(cell.size(), kQuoteBytes);
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = static_cast<unsigned char>(cell[i]);
    if (b == '\\') {
      out += "\\\\";
    } else if (b >= 0x20 && b < 0x7f) {
      out += static_cast<char>(b);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", b);
      out += hex;
    }
  }
  out += '\'';
  if (cell.size() > n) out += detail::cat("... (", cell.size(), " bytes)");
  return out;
}

// Note [Bounded CSV]
// read_csv reads the file in chunks of kChunkBytes and keeps one line at a time (and the first
// line, for Note [CSV header detection]), so its memory is the parsed numbers plus at most
// kMaxLineBytes of text, not the file. A line longer than kMaxLineBytes, a line with more than
// CsvOptions::max_columns cells, and a NUL byte anywhere (a binary file, e.g. 3 GiB of zeros,
// which used to be read whole and reported as "a header line but no data rows") are each refused
// at the line where they are found, naming it.
constexpr std::size_t kChunkBytes = std::size_t{1} << 20;     // 1 MiB
constexpr std::size_t kMaxLineBytes = std::size_t{64} << 20;  // 64 MiB

class LineReader {
 public:
  LineReader(const std::string& path, io::InputFile& in) : path_(path), in_(in) {}

  /// The next line (without '\n') in `line`, valid until the next call; false at the end.
  bool next(std::string_view& line) {
    for (;;) {
      const std::size_t eol = buf_.find('\n', scan_);
      if (eol != std::string::npos || (done_ && start_ < buf_.size())) {
        const std::size_t end = eol == std::string::npos ? buf_.size() : eol;
        line = std::string_view(buf_).substr(start_, end - start_);
        start_ = scan_ = end + 1;
        ++line_no_;
        return true;
      }
      if (done_) return false;
      scan_ = buf_.size();
      if (buf_.size() - start_ > kMaxLineBytes) {
        throw ParseError(detail::cat(path_, ":", line_no_ + 1, ": a line of more than ",
                                     io::size_name(kMaxLineBytes), " (no line break in its first ",
                                     buf_.size() - start_, " bytes): expected CSV text"));
      }
      if (start_ > 0) {  // keep only the unfinished line
        buf_.erase(0, start_);
        scan_ -= start_;
        start_ = 0;
      }
      const std::uint64_t left = in_.size() - read_;
      const std::uint64_t n = std::min<std::uint64_t>(left, kChunkBytes);
      if (n == 0) {
        done_ = true;
        continue;
      }
      const std::size_t had = buf_.size();
      in_.read(buf_, n);
      read_ += n;
      check_nul(had);
    }
  }
  std::int64_t line_no() const { return line_no_; }

 private:
  // Each chunk is searched once, as it comes: a binary file fails in its first chunk.
  void check_nul(std::size_t from) const {
    const void* nul = std::memchr(buf_.data() + from, '\0', buf_.size() - from);
    if (nul == nullptr) return;
    const std::size_t at = static_cast<std::size_t>(static_cast<const char*>(nul) - buf_.data());
    std::int64_t line_no = line_no_ + 1;  // lines before buf_[start_] are counted
    std::size_t line_start = start_;
    for (std::size_t i = start_; i < at; ++i)
      if (buf_[i] == '\n') {
        ++line_no;
        line_start = i + 1;
      }
    throw ParseError(detail::cat(path_, ":", line_no, ": a NUL byte at byte ", at - line_start + 1,
                                 " of the line: expected CSV text, got binary data"));
  }

  const std::string& path_;
  io::InputFile& in_;
  std::string buf_;
  std::size_t start_ = 0, scan_ = 0;
  std::uint64_t read_ = 0;
  std::int64_t line_no_ = 0;
  bool done_ = false;
};

}  // namespace

Dataset read_csv(const std::string& path, const CsvOptions& options) {
  const char delim = options.delimiter;
  DITTO_CHECK(delim != '\0' && std::strchr("0123456789+-.eE \r\n", delim) == nullptr,
              "read_csv: delimiter: expected a character that cannot appear in a number, got '",
              delim, "'");
  DITTO_CHECK(options.max_columns >= 2, "read_csv: max_columns: expected >= 2, got ",
              options.max_columns);

  auto as_parse_error = [](auto&& fn) -> decltype(fn()) {
    try {
      return fn();
    } catch (const ParseError&) {
      throw;
    } catch (const Error& e) {
      throw ParseError(e.what());
    }
  };
  // Note [Bounded reads]: a regular file of at most 4 GiB; read in chunks (Note [Bounded CSV]).
  std::unique_ptr<io::InputFile> in = as_parse_error(
      [&] { return std::make_unique<io::InputFile>(path, io::kMaxDataBytes, "read_csv"); });
  LineReader reader(path, *in);

  std::vector<float> features;
  std::vector<std::int64_t> labels;
  std::vector<float> targets;
  std::vector<std::string_view> cells, first_cells;
  std::string first_text;  // the first line, held until the next one decides if it is a header
  std::int64_t ncols = -1, first_data_line = 0, label_col = 0, rows = 0, first_line_no = 0;
  bool seen_first_line = false, first_pending = false;

  auto add_row = [&](std::int64_t line_no, std::string_view line,
                     const std::vector<std::string_view>& row) {
    const auto n = static_cast<std::int64_t>(row.size());
    if (ncols < 0) {
      ncols = n;
      first_data_line = line_no;
      if (ncols < 2) {
        std::string hint;  // another delimiter is the usual cause
        for (char other : {';', '\t', '|', ','})
          if (other != delim && line.find(other) != std::string_view::npos) {
            hint = detail::cat(" (the line holds ", quoted(std::string_view(&other, 1)),
                               ": is the file separated by it rather than ",
                               quoted(std::string_view(&delim, 1)), "?)");
            break;
          }
        throw ParseError(detail::cat(path, ":", line_no, ": expected at least 2 columns ",
                                     "(features and a label), got ", ncols, hint));
      }
      DITTO_CHECK(options.label_column >= -ncols && options.label_column < ncols,
                  "read_csv: label_column: expected a column in [", -ncols, ", ", ncols - 1,
                  "] for '", path, "' (", ncols, " columns), got ", options.label_column);
      label_col = options.label_column < 0 ? ncols + options.label_column : options.label_column;
    } else if (n != ncols) {
      throw ParseError(detail::cat(path, ":", line_no, ": expected ", ncols,
                                   " columns (as on line ", first_data_line, "), got ", n));
    }

    for (std::int64_t c = 0; c < ncols; ++c) {
      const std::string_view cell = row[static_cast<std::size_t>(c)];
      if (c == label_col) {
        double v;
        if (!parse_number(cell, v))
          throw ParseError(detail::cat(path, ":", line_no, ":", c + 1, ": expected a number, got ",
                                       quoted(cell), why_not_a_number(cell, false)));
        if (options.regression) {
          targets.push_back(static_cast<float>(v));
        } else {
          if (!(v >= 0.0 && v < 9007199254740992.0 && v == std::floor(v)))
            throw ParseError(detail::cat(path, ":", line_no, ":", c + 1,
                                         ": expected a non-negative integer class label, got ",
                                         quoted(cell)));
          labels.push_back(static_cast<std::int64_t>(v));
        }
      } else {
        float v;
        if (!parse_number(cell, v))
          throw ParseError(detail::cat(path, ":", line_no, ":", c + 1, ": expected a number, got ",
                                       quoted(cell), why_not_a_number(cell, true)));
        features.push_back(v);
      }
    }
    ++rows;
  };

  std::string_view line;
  while (reader.next(line)) {
    // A UTF-8 byte-order mark (Excel's "CSV UTF-8", Notepad) is not part of the first cell: left
    // in, it made a first data line text, so a header, silently.
    if (reader.line_no() == 1 && line.substr(0, 3) == "\xEF\xBB\xBF") line.remove_prefix(3);
    if (trim(line).empty()) continue;
    const std::int64_t line_no = reader.line_no();
    // A carriage return inside a line: the file ends its lines in CR alone (classic Mac OS), so
    // it is one long line, once read as a header and "no data rows".
    if (const auto cr = trim(line).find('\r'); cr != std::string_view::npos)
      throw ParseError(detail::cat(path, ":", line_no, ": a carriage return at byte ", cr + 1,
                                   " of the line: expected lines ending in LF or CRLF, got CR "
                                   "alone (classic Mac OS line endings; convert with tr '\\r' "
                                   "'\\n')"));
    // Count before splitting: a line of 10^6 cells is refused before 10^6 views are made.
    const auto n_cells = static_cast<std::int64_t>(std::count(line.begin(), line.end(), delim)) + 1;
    if (n_cells > options.max_columns)
      throw ParseError(detail::cat(path, ":", line_no, ": ", n_cells,
                                   " columns, more than the maximum of ", options.max_columns,
                                   " (CsvOptions::max_columns)"));
    split(line, delim, cells);

    if (!seen_first_line) {
      seen_first_line = true;
      if (options.header == CsvHeader::yes) continue;
      if (options.header == CsvHeader::auto_detect) {  // Note [CSV header detection]
        first_text.assign(line);
        split(first_text, delim, first_cells);
        first_line_no = line_no;
        first_pending = true;
        continue;
      }
    } else if (first_pending) {
      first_pending = false;
      if (!is_header(first_cells, &cells)) add_row(first_line_no, first_text, first_cells);
    }
    add_row(line_no, line, cells);
  }
  if (first_pending && !is_header(first_cells, nullptr))
    add_row(first_line_no, first_text, first_cells);

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
