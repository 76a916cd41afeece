// TokenDataSource: a GPT's data already tokenised, as llm.c and nanoGPT write it, memory-mapped.
//
// Note [Token files]
// Two formats of token ids, told apart by content where content can tell (detect_data_format):
//   llm.c shard (dev/data/data_common.py, write_datafile): a header of 256 little-endian int32,
//     [0] the magic, [1] the version, [2] the token count N, the rest 0; then N tokens: magic
//     20240520 with version 1 holds uint16 tokens (GPT-2), magic 20240801 with version 7 uint32
//     tokens (LLaMA 3). The file has exactly 1024 + N x 2 (or x 4) bytes (llm.c's dataloader
//     checks the same).
//   nanoGPT raw (data/*/prepare.py: np.array(ids, dtype=np.uint16).tofile('train.bin')): uint16
//     tokens, no header; the vocabulary size is meta.pkl's vocab_size (a Python pickle, not read
//     here: given as --vocab-size), 50304 / 50257 for GPT-2's BPE.
// The detection rule of ditto-train --data (DataFormat::automatic): the first file's first int32
// is 20240520 or 20240801 -> llm.c; else a file name ending in ".bin" -> nanoGPT raw; else a text
// (TextDataSource, one byte per character). --data-format says which where the rule would be
// wrong (a text named x.bin, a raw file whose first two tokens spell llm.c's magic).
// Every shard of a list must be of the first one's format (an llm.c header is checked on each).
// A first file the rule cannot read (missing, unreadable, a FIFO or another file that is not
// regular) is refused by it, naming the file and why, before any read that could block.
//
// A dataset is one or more files read in the order given (a comma-separated list, or a glob
// expanded in sorted order, as llm.c's glob(3) does): their tokens are one sequence, shard after
// shard, the way nanoGPT's train.bin concatenates its documents. A header, a token or a size that
// does not fit is a ditto::Error naming the file, the byte offset and the value expected:
//   "'x.bin': offset 0: expected llm.c's magic 20240520 or 20240801, got 7",
//   "'x.bin': offset 8: the header's token count 900 needs 1024 + 900 x 2 = 2824 bytes, the
//    file has 1224", "'x.bin': offset 2048: token 600: expected < vocab_size 512" ...
//
// Note [Token batches]
// The windows are those of Note [Text batches] (text_source.h) over the train sequence: window j
// of optimizer step s starts at philox_u64(seed, stream_id(kStreamBatch, s), j) % (N_train - T),
// x = tokens[i, i + T), y = tokens[i + 1, i + T + 1) (nanoGPT's get_batch), a window may run from
// one shard into the next. Evaluation batch k of a split draws its windows in the same way with
// stream_id(kStreamEvalBatch, p << 32 | k) over that split's sequence. The windows depend on
// (seed, step, j) only, so the global batch is the same for any device count and trainer, and
// step_batch_rows gives a rank only its rows' windows: a DDP rank (a thread or an mpirun process)
// reads the pages of the windows it trains on (the Trainer asks for its rows, Replica::row_range),
// and the evaluation windows, which every rank evaluates whole.
//
// Note [Mapped shards]
// Each file is mapped read-only (mmap(2)), never read whole: opening a dataset reads each
// header (llm.c: 1 KiB) and each file's size, and checkpoint_config's fingerprint reads at most
// the first and last 4 KiB of each file. A token is checked (< vocab_size) when a window reads
// it. The mapping is MADV_RANDOM: a window's fault reads its own pages, without the read-ahead
// around them. After copying a window's tokens out, its pages are dropped from this process's
// mapping (madvise MADV_DONTNEED: they stay in the page cache, and a later window faults them back
// in), so the resident size of a long run stays that of the windows in flight, not of every page
// the run has read. The files must not change while the source exists.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/data/window_source.h"
#include "core/numerics/random.h"  // kStreamBatch, kStreamEvalBatch

