// A graceful stop on SIGINT / SIGTERM / SIGUSR1 (torchrun's and a scheduler's signal, Ctrl-C;
// SIGUSR1: Slurm's `--signal=B:USR1@N` warning, as PyTorch Lightning takes it, and the one signal
// Open MPI's mpirun forwards to every rank without killing them a second later): the
// handlers set the flag a Trainer watches (TrainerConfig::stop), so the run ends after the
// optimizer step in progress and writes its checkpoint.
//
// Note [Graceful stop]: a first SIGINT, SIGTERM or SIGUSR1 sets the flag and says on stderr that
// the run is finishing its step; the Trainer ends after the optimizer step in progress, writes its
// checkpoint, and the program exits with 128 + the signal (130, 143, 138), the shell's status for a
// process the signal ended (stop_exit_status). A first signal during the last step leaves no
// step to stop before: the run completes as if none had come (its final evaluation, final
// checkpoint, final line, sample and exports, and its own exit status), as the step it let
// finish was the run's last. The Trainer says when that point is passed (TrainerCallbacks::
// on_last_step: its last step begins, after its last check for a stop; stop_handlers_last_step),
// and from then on a first signal says "SIGINT received with no step left to stop before: no
// stop checkpoint; completing the run as usual (...), then exiting as usual (send it again to
// exit at once)" instead of promising a checkpoint. A first signal that came before that point
// but too late to stop the run (before training began in a run of one step; or between the
// Trainer's last check and on_last_step) promised a stop checkpoint: stop_handlers_last_step
// corrects it at once ("SIGINT: no step is left to stop before (the next is the run's last), so
// no stop checkpoint after all; completing the run as usual ..."). A second signal exits at once
// with that status, as an impatient user expects, and says so on stderr, with what the exit
// leaves undone: the stop checkpoint was not written (a stop was announced), or the run did not
// complete (the last step, a stop no longer due), or nothing (training or the run was over; or
// the stop checkpoint was written: "the stop checkpoint was written: DIR/step-N", from the moment
// the Trainer's save returned, TrainerCallbacks::on_stop_checkpoint ->
// stop_handlers_stop_checkpoint_written, until the process exits; before, the second signal
// while the stopped run was finishing, its checkpoint complete, said that it was not written;
// under mpirun only rank 0 saves it, so every process learns the stop's step as the run stops,
// TrainerCallbacks::on_stop -> stop_handlers_stop_due, and from then on says "written" when
// DIR/latest names that step's checkpoint: before, the other ranks said "not written" of the
// checkpoint rank 0 had written);
// and the newest complete checkpoint on disk is the one DIR/latest names (read in the handler
// with open/read/write only, all async-signal-safe), or, with none in DIR, the one the --resume
// directory's latest names ("(in the --resume directory)") or the one --resume named ("(the
// --resume checkpoint)"), or none. (GNU `timeout -s TERM` signals the
// process and then its group, so a run under it may get two SIGTERMs at once, or one: a pending
// signal is not queued twice.) Without a
// checkpoint directory there is nothing to keep: install no handlers (the process ends at once).
// Once the run is over (it finished, stopped or failed, and the program is on its way out:
// disarm_stop_handlers), a first signal is recorded without a word, since no step is left to
// finish: mpirun ending a failed job SIGTERMs the ranks that are already leaving with their own
// error, which then said "finishing the current step and writing a checkpoint"; a second then
// says "exiting at once; the run was over" (not that a stop checkpoint was not written: none
// was promised).
// After the last step, while the program still works on the result (the final checkpoint is
// written, or failed and is reported later; ditto-train prints the GPT's sample and writes the
// --export files: stop_handlers_training_over), no checkpoint is left to promise: a first signal
// says so, "SIGINT received after training: no step left to finish, no checkpoint to write
// (newest on disk: DIR/step-N); finishing the output (final line, sample, exports), then exiting
// as usual (send it again to exit at once)", and the run ends with its own status; a second
// exits at once saying "training was over; newest checkpoint on disk: DIR/step-N" (not that a
// stop checkpoint was not written: none was due).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace ditto::train {

