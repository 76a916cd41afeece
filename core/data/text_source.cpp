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

TextDataSource::TextDataSource(const std::string& path, std::int64_t block_size, std::uint64_t seed)
    : name_(path), block_size_(block_size), seed_(seed) {
  const char* call = "TextDataSource";
  DITTO_CHECK(block_size >= 1, call, ": block_size: expected >= 1, got ", block_size);
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
    index(call);
  } catch (...) {
    if (map_ != nullptr) ::munmap(map_, size_);
    throw;
  }
}

TextDataSource::TextDataSource(std::string text, std::int64_t block_size, std::uint64_t seed,
                               const std::string& name)
    : name_(name), block_size_(block_size), seed_(seed), owned_(std::move(text)) {
  const char* call = "TextDataSource";
  DITTO_CHECK(block_size >= 1, call, ": block_size: expected >= 1, got ", block_size);
  bytes_ = reinterpret_cast<const unsigned char*>(owned_.data());
  size_ = owned_.size();
  index(call);
}

TextDataSource::~TextDataSource() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

void TextDataSource::index(const char* call) {
  std::array<bool, 256> seen{};
  fnv_ = 1469598103934665603ull;
  // Note [Mapped text]: one pass, each stretch of the mapping dropped once read.
  constexpr std::size_t kStretch = std::size_t{64} << 20;
  for (std::size_t at = 0; at < size_; at += kStretch) {
    const std::size_t end = std::min(size_, at + kStretch);
    for (std::size_t i = at; i < end; ++i) {
      const unsigned char b = bytes_[i];
      seen[b] = true;
      fnv_ = (fnv_ ^ b) * 1099511628211ull;
    }
    if (map_ != nullptr)  // page-aligned: `at` is a multiple of 64 MiB from the mapping's start
      ::madvise(static_cast<char*>(map_) + at, end - at, MADV_DONTNEED);
  }
  stoi_.fill(-1);
  for (int b = 0; b < 256; ++b)
    if (seen[static_cast<std::size_t>(b)]) {
      stoi_[static_cast<std::size_t>(b)] = static_cast<int>(itos_.size());
      itos_.push_back(static_cast<unsigned char>(b));
    }
  // prepare.py: train_data = data[:int(n*0.9)] (a double product, truncated).
  n_train_ = static_cast<std::size_t>(static_cast<double>(size_) * 0.9);
  const std::size_t n_val = size_ - n_train_, T = static_cast<std::size_t>(block_size_);
  DITTO_CHECK(n_train_ > T && n_val > T, call, ": '", name_,
              "': expected a text whose training "
              "(first 90%) and validation (last 10%) splits are longer than block_size = ",
              block_size_, " tokens, got ", size_, " bytes (", n_train_, " + ", n_val, " tokens)");
}

namespace {
// A batch's B x T token windows are built on the host (two i64 tensors): refuse sizes whose
// product overflows or would not fit any machine, before allocating (a batch_size of 2^60 used to
// wrap B x T to 0 and write past an empty vector).
constexpr std::int64_t kMaxBatchTokens = std::int64_t(1) << 31;
void check_batch_size(std::int64_t batch_size, std::int64_t T) {
  DITTO_CHECK(batch_size >= 1, "TextDataSource: batch_size: expected >= 1, got ", batch_size);
  DITTO_CHECK(batch_size <= kMaxBatchTokens / T,
              "TextDataSource: batch_size: expected batch_size x "
              "block_size <= 2^31 tokens (block_size = ",
              T, ": batch_size <= ", kMaxBatchTokens / T, "), got ", batch_size);
}
}  // namespace

std::int64_t TextDataSource::batches_per_epoch(std::int64_t batch_size) const {
  check_batch_size(batch_size, block_size_);
  const std::int64_t per_batch = batch_size * block_size_;
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(n_train_) / per_batch);
}

data::Batch TextDataSource::batch(std::int64_t epoch, std::int64_t i, std::int64_t batch_size) {
  return step_batch(epoch * batches_per_epoch(batch_size) + i, batch_size);
}

data::Batch TextDataSource::windows(std::size_t begin, std::size_t len, std::uint64_t stream,
                                    std::int64_t batch_size, std::int64_t lo,
                                    std::int64_t hi) const {
  check_batch_size(batch_size, block_size_);
  if (hi < 0) hi = batch_size;
  DITTO_CHECK(0 <= lo && lo <= hi && hi <= batch_size,
              "TextDataSource::step_batch_rows: rows: "
              "expected 0 <= lo <= hi <= batch_size = ",
              batch_size, ", got [", lo, ", ", hi, ")");
  const std::int64_t T = block_size_;
  const std::uint64_t starts = len - static_cast<std::size_t>(T);  // > 0 (constructor)
  std::vector<std::int64_t> x(static_cast<std::size_t>(batch_size * T)), y(x.size());
  for (std::int64_t j = lo; j < hi; ++j) {
    const std::size_t i =
        begin +
        static_cast<std::size_t>(philox_u64(seed_, stream, static_cast<std::uint64_t>(j)) % starts);
    for (std::int64_t t = 0; t < T; ++t) {
      x[static_cast<std::size_t>(j * T + t)] = token(i + static_cast<std::size_t>(t));
      y[static_cast<std::size_t>(j * T + t)] = token(i + static_cast<std::size_t>(t) + 1);
    }
  }
  return {Tensor::from_vector(x, {batch_size, T}, Device::cpu()),
          Tensor::from_vector(y, {batch_size, T}, Device::cpu())};
}

data::Batch TextDataSource::step_batch(std::int64_t step, std::int64_t batch_size) {
  DITTO_CHECK(step >= 0, "TextDataSource::step_batch: step: expected >= 0, got ", step);
  return windows(0, n_train_, stream_id(kStreamBatch, static_cast<std::uint64_t>(step)),
                 batch_size);
}

data::Batch TextDataSource::step_batch_rows(std::int64_t step, std::int64_t batch_size,
                                            std::int64_t lo, std::int64_t hi) {
  DITTO_CHECK(step >= 0, "TextDataSource::step_batch_rows: step: expected >= 0, got ", step);
  return windows(0, n_train_, stream_id(kStreamBatch, static_cast<std::uint64_t>(step)), batch_size,
                 lo, hi);
}

data::Batch TextDataSource::eval_batch(EvalSplit split, std::int64_t k, std::int64_t batch_size) {
  DITTO_CHECK(k >= 0, "TextDataSource::eval_batch: k: expected >= 0, got ", k);
  const std::uint64_t p = split == EvalSplit::train ? 0 : 1;
  const std::uint64_t stream = stream_id(kStreamEvalBatch, p << 32 | static_cast<std::uint64_t>(k));
  if (split == EvalSplit::train) return windows(0, n_train_, stream, batch_size);
  return windows(n_train_, size_ - n_train_, stream, batch_size);
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
