#pragma once
/// \file Training checkpoints: everything needed to continue a run exactly where it stopped.
#include <map>
#include <string>
#include <vector>

#include "galley/nn/layer.h"
#include "galley/optim/lr_scheduler.h"
#include "galley/optim/optimizer.h"
#include "galley/parallel/data_parallel.h"

namespace galley::io {

/// What a checkpoint saves and restores. Point at the objects of the run; null members are
/// skipped. The default random generator is always included.
struct TrainingState {
  nn::Layer* model = nullptr;                  ///< a model on one device, or
  DataParallelBase* parallel_model = nullptr;  ///< a data-parallel model (replica 0 is saved)
  optim::Optimizer* optimizer = nullptr;
  optim::LRScheduler* scheduler = nullptr;
  int64_t epoch = 0;  ///< the epoch in progress (or the next one)
  int64_t step = 0;   ///< optimizer steps taken so far; also names the file
  int64_t batch = 0;  ///< batches of `epoch` already consumed (the loader's position)
  std::map<std::string, std::string> extra;  ///< anything else the program wants back
};

/// Writes one checkpoint file (safetensors: "model.*" keys are the model's state_dict names,
/// so the file's model part loads into PyTorch after stripping the prefix).
void save_checkpoint(const std::string& path, const TrainingState& state);
/// Restores a checkpoint into the objects `state` points at and fills its counters. Everything
/// is checked before anything is changed; errors name the file and the entry.
void load_checkpoint(const std::string& path, TrainingState& state);

/// Options of Checkpointer.
struct CheckpointOptions {
  int keep_last = 3;                  ///< older checkpoints are deleted after a save
  std::string prefix = "checkpoint";  ///< file names are <prefix>-<step>.safetensors
};

/// Numbered checkpoints in a directory: save() writes atomically (a process killed mid-save
/// leaves the previous checkpoints intact) and keeps the newest keep_last; resume() loads the
/// newest one that reads back, falling back to older ones.
class Checkpointer {
 public:
  /// Creates the directory if needed and removes temporary files left by killed saves.
  explicit Checkpointer(std::string directory, CheckpointOptions options = {});
  /// Saves `state` as <prefix>-<step>.safetensors; returns the path. In a multi-process job
  /// only process 0 writes (the state is the same everywhere); every process may resume.
  std::string save(const TrainingState& state);
  /// Complete checkpoints, oldest first.
  std::vector<std::string> list() const;
  /// Loads the newest readable checkpoint into `state`; false when there is none.
  bool resume(TrainingState& state);

 private:
  std::string dir_;
  CheckpointOptions opt_;
};

}  // namespace galley::io
