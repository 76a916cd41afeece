// TextDataSource: a text file as character tokens for a GPT, as nanoGPT's shakespeare_char
// (data/shakespeare_char/prepare.py and train.py's get_batch), with batches drawn by Philox so the
// global batch of a step is the same for any device count (DDP ranks take their rows of it).
//
// Note [Text batches]
// The vocabulary is the sorted distinct bytes of the file (prepare.py: chars = sorted(set(data)),
// stoi / itos); token = the byte's rank in it. With n = the file's bytes, the first int(n * 0.9)
// tokens are the training split and the rest the validation split (train = data[:int(n*0.9)]).
// The batch of optimizer step s has B windows of T + 1 tokens (T = block_size): window j starts
// at i = philox_u64(seed, stream_id(kStreamBatch, s), j) % (len(train) - T) (torch.randint(
// len(data) - block_size) in get_batch), x[j] = train[i, i + T), y[j] = train[i + 1, i + T + 1),
// x and y [B, T] i64 host tensors. Window j depends only on (seed, s, j): the batch is the same
// for 1, 2, 4 or 8 devices, and a rank holding rows [a, b) holds windows a..b-1.
// Evaluation (nanoGPT's estimate_loss, on fixed windows instead of fresh random ones): batch k
// (0 <= k < eval_iters) of split p (0 train, 1 val) has its window j at
// philox_u64(seed, stream_id(kStreamEvalBatch, p << 32 | k), j) % (len(split) - T): the same
// windows at every evaluation, so two evaluations compare the model, not the windows.
//
// Note [Mapped text]
// A text file is memory-mapped read-only (mmap(2), MAP_PRIVATE), not read into memory: the
// vocabulary and the FNV-1a are computed in one pass over the mapping, dropping each 64 MiB
// stretch once read (madvise MADV_DONTNEED: pages of a file come back from the page cache when a
// window touches them again), and a token is stoi[byte] taken when a window is built. So a 3 GiB
// text costs pages of the windows drawn, not the 6.3 GB that a copy of the bytes and a copy as
// tokens took. A text given in memory (the second constructor) is kept as given.
//
// Note [Given vocabulary]
// A TextVocabulary given to the constructor replaces the text's own: token = the byte's index in
// it (a model's ids keep meaning its characters on another text: Note [Checkpoint vocabulary] in
// core/checkpoint/gpt_weights.h). Every byte of the text must be in it; the first ones that are
// not are named (with the offset of each one's first occurrence), as they have no token.
// checkpoint_config's "vocab" is then the given vocabulary.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/data/window_source.h"
#include "core/numerics/random.h"  // kStreamBatch, kStreamEvalBatch

namespace ditto::train {

/// A vocabulary for a TextDataSource instead of its text's own (Note [Given vocabulary]).
struct TextVocabulary {
  std::vector<unsigned char> itos;  ///< the byte of token t at [t]; distinct bytes
  std::string name;                 ///< what errors call it ("the vocabulary of 'ck/...'")
};

class TextDataSource final : public WindowSource {
 public:
  /// The bytes of the file `path`, memory-mapped (Note [Mapped text]), windows of `block_size`
  /// tokens, drawn with `seed`. Throws what io::InputFile throws (naming the file; ditto::Error
  /// for one that is not a regular file or has more than 4 GiB, io::kMaxDataBytes: Note [Bounded
  /// reads]), ditto::Error naming the file when mmap fails, and InvalidArgument for block_size <
  /// 1 or a text whose splits are not longer than block_size tokens (naming the file and the
  /// sizes). The file must not be changed while the source exists. `vocab` (when not null):
  /// the vocabulary instead of the text's (Note [Given vocabulary]); InvalidArgument naming the
  /// file, the vocabulary and the first bytes of the text not in it, or a vocabulary that is
  /// empty or repeats a byte.
  TextDataSource(const std::string& path, std::int64_t block_size, std::uint64_t seed,
                 const TextVocabulary* vocab = nullptr);
  /// From text already in memory; `name` is what errors call it.
  TextDataSource(std::string text, std::int64_t block_size, std::uint64_t seed,
                 const std::string& name, const TextVocabulary* vocab = nullptr);
  ~TextDataSource() override;
  TextDataSource(const TextDataSource&) = delete;
  TextDataSource& operator=(const TextDataSource&) = delete;

  // batches_per_epoch, batch, step_batch, step_batch_rows, eval_batch, eval_set, train_size,
  // num_inputs, block_size: WindowSource's, over the text's splits (Note [Text batches]).
  /// vocab_size (logits per token).
  std::int64_t num_outputs() const override { return vocab_size(); }
  /// "text_bytes", "text_fnv1a" (FNV-1a 64 of the bytes, hex), "vocab" (the vocabulary's bytes
  /// in hex, in token order), "block_size": a resume refuses another text or vocabulary.
  std::map<std::string, std::string> checkpoint_config() const override;

  std::int64_t vocab_size() const { return static_cast<std::int64_t>(itos_.size()); }
  /// The vocabulary: byte of token t (itos).
  const std::vector<unsigned char>& itos() const { return itos_; }
  /// Tokens of `text` (stoi); throws InvalidArgument naming the first byte not in the vocabulary.
  std::vector<std::int64_t> encode(const std::string& text) const;
  /// The text of `tokens` (itos); throws InvalidArgument for a token outside [0, vocab_size).
  std::string decode(const std::vector<std::int64_t>& tokens) const;
  /// Tokens of the training and validation splits.
  std::int64_t train_tokens() const { return static_cast<std::int64_t>(n_train_); }
  std::int64_t val_tokens() const { return static_cast<std::int64_t>(size_ - n_train_); }
  /// Total bytes of the text.
  std::int64_t size() const { return static_cast<std::int64_t>(size_); }
  /// The text's name (its path).
  const std::string& name() const { return name_; }

 private:
  /// The first 90% (train) or the rest (val).
  std::int64_t split_tokens(EvalSplit split) const override;
  void read_tokens(EvalSplit split, std::int64_t begin, std::int64_t n,
                   std::int64_t* out) const override;
  /// The vocabulary (the text's, or `vocab`'s), FNV-1a and splits of bytes_[0, size_), and the
  /// size checks.
  void index(const char* call, const TextVocabulary* vocab);
  /// Makes `vocab` the vocabulary (Note [Given vocabulary]); `seen` and `first`: which bytes the
  /// text holds and where each first is.
  void use_vocabulary(const char* call, const TextVocabulary& vocab,
                      const std::array<bool, 256>& seen, const std::array<std::size_t, 256>& first);
  /// Token i of the text: stoi of its byte.
  std::int64_t token(std::size_t i) const { return stoi_[bytes_[i]]; }

  std::string name_;
  std::string owned_;                     // the text given in memory (else empty)
  const unsigned char* bytes_ = nullptr;  // the text: owned_ or the mapping (Note [Mapped text])
  std::size_t size_ = 0;
  void* map_ = nullptr;  // the mapping of the file, when mapped
  std::size_t n_train_ = 0;
  std::vector<unsigned char> itos_;
  std::array<int, 256> stoi_{};  // -1: not in the vocabulary
  std::uint64_t fnv_ = 0;
};

}  // namespace ditto::train
