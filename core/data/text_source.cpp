// TextDataSource (text_source.h; Note [Text batches]).
#include "core/data/text_source.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/base/error.h"
#include "core/io/file.h"
#include "core/numerics/random.h"

namespace ditto::train {

TextDataSource::TextDataSource(const std::string& path, std::int64_t block_size, std::uint64_t seed,
                               const TextVocabulary* vocab)
    : WindowSource("TextDataSource", block_size, seed), name_(path) {
  const char* call = call_;
  io::InputFile in(path, io::kMaxDataBytes, call);  // Note [Bounded reads]: a regular file
  size_ = static_cast<std::size_t>(in.size());
  if (size_ > 0) {  // mmap of 0 bytes fails; an empty text is refused by index() below
    map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, in.fd(), 0);
    if (map_ == MAP_FAILED) {
      const int err = errno;
      map_ = nullptr;
      throw Error(detail::cat(call, ": cannot map '", path, "' (", size_,
                              " bytes) into memory: ", std::strerror(err)));
    }
    bytes_ = static_cast<const unsigned char*>(map_);
  }
  try {
    index(call, vocab);
  } catch (...) {
    if (map_ != nullptr) ::munmap(map_, size_);
    throw;
  }
}

TextDataSource::TextDataSource(std::string text, std::int64_t block_size, std::uint64_t seed,
                               const std::string& name, const TextVocabulary* vocab)
    : WindowSource("TextDataSource", block_size, seed), name_(name), owned_(std::move(text)) {
  const char* call = call_;
  bytes_ = reinterpret_cast<const unsigned char*>(owned_.data());
  size_ = owned_.size();
  index(call, vocab);
}

TextDataSource::~TextDataSource() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

void TextDataSource::use_vocabulary(const char* call, const TextVocabulary& vocab,
                                    const std::array<bool, 256>& seen,
                                    const std::array<std::size_t, 256>& first) {
  DITTO_CHECK(!vocab.itos.empty(), call, ": '", name_, "': ", vocab.name,
              ": expected at least one byte, got none");
  for (unsigned char b : vocab.itos) {
    DITTO_CHECK(stoi_[b] < 0, call, ": '", name_, "': ", vocab.name,
                ": expected distinct bytes, got 0x", std::hex, static_cast<int>(b), std::dec,
                " twice");
    stoi_[b] = static_cast<int>(itos_.size());
    itos_.push_back(b);
  }
  std::vector<int> missing;  // bytes of the text without a token, by their first occurrence
  for (int b = 0; b < 256; ++b)
    if (seen[static_cast<std::size_t>(b)] && stoi_[static_cast<std::size_t>(b)] < 0)
      missing.push_back(b);
  if (missing.empty()) return;
  std::sort(missing.begin(), missing.end(), [&](int a, int b) {
    return first[static_cast<std::size_t>(a)] < first[static_cast<std::size_t>(b)];
  });
  std::string bytes;
  char buf[64];
  const std::size_t shown = std::min<std::size_t>(missing.size(), 4);
  for (std::size_t k = 0; k < shown; ++k) {
    const int b = missing[k];
    const std::size_t at = first[static_cast<std::size_t>(b)];
    if (b >= 0x20 && b < 0x7f)
      std::snprintf(buf, sizeof buf, "0x%02x '%c' at byte %zu", b, b, at);
    else
      std::snprintf(buf, sizeof buf, "0x%02x at byte %zu", b, at);
    bytes += detail::cat(k ? ", " : "", buf);
  }
  if (missing.size() > shown) bytes += ", ...";
  throw InvalidArgument(detail::cat(
      call, ": '", name_, "': expected only the ", itos_.size(), " bytes of ", vocab.name, ", got ",
      missing.size(), missing.size() == 1 ? " byte" : " bytes", " it has no token for: ", bytes));
}