/// Installs the SIGINT, SIGTERM and SIGUSR1 handlers of Note [Graceful stop] for a run that
/// checkpoints into `checkpoint_dir`; `prog` starts their messages on stderr ("ditto-train: signal
/// received: finishing the current step and writing a checkpoint (send it again to exit at once)").
/// A signal the parent ignores stays ignored (nohup, a shell's background job's SIGINT). Returns
/// the flag for TrainerConfig::stop (0 until a signal arrives, then its number); it lives as long
/// as the process. Call it from one thread, before the run starts (a second call re-points the
/// handlers at the new directory and clears the flag: a new run has had no signal yet).
/// `under_mpirun`: the ranks are processes under mpirun, whose own SIGINT / SIGTERM handling
/// SIGKILLs them about a second after forwarding SIGTERM; a first SIGINT or SIGTERM's message then
/// says to stop with `kill -USR1 <mpirun's pid>` instead (mpirun forwards SIGUSR1 and leaves the
/// ranks to finish).
/// `resume_dir`: the run's --resume (DIR, another directory A, or one checkpoint A/step-N), so
/// that "newest checkpoint on disk" names A's while `checkpoint_dir` holds none of its own.
const std::atomic<int>* install_stop_handlers(const std::string& checkpoint_dir,
                                              const std::string& prog, bool under_mpirun = false,
                                              const std::string& resume_dir = "");

/// The run is over (Note [Graceful stop]): from now on a first SIGINT or SIGTERM only sets the
/// flag, writing nothing (the program goes on leaving with its own status); a second still exits
/// at once, as before. install_stop_handlers arms them again. Async-signal-safe.
void disarm_stop_handlers();

/// No stop can come any more (Note [Graceful stop]; TrainerCallbacks::on_last_step): the run's
/// last step begins, after the Trainer's last check for a stop request. From now on a first
/// signal says that the run completes as usual instead of promising a stop checkpoint; if one
/// already promised it, this says at once on stderr that no stop checkpoint comes after all.
/// Call it from the thread that runs the Trainer (not from a signal handler).
/// install_stop_handlers resets it.
void stop_handlers_last_step();

/// The stop checkpoint is on disk at `path` (DIR/step-N; Note [Graceful stop];
/// TrainerCallbacks::on_stop_checkpoint): from now on a second signal says that it was written,
/// naming it, not that it was not. Call it once per run from the thread that runs the Trainer
/// (not from a signal handler). install_stop_handlers resets it.
void stop_handlers_stop_checkpoint_written(const std::string& path);

/// The run stops after step `step` (Note [Graceful stop]; TrainerCallbacks::on_stop): its
/// checkpoint is DIR/step-N (N = `step`, eight digits at least), which rank 0 writes, in this
/// process or (under mpirun) another, or has written (`saved`: the step's periodic checkpoint is
/// the stop's). From now on a signal's message says that it was written when DIR/latest names
/// it (read in the handler with open/read/fstat only; a DIR/latest that named it already now, not
/// `saved`, is an older run's until it is replaced), and that it was not otherwise; a first
/// signal promises nothing (no step is left to finish). Under mpirun with node-local
/// directories, the other ranks' DIR/latest is never rank 0's: they keep saying "not written".
/// Call it once per run from the thread that runs the Trainer (not from a signal handler),
/// before stop_handlers_stop_checkpoint_written. install_stop_handlers resets it.
void stop_handlers_stop_due(std::int64_t step, bool saved = false);

/// Training is over (Note [Graceful stop]): the last step is done and its checkpoint written or
/// reported; what is left is the result's output (a sample, exports). From now on a signal's
/// message says so instead of promising a checkpoint. install_stop_handlers resets it.
/// Async-signal-safe.
void stop_handlers_training_over();

/// The signal that stopped the run (SIGINT, SIGTERM or SIGUSR1), 0 when none arrived.
int stop_signal();

/// "SIGINT", "SIGTERM" or "SIGUSR1" for `sig`, else "signal". Async-signal-safe.
const char* stop_signal_name(int sig);

}  // namespace ditto::train