namespace ditto::train {

/// What --data holds (Note [Token files]).
enum class DataFormat : std::uint8_t {
  automatic,  ///< decided by detect_data_format
  text,       ///< TextDataSource: one byte per character
  llmc,       ///< llm.c shards: 256-int32 header, uint16 (v1) or uint32 (v7) tokens
  nanogpt,    ///< nanoGPT raw uint16 tokens (train.bin / val.bin)
};

/// "auto", "text", "llmc", "nanogpt".
const char* data_format_name(DataFormat f);
/// The format of a name of data_format_name; InvalidArgument naming `option` otherwise.
DataFormat parse_data_format(const std::string& name, const char* option);

/// llm.c's magics and versions (dev/data/data_common.py HEADERS_INFO).
inline constexpr std::int32_t kLlmcMagicGpt2 = 20240520, kLlmcVersionGpt2 = 1;
inline constexpr std::int32_t kLlmcMagicLlama3 = 20240801, kLlmcVersionLlama3 = 7;
/// The vocabulary of the tokenizer whose shards carry llm.c's `magic`: 50257 (GPT-2's BPE) for
/// kLlmcMagicGpt2, 128256 (LLaMA 3) for kLlmcMagicLlama3 (what ditto-train takes without
/// --vocab-size); InvalidArgument for another magic.
std::int64_t llmc_tokenizer_vocab_size(std::int32_t magic);
/// Bytes of an llm.c shard's header (256 int32).
inline constexpr std::int64_t kLlmcHeaderBytes = 1024;

/// The files of a --data / --val-data value, in order: `spec` itself when it names an existing
/// file (a name with a comma in it), else each comma-separated item, an item with * ? or [ a
/// glob(3) pattern expanded in sorted order. Throws ditto::Error naming `option` for an empty
/// value or item, and for a pattern that matches no file; a missing plain name is left to
/// the open that follows (its error names the file).
std::vector<std::string> expand_data_paths(const std::string& spec, const char* option);

/// The format of the file `path` by Note [Token files]'s rule (llm.c magic, else ".bin", else
/// text). Reads at most 4 bytes, opened as io::InputFile does (O_NONBLOCK: a FIFO is refused,
/// never waited on). A file it cannot open or read, or that is not a regular file, is refused
/// with what io::InputFile throws, as the reader its name goes to would refuse it
/// ("TokenDataSource: cannot open 'x.bin': Permission denied", "TextDataSource: 'f' is a FIFO,
/// expected a regular file"), never taken for another format.
DataFormat detect_data_format(const std::string& path);

/// The validation files beside `train_spec` by llm.c's and nanoGPT's naming: the last "train" in
/// the final path component of each item replaced by "val", and a shard number after it by "*"
/// (the first run of digits, * ? and [...] bracket expressions after it: fineweb_train_*.bin,
/// fineweb_train_000001.bin, fineweb_train_00000?.bin, fineweb_train_00000[12].bin ->
/// fineweb_val_*.bin,
/// tiny_shakespeare_train.bin -> tiny_shakespeare_val.bin, data/shakespeare/train.bin ->
/// data/shakespeare/val.bin), expanded as expand_data_paths does, each file once in the order
/// found; empty when an item does not name "train" or its val name matches nothing.
std::vector<std::string> val_paths_beside(const std::string& train_spec);

/// One token file mapped read-only (Note [Mapped shards]).
class TokenFile {
 public:
  /// Opens and checks `path` as `format` (llmc or nanogpt): throws ditto::Error naming the file,
  /// the offset and the value expected (Note [Token files]): what io::InputFile throws (missing,
  /// not a regular file), an llm.c header shorter than 1024 bytes, a bad magic, a version that
  /// is not the magic's, a token count that is not positive or does not match the file's size,
  /// an odd byte count or an empty file (nanoGPT).
  TokenFile(const std::string& path, DataFormat format);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  /// Tokens in the file.
  std::int64_t tokens() const { return tokens_; }
  /// Bytes per token: 2 (uint16) or 4 (uint32, llm.c v7).
  int token_bytes() const { return width_; }
  /// Byte offset of token 0 (1024 for llm.c, 0 for nanoGPT raw).
  std::int64_t data_offset() const { return offset_; }
  /// llm.c's magic (0 for nanoGPT raw).
  std::int32_t magic() const { return magic_; }
  /// File size in bytes.
  std::int64_t bytes() const { return static_cast<std::int64_t>(size_); }
  /// Token `i`. Throws InvalidArgument for i outside [0, tokens()) (naming the range and the
  /// file).
  std::uint32_t token(std::int64_t i) const;
  /// Drops the pages of tokens [begin, end) from this process's mapping (Note [Mapped shards]).
  void release(std::int64_t begin, std::int64_t end) const;
  /// FNV-1a (64-bit) over the header (llm.c) and the first and last 4 KiB of the tokens.
  std::uint64_t fingerprint() const;