void TextDataSource::index(const char* call, const TextVocabulary* vocab) {
  std::array<bool, 256> seen{};
  std::array<std::size_t, 256> first{};  // the offset of each byte's first occurrence
  fnv_ = 1469598103934665603ull;
  // Note [Mapped text]: one pass, each stretch of the mapping dropped once read.
  constexpr std::size_t kStretch = std::size_t{64} << 20;
  for (std::size_t at = 0; at < size_; at += kStretch) {
    const std::size_t end = std::min(size_, at + kStretch);
    for (std::size_t i = at; i < end; ++i) {
      const unsigned char b = bytes_[i];
      if (!seen[b]) {
        seen[b] = true;
        first[b] = i;
      }
      fnv_ = (fnv_ ^ b) * 1099511628211ull;
    }
    if (map_ != nullptr)  // page-aligned: `at` is a multiple of 64 MiB from the mapping's start
      ::madvise(static_cast<char*>(map_) + at, end - at, MADV_DONTNEED);
  }
  stoi_.fill(-1);
  if (vocab == nullptr) {
    for (int b = 0; b < 256; ++b)
      if (seen[static_cast<std::size_t>(b)]) {
        stoi_[static_cast<std::size_t>(b)] = static_cast<int>(itos_.size());
        itos_.push_back(static_cast<unsigned char>(b));
      }
  } else {
    use_vocabulary(call, *vocab, seen, first);
  }
  // prepare.py: train_data = data[:int(n*0.9)] (a double product, truncated).
  n_train_ = static_cast<std::size_t>(static_cast<double>(size_) * 0.9);
  const std::size_t n_val = size_ - n_train_, T = static_cast<std::size_t>(block_size_);
  DITTO_CHECK(n_train_ > T && n_val > T, call, ": '", name_,
              "': expected a text whose training "
              "(first 90%) and validation (last 10%) splits are longer than block_size = ",
              block_size_, " tokens, got ", size_, " bytes (", n_train_, " + ", n_val, " tokens)");
}

std::int64_t TextDataSource::split_tokens(EvalSplit split) const {
  return static_cast<std::int64_t>(split == EvalSplit::train ? n_train_ : size_ - n_train_);
}

void TextDataSource::read_tokens(EvalSplit split, std::int64_t begin, std::int64_t n,
                                 std::int64_t* out) const {
  const std::size_t at =
      (split == EvalSplit::train ? 0 : n_train_) + static_cast<std::size_t>(begin);
  for (std::int64_t t = 0; t < n; ++t) out[t] = token(at + static_cast<std::size_t>(t));
}

std::map<std::string, std::string> TextDataSource::checkpoint_config() const {
  std::string vocab;
  char hex[24];
  for (unsigned char b : itos_) {
    std::snprintf(hex, sizeof hex, "%02x", b);
    vocab += hex;
  }
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv_));
  return {{"text_bytes", std::to_string(size_)},
          {"text_fnv1a", hex},
          {"vocab", vocab},
          {"block_size", std::to_string(block_size_)}};
}

std::vector<std::int64_t> TextDataSource::encode(const std::string& text) const {
  std::vector<std::int64_t> out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const int t = stoi_[static_cast<unsigned char>(text[i])];
    DITTO_CHECK(t >= 0, "TextDataSource::encode: byte ", i, " (0x", std::hex,
                static_cast<int>(static_cast<unsigned char>(text[i])), std::dec,
                ") is not in the vocabulary of '", name_, "'");
    out.push_back(t);
  }
  return out;
}

std::string TextDataSource::decode(const std::vector<std::int64_t>& tokens) const {
  std::string out;
  out.reserve(tokens.size());
  for (std::int64_t t : tokens) {
    DITTO_CHECK(t >= 0 && t < vocab_size(), "TextDataSource::decode: token: expected 0..",
                vocab_size() - 1, ", got ", t);
    out.push_back(static_cast<char>(itos_[static_cast<std::size_t>(t)]));
  }
  return out;
}

}  // namespace ditto::train
