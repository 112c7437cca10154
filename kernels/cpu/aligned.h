#pragma once
// Vectors whose storage begins on a cache line, for the CPU kernels' buffers and packed weights.
#include <cstddef>
#include <new>
#include <vector>

#include "galley/error.h"

namespace galley::kernels::cpu {

// Storage that begins on a 64-byte cache line. The allocator's own blocks begin 16 bytes past one
// (large blocks just past a page's header), so a 64-byte vector at a whole-vector offset into them
// straddled two lines: on an Intel Xeon each such load or store of the convolutions' buffers split
// in two, and the Winograd and channels paths ran 12-26% slower for it.
template <typename T>
struct CacheAligned {
  using value_type = T;
  static constexpr std::size_t kLine = 64;
  CacheAligned() = default;
  template <typename U>
  CacheAligned(const CacheAligned<U>&) {}
  // A failure is galley's OutOfMemoryError, naming the size, whichever op the buffer is for.
  T* allocate(std::size_t n) {
    try {
      return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kLine)));
    } catch (const std::bad_alloc&) {
      throw OutOfMemoryError(detail::str_cat("a CPU kernel's buffer of ", n * sizeof(T),
                                             " bytes could not be allocated (host out of memory)"));
    }
  }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(kLine)); }
  template <typename U>
  bool operator==(const CacheAligned<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const CacheAligned<U>&) const {
    return false;
  }
};
template <typename T>
using aligned_vector = std::vector<T, CacheAligned<T>>;

}  // namespace galley::kernels::cpu
