// Checkpoints: a training run's model parameters, optimizer state and position, written so that a
// crash at any moment leaves a usable checkpoint, and read back so that the resumed run computes
// the same bits as one that never stopped (in bitwise mode).
//
// Note [Checkpoint layout]
// A checkpoint directory DIR holds one sub-directory per saved step and a pointer to the newest:
//   DIR/step-00000046/model.safetensors      parameters by name ("0.weight", "0.bias", ... as
//                                            torch.nn.Sequential's state_dict names them), F32
//   DIR/step-00000046/optimizer.safetensors  optimizer state (optim::OptimizerState: "state.<i>.
//                                            momentum_buffer", "state.<i>.exp_avg", ...); its
//                                            type and hyper-parameters in __metadata__
//   DIR/step-00000046/trainer.json           TrainerState: step, epoch, batch, seed and Philox
//                                            stream of the shuffle, config that must match
//   DIR/latest                               "step-00000046\n"
//   DIR/lock                                 the writer's process id; flock(2)-locked by the
//                                            one process writing DIR (lock_checkpoint_dir)
// model.safetensors may also hold aliases, copies of a parameter under a second name (nanoGPT's
// tied head "lm_head.weight" = "transformer.wte.weight", so that torch's strict load_state_dict
// finds both keys; safetensors has no shared tensors, so the alias is a copy): __metadata__
// "ditto.aliases" lists them as "alias=name,alias=name"; read_checkpoint checks that each one
// has its parameter's bits and drops it.
// Both safetensors files carry in __metadata__ "ditto.step" and "ditto.crc32", the zlib CRC-32 of
// their tensor bytes (the buffer after the header); trainer.json carries the CRC-32 of its own
// content and (format version 2) "header_crc32", the CRC-32 of each safetensors file's header
// (its 8-byte length and JSON), so that an edited header (a dtype F32 -> I32 that keeps every
// size) makes the checkpoint unusable as flipped data bits do, and the resume falls back to the
// previous one. Version 1 checkpoints (written before) still load, their headers unchecked;
// a version-2 checkpoint is refused by a ditto that reads only version 1. A checkpoint is written
// into DIR/step-N.tmp/ (each file by io::write_file_replace: temporary file, fsync, rename, fsync
// of the directory), the directory is then renamed to DIR/step-N and DIR fsynced, and only then is
// DIR/latest replaced (atomically as well). So a crash at any point leaves DIR/latest naming a
// complete checkpoint, and DIR/step-N either complete or absent. The `keep` newest complete
// checkpoints are kept (default 2: the one being written can never be the only one), older ones and
// stray step-*.tmp directories are removed.
//
// Reading verifies every file (safetensors structure, CRC-32s, steps that agree); a damaged,
// truncated or missing file makes the checkpoint unusable (ParseError naming the file). Reads are
// bounded (Note [Bounded reads] in core/io/file.h): every file must be a regular file,
// trainer.json at most 16 MiB (io::kMaxJsonBytes), DIR/latest at most 4096 bytes, and each
// safetensors file's size must match its header before its tensors are read.
// resume_checkpoint tries DIR/latest's checkpoint, then the others from the newest down, saying
// on stderr which one it skips and why.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/io/safetensors.h"
#include "core/nn/module.h"
#include "core/optim/optimizer.h"

namespace ditto {

/// Where a training run stands, and the settings it must be resumed with.
struct TrainerState {
  std::int64_t step = 0;   ///< optimizer steps taken so far
  std::int64_t epoch = 0;  ///< epoch of the next batch (0-based; DataLoader::set_epoch)
  std::int64_t batch = 0;  ///< next batch of that epoch (DataLoader::set_epoch's start_batch)
  std::uint64_t seed = 0;  ///< the run's seed: the Philox key of initialisation, split, shuffle
  /// Sums over the batches of the epoch in progress (for the loss it reports at its end).
  double epoch_loss_sum = 0;
  std::int64_t epoch_samples = 0;
  /// The mean training loss of the last finished epoch (0 before the first), so that a resume
  /// of a finished run reports the loss the run ended with; NaN when the checkpoint predates it
  /// (trainer.json's optional "train_loss").
  double train_loss = 0;
  /// Settings of the run ("model" -> "64-128-10", "optimizer" -> "sgd", "batch_size" -> "64",
  /// ...): resume_checkpoint refuses a checkpoint whose config differs (except `may_differ` keys).
  std::map<std::string, std::string> config;