 private:
  std::string path_;
  void* map_ = nullptr;
  std::size_t size_ = 0;
  std::int64_t tokens_ = 0, offset_ = 0;
  int width_ = 2;
  std::int32_t magic_ = 0;

  friend class TokenSequence;
  /// token(i) unchecked, for TokenSequence::read's per-token loop, which checks its range once.
  std::uint32_t token_at(std::int64_t i) const;
};

/// Token files read in order as one sequence (Note [Token files]).
class TokenSequence {
 public:
  /// Opens every file of `paths` (non-empty) as `format`; all must have the same token width
  /// (llm.c: the same magic): ditto::Error naming both files otherwise.
  TokenSequence(const std::vector<std::string>& paths, DataFormat format);
  std::int64_t tokens() const { return total_; }
  const std::vector<std::unique_ptr<TokenFile>>& files() const { return files_; }
  /// Tokens [begin, begin + n) of the sequence into out[0, n), each checked < vocab_size (a
  /// ditto::Error naming the file, the token's byte offset, the token and vocab_size), pages
  /// released afterwards (Note [Mapped shards]).
  void read(std::int64_t begin, std::int64_t n, std::int64_t vocab_size, std::int64_t* out) const;

 private:
  std::vector<std::unique_ptr<TokenFile>> files_;
  std::vector<std::int64_t> starts_;  // token index of each file's first token
  std::int64_t total_ = 0;
};

/// A GPT's token data: a training sequence and an optional validation one (Note [Token batches]).
class TokenDataSource final : public WindowSource {
 public:
  /// `train` (non-empty) and `val` (may be empty: no evaluation) files of `format` (llmc or
  /// nanogpt), windows of `block_size` tokens, drawn with `seed`; every token must be <
  /// `vocab_size` (checked as windows read them; llm.c's tokenizers:
  /// llmc_tokenizer_vocab_size(magic)). `name` / `val_name`: what messages and the start line
  /// call the two (the --data / --val-data values). Throws what TokenFile throws and
  /// InvalidArgument for block_size or vocab_size < 1 (either format: 0 is no default), and for
  /// a split not longer than block_size tokens (naming it and the counts).
  TokenDataSource(const std::vector<std::string>& train, const std::vector<std::string>& val,
                  DataFormat format, std::int64_t vocab_size, std::int64_t block_size,
                  std::uint64_t seed, std::string name = "", std::string val_name = "");

  /// Opens `val` (non-empty) as the validation split, replacing any before it (the constructor
  /// calls it for its `val`, after the training files are checked): a caller that names the two
  /// apart calls it on its own to tell a validation file's error from a training file's. Throws
  /// what TokenFile throws, ditto::Error for a magic other than the training data's, and
  /// InvalidArgument for a split not longer than block_size tokens; nothing changes then.
  /// `val_name`: what messages and the start line call it ("": the first file).
  void open_val(const std::vector<std::string>& val, std::string val_name = "");

  // batches_per_epoch, batch, step_batch, step_batch_rows, eval_set, train_size, num_inputs,
  // block_size: WindowSource's, over the two sequences (Note [Token batches]).
  /// WindowSource::eval_batch; InvalidArgument for the val split when there is no validation
  /// data.
  data::Batch eval_batch(EvalSplit split, std::int64_t k, std::int64_t batch_size) override;
  std::int64_t num_outputs() const override { return vocab_size_; }
  /// "data_format", "train_tokens", "val_tokens", "data_fingerprint" (FNV-1a of the files'
  /// fingerprints, hex), "block_size": a resume refuses other data.
  std::map<std::string, std::string> checkpoint_config() const override;

  DataFormat format() const { return format_; }
  std::int64_t vocab_size() const { return vocab_size_; }
  std::int64_t train_tokens() const { return train_.tokens(); }
  std::int64_t val_tokens() const { return val_ ? val_->tokens() : 0; }
  const TokenSequence& train() const { return train_; }
  /// Null when there is no validation data.
  const TokenSequence* val() const { return val_.get(); }
  const std::string& name() const { return name_; }
  const std::string& val_name() const { return val_name_; }

 private:
  std::int64_t split_tokens(EvalSplit split) const override;
  void read_tokens(EvalSplit split, std::int64_t begin, std::int64_t n,
                   std::int64_t* out) const override;

  DataFormat format_;
  TokenSequence train_;
  std::unique_ptr<TokenSequence> val_;
  std::int64_t vocab_size_;
  std::string name_, val_name_;
};

}  // namespace ditto::train
