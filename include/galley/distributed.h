#pragma once
/// \file The process group of a multi-process (multi-machine) job.
///
/// `mpirun` or `srun` starts the processes; galley reads who it is from their environment and
/// talks to its peers over MPI. A single process needs nothing: every call here is then a no-op.
#include <memory>
#include <string>

#include "galley/parallel/communicator.h"

namespace galley::distributed {

/// Who this process is within the job.
struct ParallelEnv {
  int rank = 0;                   ///< index of this process among all processes
  int world_size = 1;             ///< number of processes
  int local_rank = 0;             ///< index among the processes on this machine
  int local_size = 1;             ///< processes on this machine
  std::string launcher = "none";  ///< "mpirun", "srun", "pmi" or "none"
};

/// Reads rank and world size from the launcher's environment (OMPI_COMM_WORLD_*, PMI_*,
/// SLURM_*) and, for more than one process, initialises MPI and the world communicator.
/// Safe to call more than once; without a launcher it returns rank 0 of 1. A multi-process
/// launch of a build without MPI is a galley::Error.
const ParallelEnv& init_parallel_env(parallel::CommOptions options = {});

/// The environment found by init_parallel_env() (rank 0 of 1 before it is called).
const ParallelEnv& parallel_env();

/// The communicator between the processes of the job; null for a single process.
std::shared_ptr<parallel::Communicator> world();

/// True when this build can talk to other processes (MPI was found at build time).
bool mpi_available();

}  // namespace galley::distributed