  /// Record one optimizer step on batch `batch` of epoch `epoch`: step + 1 and the position of
  /// the next batch, with the epoch's running sums so far; after the epoch's last batch (of
  /// `batches_per_epoch`), batch 0 of the next epoch with the sums reset to 0.
  void advance(std::int64_t batches_per_epoch, double loss_sum, std::int64_t samples) {
    ++step;
    if (++batch >= batches_per_epoch) {
      ++epoch;
      batch = 0;
      loss_sum = 0;
      samples = 0;
    }
    epoch_loss_sum = loss_sum;
    epoch_samples = samples;
  }
};

/// A checkpoint as read from disk, verified.
struct Checkpoint {
  std::string path;  ///< DIR/step-N
  TrainerState state;
  std::vector<std::pair<std::string, Tensor>> params;  ///< host tensors, model.safetensors
  optim::OptimizerState optimizer;
};

/// {alias, parameter name} pairs: extra names of parameters in model.safetensors.
using ParamAliases = std::vector<std::pair<std::string, std::string>>;

/// Write a checkpoint of `model`'s parameters, `opt`'s state and `state` into DIR (created if
/// missing) (Note [Checkpoint layout]); blocks until it is on disk. Keeps the `keep` newest
/// checkpoints (>= 1). `aliases`: more names for parameters, each written as a copy. Returns the
/// checkpoint's path (DIR/step-N, N = state.step). Throws InvalidArgument for keep < 1, a
/// negative step/epoch/batch, or an alias that names no parameter or is a parameter's name;
/// ditto::Error for a failed file operation (naming the file; the previous checkpoints stay).
std::string save_checkpoint(const std::string& dir, nn::Module& model, const optim::Optimizer& opt,
                            const TrainerState& state, int keep = 2,
                            const ParamAliases& aliases = {});

/// Read and verify the checkpoint in `path` (DIR/step-N). Throws ParseError naming the file and
/// the problem for a missing, truncated, damaged or edited file (CRC-32 mismatch of the tensor
/// bytes or, version 2, of a safetensors header; malformed safetensors
/// or JSON, files of different steps, an alias whose bits differ from its parameter's).
Checkpoint read_checkpoint(const std::string& path);

/// Verify `d`, a safetensors file read from `path`, against the CRC-32 of its tensor bytes that a
/// checkpoint records in __metadata__ "ditto.crc32" (what read_checkpoint checks for each file).
/// Returns false when the metadata records no "ditto.crc32" (not a file of a ditto checkpoint),
/// true when the CRC matches; throws ParseError naming `path` and both CRCs when it does not.
bool verify_checkpoint_crc(const std::string& path, const io::SafetensorsData& d);

/// Make this process DIR's only writer: create DIR/lock and hold an exclusive flock(2) on it
/// until the process exits (the kernel releases it, on SIGKILL too), with this process's id in
/// it. save_checkpoint calls it; the Trainer calls it at start, so that a second run given the
/// same directory fails before it trains rather than interleaving its checkpoints with the
/// first's. Calling it again in the same process (another thread's run, a second Trainer) is a
/// no-op. Throws ditto::Error naming DIR/lock and the other process's id when another process
/// holds the lock ("checkpoint directory 'ck' is in use: its lock 'ck/lock' is held by process
/// 1234 (another run writing the same directory)"), or the OS reason when it cannot be created.
void lock_checkpoint_dir(const std::string& dir);

/// When `path` is a PyTorch file (torch.save's zip archive: "PK\x03\x04" first; its legacy
/// pickle: 0x80 0x02 first), what it is and how to bring it to ditto, e.g. "'out/ckpt.pt' is a
/// PyTorch file (torch.save's zip archive, as nanoGPT's ckpt.pt), which ditto does not read:
/// convert its model with `/usr/bin/python3 tools/nanogpt_to_safetensors.py ...` ...";
/// "" for any other file, a directory, or one that cannot be read. Reads at most 4 bytes; throws
/// nothing. Errors that meet such a file (--init-from, --resume) append it.
std::string pytorch_file_hint(const std::string& path);

/// "step-N" (N = `step`, eight digits at least), the name of the checkpoint of step `step` in its
/// directory (Note [Checkpoint layout]).
std::string checkpoint_step_name(std::int64_t step);

/// The checkpoint directory a resume from `resume_dir` continues: its parent for one checkpoint
/// DIR/step-N (a directory of that name holding trainer.json; read_latest_checkpoint takes one),
/// else `resume_dir` itself.
std::string checkpoint_run_dir(const std::string& resume_dir);

/// The newest usable checkpoint in DIR: DIR/latest's first, then the other step-N from the
/// newest down; each one skipped is reported on `log` with the reason. DIR a DIR/step-N: that
/// one (no fallback). Throws ditto::Error when there is no usable checkpoint (with each one's
/// reason; a DIR that holds nanoGPT's ckpt.pt and no step-N says what it is and how to convert
/// it: pytorch_file_hint).
Checkpoint read_latest_checkpoint(const std::string& dir, std::ostream& log);

/// Whether DIR holds a checkpoint to resume from (a restart loop's `--resume auto`): DIR/latest
/// or a DIR/step-N (not a step-N.tmp being written), usable or not, so that a damaged one is an
/// error when resuming rather than a fresh start over it; false when DIR does not exist. Throws
/// InvalidArgument "`what`: expected a checkpoint directory (or one to create), got 'DIR', which
/// is not a directory" when DIR is a file (or anything but a directory): checkpoints could never
/// be written there.
bool holds_checkpoint(const std::string& dir, const std::string& what = "holds_checkpoint");
/// The checkpoints in DIR: its "latest" (not a directory) and "step-N" entries (not step-N.tmp),
/// sorted by name; empty when DIR does not exist or holds none. Throws as holds_checkpoint.
std::vector<std::string> checkpoint_entries(const std::string& dir,
                                            const std::string& what = "checkpoint_entries");

/// Resume from DIR: read_latest_checkpoint, then check that its config equals `config` (keys in
/// `may_differ` excepted) and that its parameters have the model's names and shapes, then load
/// the parameters into `model` (onto their devices) and the state into `opt`
/// (Optimizer::load_state_dict). Returns the saved TrainerState. Throws InvalidArgument naming
/// the first setting, parameter or optimizer option that differs, before changing anything;
/// and what read_latest_checkpoint throws. `may_be_missing`: keys of `config` that checkpoints
/// written before they were recorded lack (key -> what it records, e.g. "data_fnv1a" -> "the
/// data's fingerprint"): such a checkpoint is accepted with one warning line on `log` per key
/// ("... <what> cannot be checked"); a key present with another value is still refused.
/// `implied`: the value a key stands for where one side does not record it ("dtype" -> "f32":
/// an f32 run records no dtype), so that the message names both values ("was saved with
/// dtype=f32, this run has dtype=bf16"). A value of the form "head(k=v,...)" (a model's name)
/// that differs is reported by its first differing field, named through `names` when listed
/// there ("dropout" -> "--dropout": "--dropout: checkpoint 0, this run 0.1").
TrainerState resume_checkpoint(const std::string& dir, nn::Module& model, optim::Optimizer& opt,
                               const std::map<std::string, std::string>& config,
                               const std::set<std::string>& may_differ, std::ostream& log,
                               const std::map<std::string, std::string>& may_be_missing = {},
                               const std::map<std::string, std::string>& implied = {},
                               const std::map<std::string, std::string>& names = {});

}  // namespace ditto
