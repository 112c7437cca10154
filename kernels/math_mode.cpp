#include "kernels/math_mode.h"

#include <atomic>

namespace galley::kernels {
namespace {
std::atomic<bool> tf32{false};
std::atomic<bool> deterministic_only{false};
}  // namespace

void set_allow_tf32(bool on) {
  tf32 = on;
}
bool allow_tf32() {
  return tf32.load();
}
void set_deterministic(bool on) {
  deterministic_only = on;
}
bool deterministic() {
  return deterministic_only.load();
}

}  // namespace galley::kernels
