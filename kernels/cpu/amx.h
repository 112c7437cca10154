#pragma once
// AMX tiles for the host kernels (internal): whether this build targets them (GALLEY_AMX, with
// AMX-BF16 and AVX512-BF16), whether the kernel grants this process the tile state, and a scope
// that configures a thread's tiles.
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define GALLEY_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace galley::kernels::cpu {

// Rows of every tile here; each row is 64 bytes (32 bfloat16 or 16 float32).
constexpr int64_t kTile = 16;

// Asks the kernel once for the AMX tile state (Linux grants it per process on request).
inline bool amx_granted() {
  static const bool granted = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
}

// Configures this thread's eight tiles as 16 rows of 64 bytes, and releases them when done.
struct TileScope {
  TileScope() {
    alignas(64) unsigned char cfg[64] = {};
    cfg[0] = 1;  // palette 1
    for (int t = 0; t < 8; ++t) {
      cfg[16 + 2 * t] = 64;  // bytes per row
      cfg[48 + t] = kTile;   // rows
    }
    _tile_loadconfig(cfg);
  }
  ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

}  // namespace galley::kernels::cpu
#endif
