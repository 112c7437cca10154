#pragma once
/// \file Training checkpoints: everything needed to continue a run exactly where it stopped.
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "galley/amp/grad_scaler.h"
#include "galley/nn/layer.h"
#include "galley/optim/lr_scheduler.h"
#include "galley/optim/optimizer.h"
#include "galley/parallel/data_parallel.h"

namespace galley::io {

/// What a checkpoint saves and restores. Point at the objects of the run; null members are
/// skipped. The random generators are always included: the process's default generator, and
/// where the model's draws stand (its layers' named_generators, Dropout's; with a data-parallel
/// model every replica's, and under several processes every process's, gathered into the file
/// by Checkpointer::save), so that a resumed run draws the masks an uninterrupted one would.
struct TrainingState {
  nn::Layer* model = nullptr;                  ///< a model on one device, or
  DataParallelBase* parallel_model = nullptr;  ///< a data-parallel model (replica 0 is saved)
  optim::Optimizer* optimizer = nullptr;
  optim::LRScheduler* scheduler = nullptr;
  amp::GradScaler* grad_scaler = nullptr;  ///< saved when enabled
  int64_t epoch = 0;                       ///< the epoch in progress (or the next one)
  int64_t step = 0;                        ///< optimizer steps taken so far; also names the file
  int64_t batch = 0;  ///< batches of `epoch` already consumed (the loader's position)
  std::map<std::string, std::string> extra{};  ///< anything else the program wants back
};

/// Writes one checkpoint file (safetensors: "model.*" keys are the model's state_dict names,
/// so the file's model part loads into PyTorch after stripping the prefix).
void save_checkpoint(const std::string& path, const TrainingState& state);
/// Restores a checkpoint into the objects `state` points at and fills its counters. Everything
/// is checked before anything is changed; errors name the file and the entry. A generator the
/// file has no state for (a file of an earlier version, or another number of processes) keeps
/// its own.
void load_checkpoint(const std::string& path, TrainingState& state);

/// Exit status for a program that stopped because it was preempted, after saving a checkpoint:
/// 75, EX_TEMPFAIL of <sysexits.h> ("temporary failure; try again later"), the code a caller of
/// Checkpointer::stop_if_preempted returns from main when it catches Preempted. galley-launch
/// restarts a job that exits with it without counting a restart; for Slurm and Kubernetes see
/// docs/launch.md ("Preemption").
inline constexpr int kPreemptedExitCode = 75;

/// Thrown by Checkpointer::stop_if_preempted once a watched signal has arrived and the
/// checkpoint is saved. Not a galley::Error: nothing failed. Catch it in main and return
/// kPreemptedExitCode (library code never exits the process).
class Preempted : public std::runtime_error {
 public:
  /// `signal` is the signal that asked for the stop; `path` the checkpoint just saved.
  Preempted(int signal, std::string path);
  /// The signal that asked for the stop (SIGTERM, SIGUSR1, ...).
  int signal() const { return signal_; }
  /// The checkpoint saved at the stop.
  const std::string& path() const { return path_; }

 private:
  int signal_;
  std::string path_;
};

/// Options of Checkpointer.
struct CheckpointOptions {
  int keep_last = 3;                  ///< older checkpoints are deleted after a save
  std::string prefix = "checkpoint";  ///< file names are <prefix>-<step>.safetensors
  /// Signals that ask for a checkpoint and a clean stop, e.g. {SIGTERM, SIGUSR1} (how Slurm and
  /// Kubernetes preempt a job). While the Checkpointer lives, their handler only records the
  /// signal (async-signal-safe: one atomic store); the program acts on it at its next call to
  /// stop_if_preempted. Empty: the signals keep their previous disposition.
  std::vector<int> preempt_signals{};
};

/// Numbered checkpoints in a directory: save() writes atomically (a process killed mid-save
/// leaves the previous checkpoints intact) and keeps the newest keep_last; resume() loads the
/// newest one that reads back, falling back to older ones.
///
/// Preemption: with `preempt_signals` set, a training loop calls stop_if_preempted(state) at
/// each step boundary (one atomic load when no signal came). After a watched signal it saves
/// `state` and throws Preempted; main catches it and returns kPreemptedExitCode, and the
/// restarted program resumes from that checkpoint:
///
///     io::Checkpointer ckpt(dir, {.preempt_signals = {SIGTERM, SIGUSR1}});
///     try {
///       for (...) { train_step(); state.batch = ++batch; ckpt.stop_if_preempted(state); }
///     } catch (const io::Preempted&) { return io::kPreemptedExitCode; }
///
/// Only one Checkpointer in a process may watch signals at a time.
class Checkpointer {
 public:
  /// Creates the directory if needed, removes temporary files left by killed saves (not those
  /// of saves still running, in this process or another: each holds a lock on its temporary)
  /// and starts watching `options.preempt_signals`.
  explicit Checkpointer(std::string directory, CheckpointOptions options = {});
  /// Gives the watched signals back their previous handlers.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;
  /// Saves `state` as <prefix>-<step>.safetensors; returns the path. In a multi-process job
  /// every process calls it at the same step: process 0 writes (the model state is the same
  /// everywhere) with every process's generator states, gathered over the world communicator;
  /// every process may resume.
  std::string save(const TrainingState& state);
  /// Complete checkpoints, oldest first.
  std::vector<std::string> list() const;
  /// Loads the newest readable checkpoint into `state`; false when there is none. Running out
  /// of memory is an OutOfMemoryError naming the file, not a reason to fall back to an older one.
  bool resume(TrainingState& state);
  /// The file the last successful resume() loaded ("" before one).
  const std::string& resumed_from() const { return resumed_from_; }
  /// The newer files that resume() skipped to reach it, each "path: why" (unreadable ones).
  const std::vector<std::string>& skipped() const { return skipped_; }
  /// True once a watched signal has arrived (for a loop that gathers extra state to save only
  /// when it must).
  bool preempted() const;
  /// The watched signal that arrived last; 0 when none has.
  int preempt_signal() const;
  /// At a step boundary: when a watched signal has arrived, saves `state` and throws Preempted;
  /// otherwise does nothing. It runs no collective (a signal may reach the processes at
  /// different steps), so the file has process 0's generator states only: after a resume the
  /// other processes of a multi-process job draw from fresh streams.
  void stop_if_preempted(const TrainingState& state);

 private:
  struct Watch;
  // Writes the file (process 0) with `generators` as the generator states.
  std::string write(const TrainingState& state,
                    const std::map<std::string, std::string>& generators);
  std::string dir_;
  CheckpointOptions opt_;
  std::string resumed_from_;
  std::vector<std::string> skipped_;
  std::vector<Watch> watches_;  // the previous handlers of the watched signals
};

}  // namespace galley::io
