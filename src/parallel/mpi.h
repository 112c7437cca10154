#pragma once
// The MPI backend (internal). mpi_communicator.cpp implements it where MPI was found at build
// time, mpi_stub.cpp where it was not.
#include <memory>

#include "galley/parallel/communicator.h"

namespace galley::distributed::detail {

// Initialises MPI (thread-multiple) once and returns a communicator over MPI_COMM_WORLD.
std::shared_ptr<parallel::Communicator> make_mpi_world(parallel::CommOptions options);

}  // namespace galley::distributed::detail
