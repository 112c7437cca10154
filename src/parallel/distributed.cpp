// Launcher detection and the world communicator.
#include "galley/distributed.h"

#include <climits>
#include <cstdlib>
#include <mutex>

#include "src/parallel/mpi.h"
#include "src/whole_number.h"

namespace galley::distributed {

namespace {
struct State {
  std::mutex mu;
  bool initialized = false;
  ParallelEnv env;
  std::shared_ptr<parallel::Communicator> world;
};
State& state() {
  static State* s = new State();  // outlives static destruction: MPI shuts down in its own hook
  return *s;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  const auto x = galley::detail::whole_number(v, 0, INT_MAX);
  GALLEY_CHECK(x.has_value(), "init_parallel_env: environment variable ", name, "='", v,
               "' is not an integer in [0, ", INT_MAX, "]");
  return static_cast<int>(*x);
}

ParallelEnv detect() {
  ParallelEnv e;
  struct Source {
    const char *launcher, *rank, *size, *local_rank, *local_size;
  };
  for (const Source& s :
       {Source{"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
               "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
        Source{"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
        Source{"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"}}) {
    if (!std::getenv(s.rank) || !std::getenv(s.size)) continue;
    e.launcher = s.launcher;
    e.rank = env_int(s.rank, 0);
    e.world_size = env_int(s.size, 1);
    e.local_rank = env_int(s.local_rank, e.rank);
    e.local_size = env_int(s.local_size, e.world_size);
    GALLEY_CHECK(e.world_size >= 1 && e.rank < e.world_size, "init_parallel_env: ", s.rank, "=",
                 e.rank, " is not below ", s.size, "=", e.world_size);
    break;
  }
  return e;
}
}  // namespace

const ParallelEnv& init_parallel_env(parallel::CommOptions options) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.initialized) return s.env;
  ParallelEnv e = detect();
  if (e.world_size > 1) {
    GALLEY_CHECK(mpi_available(), "init_parallel_env: launched as rank ", e.rank, " of ",
                 e.world_size, " by ", e.launcher,
                 " but this build of galley has no MPI (install libopenmpi-dev and rebuild)");
    s.world = detail::make_mpi_world(options);
    GALLEY_CHECK(s.world->size() == e.world_size && s.world->rank() == e.rank,
                 "init_parallel_env: MPI reports rank ", s.world->rank(), " of ", s.world->size(),
                 " but the launcher's environment says ", e.rank, " of ", e.world_size);
  }
  s.env = e;
  s.initialized = true;
  return s.env;
}

const ParallelEnv& parallel_env() {
  return state().env;
}

std::shared_ptr<parallel::Communicator> world() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.world;
}

}  // namespace galley::distributed
