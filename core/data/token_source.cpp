// TokenDataSource and the token files of llm.c and nanoGPT (token_source.h; Note [Token files]).
#include "core/data/token_source.h"

#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/base/error.h"
#include "core/io/file.h"

// A file's contents that do not fit: ditto::Error (not InvalidArgument: no argument is wrong).
#define CHECK_FILE(cond, ...) DITTO_CHECK_T(::ditto::Error, cond, __VA_ARGS__)

namespace ditto::train {

static_assert(std::endian::native == std::endian::little,
              "llm.c's and nanoGPT's token files are little-endian; this reader maps them as is");

namespace {

constexpr const char* kCall = "TokenDataSource";
// Token files are mapped, not read (Note [Mapped shards]): the bound of Note [Bounded reads] is
// there to keep a wrong name from filling memory, which a mapping does not do; 1 TiB only keeps
// a device or a sparse monster out (nanoGPT's openwebtext train.bin has 17 GB).
constexpr std::uint64_t kMaxTokenFileBytes = std::uint64_t{1} << 40;

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

std::vector<std::string> split_items(const std::string& spec) {
  std::vector<std::string> items;
  std::size_t at = 0;
  for (;;) {
    const std::size_t comma = spec.find(',', at);
    items.push_back(spec.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) return items;
    at = comma + 1;
  }
}

// glob(3) of `pattern`, sorted (glob's default); empty when nothing matches.
std::vector<std::string> glob_paths(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  return out;
}

// The first run of digits, '*', '?' and bracket expressions ("[12]", "[!0]", "[]a]") of `s`
// replaced by "*"; `s` when it has none. A '[' without its ']' is a plain character, as in
// glob(3).
std::string shard_number_as_star(const std::string& s) {
  auto bracket_end = [&](std::size_t i) {  // one past the ']' closing the '[' at i, or npos
    std::size_t j = i + 1;
    if (j < s.size() && (s[j] == '!' || s[j] == '^')) ++j;
    if (j < s.size() && s[j] == ']') ++j;  // a ']' first is a member
    const std::size_t close = s.find(']', j);
    return close == std::string::npos ? close : close + 1;
  };
  auto part_end = [&](std::size_t i) {  // one past the shard-number part at i, or i
    if (i >= s.size()) return i;
    const char c = s[i];
    if ((c >= '0' && c <= '9') || c == '*' || c == '?') return i + 1;
    if (c == '[') {
      const std::size_t e = bracket_end(i);
      return e == std::string::npos ? i : e;
    }
    return i;
  };
  for (std::size_t d = 0; d < s.size(); ++d) {
    std::size_t e = part_end(d);
    if (e == d) continue;
    for (std::size_t next; (next = part_end(e)) != e;) e = next;
    return s.substr(0, d) + "*" + s.substr(e);
  }
  return s;
}

std::uint64_t fnv1a(std::uint64_t h, const unsigned char* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

}  // namespace

const char* data_format_name(DataFormat f) {
  switch (f) {
    case DataFormat::automatic: return "auto";
    case DataFormat::text: return "text";
    case DataFormat::llmc: return "llmc";
    case DataFormat::nanogpt: return "nanogpt";
  }
  return "?";
}

DataFormat parse_data_format(const std::string& name, const char* option) {
  for (DataFormat f :
       {DataFormat::automatic, DataFormat::text, DataFormat::llmc, DataFormat::nanogpt})
    if (name == data_format_name(f)) return f;
  throw InvalidArgument(
      detail::cat(option, ": expected auto, text, llmc or nanogpt, got '", name, "'"));
}

std::vector<std::string> expand_data_paths(const std::string& spec, const char* option) {
  DITTO_CHECK(!spec.empty(), option,
              ": expected a file, a comma-separated list of files or a "
              "glob, got ''");
  if (exists(spec)) return {spec};
  std::vector<std::string> out;
  for (const std::string& item : split_items(spec)) {
    if (item.empty())
      throw Error(detail::cat(option,
                              ": expected a file, a comma-separated list of files or a "
                              "glob, got '",
                              spec, "' (an empty item)"));
    if (!has_glob_chars(item)) {
      out.push_back(item);  // a missing one: the open names it
      continue;
    }
    std::vector<std::string> found = glob_paths(item);
    if (found.empty())
      throw Error(detail::cat(option, ": the pattern '", item, "' matches no file"));
    out.insert(out.end(), found.begin(), found.end());
  }
  return out;
}

DataFormat detect_data_format(const std::string& path) {
  const std::string suffix = ".bin";
  const bool bin = path.size() >= suffix.size() &&
                   path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  // io::InputFile opens with O_NONBLOCK and refuses what is not a regular file before any read:
  // a FIFO without a writer does not hang here. A file it cannot open is refused as the reader
  // its name goes to would refuse it, not taken for another format (Note [Token files]).
  io::InputFile in(path, kMaxTokenFileBytes, bin ? kCall : "TextDataSource");
  if (in.size() >= 4) {
    std::string b;
    in.read(b, 4);
    std::int32_t magic;
    std::memcpy(&magic, b.data(), 4);
    if (magic == kLlmcMagicGpt2 || magic == kLlmcMagicLlama3) return DataFormat::llmc;
  }
  return bin ? DataFormat::nanogpt : DataFormat::text;
}

std::vector<std::string> val_paths_beside(const std::string& train_spec) {
  if (train_spec.empty()) return {};
  const std::vector<std::string> items =
      exists(train_spec) ? std::vector<std::string>{train_spec} : split_items(train_spec);
  std::vector<std::string> out;
  for (const std::string& item : items) {
    const std::size_t slash = item.rfind('/');
    const std::size_t base = slash == std::string::npos ? 0 : slash + 1;
    const std::size_t at = item.rfind("train");
    if (at == std::string::npos || at < base) return {};
    std::string rest = item.substr(at + 5);
    // A shard number after it is any shard's: llm.c numbers the val shards apart (000000). The
    // number may be spelled as a glob (000001, 00000?, *, 00000[12], 0000[0-9][0-9]): its first
    // run of digits, * ? and bracket expressions becomes one "*".
    rest = shard_number_as_star(rest);
    const std::string val = item.substr(0, at) + "val" + rest;
    std::vector<std::string> found;
    if (has_glob_chars(val))
      found = glob_paths(val);
    else if (exists(val))
      found = {val};
    if (found.empty()) return {};
    for (const std::string& f : found)
      if (std::find(out.begin(), out.end(), f) == out.end()) out.push_back(f);
  }
  return out;
}

TokenFile::TokenFile(const std::string& path, DataFormat format) : path_(path) {
  DITTO_CHECK(format == DataFormat::llmc || format == DataFormat::nanogpt, kCall,
              ": format: expected llmc or nanogpt, got ", data_format_name(format));
  io::InputFile in(path, kMaxTokenFileBytes, kCall);  // a regular file (Note [Bounded reads])
  size_ = static_cast<std::size_t>(in.size());
  const std::string file = detail::cat(kCall, ": '", path, "'");
  if (size_ == 0) {
    if (format == DataFormat::llmc)
      throw Error(detail::cat(file, ": expected an llm.c shard (a header of 256 int32, then "
                                    "tokens), got an empty file"));
    throw Error(detail::cat(file, ": expected nanoGPT's uint16 tokens, got an empty file"));
  }
  map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, in.fd(), 0);
  if (map_ == MAP_FAILED) {
    const int err = errno;
    map_ = nullptr;
    throw Error(
        detail::cat(file, ": cannot map its ", size_, " bytes into memory: ", std::strerror(err)));
  }
  // Windows are drawn at random: a fault reads its own pages, not the read-ahead around them
  // (4 MiB and more a fault by default, which brought 14% of a 2 GiB set into the page cache
  // in a 2-step start).
  ::madvise(map_, size_, MADV_RANDOM);
  const auto* base = static_cast<const unsigned char*>(map_);
  auto int32_at = [&](std::size_t at) {
    std::int32_t v;
    std::memcpy(&v, base + at, 4);
    return v;
  };
  try {
    if (format == DataFormat::llmc) {
      CHECK_FILE(size_ >= static_cast<std::size_t>(kLlmcHeaderBytes), file,
                 ": offset 0: expected an llm.c header of 1024 bytes (256 int32), got a "
                 "file of ",
                 size_, " bytes");
      magic_ = int32_at(0);
      CHECK_FILE(magic_ == kLlmcMagicGpt2 || magic_ == kLlmcMagicLlama3, file,
                 ": offset 0: expected llm.c's magic ", kLlmcMagicGpt2,
                 " (GPT-2, uint16 "
                 "tokens) or ",
                 kLlmcMagicLlama3, " (LLaMA 3, uint32 tokens), got ", magic_);
      // A header that does not hold together may be nanoGPT's raw tokens whose first two
      // spell the magic (tester hB, 11a): said, as the reverse case says --data-format llmc.
      const std::string raw_hint = detail::cat(
          " (if it holds nanoGPT's raw uint16 tokens, whose first two, ", magic_ & 0xffff, " and ",
          (magic_ >> 16) & 0xffff, ", spell the magic: --data-format nanogpt)");
      const std::int32_t version = int32_at(4);
      const std::int32_t want = magic_ == kLlmcMagicGpt2 ? kLlmcVersionGpt2 : kLlmcVersionLlama3;
      CHECK_FILE(version == want, file, ": offset 4: expected version ", want, " for magic ",
                 magic_, ", got ", version, raw_hint);
      width_ = magic_ == kLlmcMagicGpt2 ? 2 : 4;
      offset_ = kLlmcHeaderBytes;
      const std::int32_t count = int32_at(8);
      CHECK_FILE(count > 0, file, ": offset 8: token count: expected > 0, got ", count,
                 count == 0 ? " (an empty shard)" : raw_hint);
      const std::int64_t need = kLlmcHeaderBytes + std::int64_t(count) * width_;
      CHECK_FILE(need == bytes(), file, ": offset 8: the header's token count ", count,
                 " needs 1024 + ", count, " x ", width_, " = ", need, " bytes, got a file of ",
                 size_, " bytes",
                 need > bytes() ? " (the count runs past the file's end)"
                                : " (bytes after the last token)",
                 raw_hint);
      tokens_ = count;
    } else {
      CHECK_FILE(size_ % 2 == 0, file, ": offset ", size_ - 1,
                 ": expected an even number "
                 "of bytes (nanoGPT's uint16 tokens), got ",
                 size_, " bytes (an odd byte count)");
      tokens_ = static_cast<std::int64_t>(size_ / 2);
      // An llm.c shard given as raw tokens would train on its header: refused when the header
      // is one beyond doubt (magic, version and a count that is the file's size).
      if (size_ >= static_cast<std::size_t>(kLlmcHeaderBytes)) {
        const std::int32_t m = int32_at(0), v = int32_at(4), n = int32_at(8);
        const bool gpt2 = m == kLlmcMagicGpt2 && v == kLlmcVersionGpt2;
        const bool llama = m == kLlmcMagicLlama3 && v == kLlmcVersionLlama3;
        CHECK_FILE(!((gpt2 && kLlmcHeaderBytes + 2 * std::int64_t(n) == bytes()) ||
                     (llama && kLlmcHeaderBytes + 4 * std::int64_t(n) == bytes())),
                   file,
                   ": offset 0: expected nanoGPT's raw uint16 tokens "
                   "(--data-format nanogpt), got an llm.c shard (magic ",
                   m, ", version ", v, ", ", n, " tokens): use --data-format llmc or auto");
      }
    }
  } catch (...) {
    ::munmap(map_, size_);
    map_ = nullptr;
    throw;
  }
  release(0, 0);  // the header's page
}

TokenFile::~TokenFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

std::int64_t llmc_tokenizer_vocab_size(std::int32_t magic) {
  if (magic == kLlmcMagicGpt2) return 50257;
  DITTO_CHECK(magic == kLlmcMagicLlama3, "llmc_tokenizer_vocab_size: magic: expected ",
              kLlmcMagicGpt2, " (GPT-2) or ", kLlmcMagicLlama3, " (LLaMA 3), got ", magic);
  return 128256;
}

std::uint32_t TokenFile::token(std::int64_t i) const {
  // Checked (tester hB, 4: token(-1) and token(tokens()) read outside the tokens, token(1 << 40)
  // faulted); TokenSequence::read, the per-token loop, checks its range once and reads with
  // token_at.
  DITTO_CHECK(i >= 0 && i < tokens_, "TokenFile::token: i: expected an index in [0, ", tokens_,
              ") (the tokens of '", path_, "'), got ", i);
  return token_at(i);
}

std::uint32_t TokenFile::token_at(std::int64_t i) const {
  const auto* p = static_cast<const unsigned char*>(map_) + offset_ + i * width_;
  if (width_ == 2) {
    std::uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void TokenFile::release(std::int64_t begin, std::int64_t end) const {
  static const std::int64_t page = ::sysconf(_SC_PAGESIZE);
  const std::int64_t first = offset_ + begin * width_, last = offset_ + end * width_;
  const std::int64_t a = first / page * page;
  const std::int64_t b =
      std::min<std::int64_t>((last + page - 1) / page * page, (bytes() + page - 1) / page * page);
  if (b > a)
    ::madvise(static_cast<char*>(map_) + a, static_cast<std::size_t>(b - a), MADV_DONTNEED);
}

std::uint64_t TokenFile::fingerprint() const {
  const auto* b = static_cast<const unsigned char*>(map_);
  std::uint64_t h = 1469598103934665603ull;
  const std::uint64_t n = size_;
  h = fnv1a(h, reinterpret_cast<const unsigned char*>(&n), sizeof n);
  const std::size_t data = size_ - static_cast<std::size_t>(offset_);
  const std::size_t head = static_cast<std::size_t>(offset_) + std::min<std::size_t>(4096, data);
  h = fnv1a(h, b, head);
  const std::size_t tail = std::min<std::size_t>(4096, size_ - head);
  h = fnv1a(h, b + size_ - tail, tail);
  release(0, std::min<std::int64_t>(tokens_, 4096 / width_ + 1));
  release(std::max<std::int64_t>(0, tokens_ - 4096 / width_ - 1), tokens_);
  return h;
}

TokenSequence::TokenSequence(const std::vector<std::string>& paths, DataFormat format) {
  DITTO_CHECK(!paths.empty(), kCall, ": expected at least one token file, got none");
  for (const std::string& p : paths) {
    files_.push_back(std::make_unique<TokenFile>(p, format));
    const TokenFile& f = *files_.back();
    const TokenFile& first = *files_.front();
    CHECK_FILE(f.token_bytes() == first.token_bytes() && f.magic() == first.magic(), kCall, ": '",
               p, "': offset 0: expected magic ", first.magic(), " as '", first.path(),
               "' has (one token width in a dataset), got ", f.magic());
    starts_.push_back(total_);
    total_ += f.tokens();
  }
}

void TokenSequence::read(std::int64_t begin, std::int64_t n, std::int64_t vocab_size,
                         std::int64_t* out) const {
  DITTO_CHECK(begin >= 0 && n >= 0 && begin + n <= total_, kCall, ": tokens [", begin, ", ",
              begin + n, "): expected a range within the ", total_, " tokens");
  std::size_t f = static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) -
                                           starts_.begin() - 1);
  while (n > 0) {
    const TokenFile& file = *files_[f];
    const std::int64_t local = begin - starts_[f];
    const std::int64_t take = std::min(n, file.tokens() - local);
    for (std::int64_t t = 0; t < take; ++t) {
      const std::uint32_t v = file.token_at(local + t);  // inside: [begin, begin + n) checked
      if (static_cast<std::int64_t>(v) >= vocab_size)
        throw Error(detail::cat(kCall, ": '", file.path(), "': offset ",
                                file.data_offset() + (local + t) * file.token_bytes(),
                                ": expected a token < vocab_size = ", vocab_size, ", got ", v));
      *out++ = static_cast<std::int64_t>(v);
    }
    file.release(local, local + take);
    begin += take;
    n -= take;
    ++f;
  }
}

TokenDataSource::TokenDataSource(const std::vector<std::string>& train,
                                 const std::vector<std::string>& val, DataFormat format,
                                 std::int64_t vocab_size, std::int64_t block_size,
                                 std::uint64_t seed, std::string name, std::string val_name)
    : WindowSource(kCall, block_size, seed),
      format_(format),
      train_(train, format),
      vocab_size_(vocab_size),
      name_(std::move(name)),
      val_name_(std::move(val_name)) {
  if (name_.empty()) name_ = train.front();
  // No default for 0 (it became the tokenizer's vocabulary for llm.c shards, silently, against
  // this header; tester hB, 10): ditto-train's "no --vocab-size" asks
  // llmc_tokenizer_vocab_size itself (gpt_recipe.cpp).
  DITTO_CHECK(vocab_size_ >= 1, kCall, ": vocab_size: expected >= 1, got ", vocab_size);
  DITTO_CHECK(train_.tokens() > block_size_, kCall, ": '", name_,
              "': expected more than "
              "block_size = ",
              block_size_, " tokens of training data, got ", train_.tokens());
  if (!val.empty()) open_val(val, val_name_);
}

void TokenDataSource::open_val(const std::vector<std::string>& val, std::string val_name) {
  DITTO_CHECK(!val.empty(), kCall, "::open_val: expected at least one token file, got none");
  auto seq = std::make_unique<TokenSequence>(val, format_);
  const TokenFile& a = *train_.files().front();
  const TokenFile& b = *seq->files().front();
  CHECK_FILE(a.magic() == b.magic(), kCall, ": '", b.path(),
             "': offset 0: expected "
             "magic ",
             a.magic(), " as the training data's '", a.path(), "', got ", b.magic());
  if (val_name.empty()) val_name = val.front();
  DITTO_CHECK(seq->tokens() > block_size_, kCall, ": '", val_name,
              "': expected "
              "more than block_size = ",
              block_size_, " tokens of validation data, got ", seq->tokens());
  val_ = std::move(seq);
  val_name_ = std::move(val_name);
}

std::int64_t TokenDataSource::split_tokens(EvalSplit split) const {
  if (split == EvalSplit::train) return train_.tokens();
  return val_ ? val_->tokens() : 0;
}

void TokenDataSource::read_tokens(EvalSplit split, std::int64_t begin, std::int64_t n,
                                  std::int64_t* out) const {
  (split == EvalSplit::train ? train_ : *val_).read(begin, n, vocab_size_, out);
}

data::Batch TokenDataSource::eval_batch(EvalSplit split, std::int64_t k, std::int64_t batch_size) {
  DITTO_CHECK(split == EvalSplit::train || val_ != nullptr, kCall,
              "::eval_batch: expected validation data for '", name_,
              "' (--val-data, or a val file beside it), got none");
  return WindowSource::eval_batch(split, k, batch_size);
}

std::map<std::string, std::string> TokenDataSource::checkpoint_config() const {
  std::uint64_t h = 1469598103934665603ull;
  auto add = [&](const TokenSequence& s) {
    for (const auto& f : s.files()) {
      const std::uint64_t v = f->fingerprint();
      h = fnv1a(h, reinterpret_cast<const unsigned char*>(&v), sizeof v);
    }
  };
  add(train_);
  if (val_) add(*val_);
  char hex[24];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return {{"data_format", data_format_name(format_)},
          {"train_tokens", std::to_string(train_.tokens())},
          {"val_tokens", std::to_string(val_tokens())},
          {"data_fingerprint", hex},
          {"block_size", std::to_string(block_size_)}};
}

}  // namespace ditto::train
