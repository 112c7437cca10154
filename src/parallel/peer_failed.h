#pragma once
// The error a collective raises on a participant whose own share went through when another
// participant's failed (internal): an echo of a failure reported by that participant. Whoever
// gathers the participants' errors (DataParallel) reports a participant's own failure before
// an echo, so the caller sees the cause (an OutOfMemoryError stays one).
#include "galley/error.h"

namespace galley::detail {

class PeerFailedError : public ErrorOfType<PeerFailedError, Error> {
 public:
  using ErrorOfType::ErrorOfType;
};

}  // namespace galley::detail
