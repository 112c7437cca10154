// Built when MPI is absent: a single process needs nothing from it.
#include "galley/distributed.h"
#include "src/parallel/mpi.h"

namespace galley::distributed {

bool mpi_available() {
  return false;
}

namespace detail {
std::shared_ptr<parallel::Communicator> make_mpi_world(parallel::CommOptions) {
  GALLEY_CHECK(false, "MPI is not available in this build of galley");
  return nullptr;
}
}  // namespace detail

}  // namespace galley::distributed
