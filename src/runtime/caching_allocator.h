#pragma once
// Device memory for tensors: a caching allocator with a hard cap (internal).
//
// Device allocation (cudaMalloc) is slow and synchronises the device, so memory is taken from
// the device in segments and handed out as blocks: a freed block goes back to a pool and is
// reused by a later request of a similar size on the same stream, split when much larger and
// merged again with free neighbours. A cap (GALLEY_GPU_MEMORY_FRACTION or
// GALLEY_GPU_MEMORY_LIMIT_MB, or set_limit) bounds what the allocator reserves from the device,
// which is what lets several training jobs share one GPU safely. The device itself is behind
// DeviceMemory, so the bookkeeping is tested on machines without a GPU.
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace galley::detail {

// Where segments come from: the CUDA runtime, or a fake in tests.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // `bytes` of device memory, or nullptr when the device has no more.
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  // The device's total memory (what a fraction is a fraction of).
  virtual size_t total_bytes() const = 0;
  // For messages: "cuda:0".
  virtual std::string name() const = 0;
};

struct AllocatorStats {
  size_t allocated = 0;  // bytes in blocks handed out (rounded sizes)
  size_t reserved = 0;   // bytes in segments taken from the device
  size_t peak_allocated = 0;
  size_t peak_reserved = 0;
  uint64_t device_allocs = 0;  // segments taken from the device (cudaMalloc calls)
  uint64_t device_frees = 0;
  uint64_t reuses = 0;  // requests served from the pool
  size_t limit = 0;     // the cap on `reserved`; 0 = none
};

// The cap from the environment for a device of `total` bytes: GALLEY_GPU_MEMORY_LIMIT_MB if set,
// else GALLEY_GPU_MEMORY_FRACTION, else 0 (no cap). Bad values are errors naming the variable.
size_t memory_limit_from_env(size_t total);

class CachingAllocator {
 public:
  // Requests up to this size come from small segments.
  static constexpr size_t kSmallRequest = size_t(1) << 20;
  static constexpr size_t kSmallSegment = size_t(2) << 20;
  static constexpr size_t kRound = 512;  // every block is a multiple of this

  CachingAllocator(std::unique_ptr<DeviceMemory> memory, size_t limit);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` for use on `stream`. Over the cap, or when the device is full
  // even after returning the cache, throws galley::OutOfMemoryError naming the request, the
  // bytes in use and the cap. `stream` is a pool key: a block is only ever reused by requests
  // with the same key, which is how a CUDA graph's memory stays its own (its capture allocates
  // under a private key). With `may_release` false (during a capture, where returning memory to
  // the device would synchronise it) the cache is not emptied to make room.
  void* allocate(size_t bytes, uintptr_t stream = 0, bool may_release = true);
  // Returns a block to the pool of its stream. With `capture_pool` (the pool of a CUDA graph
  // being captured by the calling thread), a block of another pool is held back instead until
  // release_pool(capture_pool): the graph's kernels may use it at every replay.
  void free(void* p, uintptr_t capture_pool = 0);
  // Gives every completely free segment back to the device.
  void empty_cache();
  // Marks `stream` as a private pool (a CUDA graph's): until release_pool, its memory is never
  // given back to the device, whatever empty_cache, the cap or a full device ask for.
  void open_pool(uintptr_t stream);
  // Ends a private pool: its completely free segments go back to the device now, the others as
  // soon as their last block is freed.
  void release_pool(uintptr_t stream);
  // Changes the cap (0 = none); reserved memory above it is returned as far as it is free.
  void set_limit(size_t bytes);
  // Brackets a CUDA graph capture on this device (any thread). While one is underway no memory
  // goes back to the device: cudaFree synchronises the device and would invalidate the capture,
  // so segments freed meanwhile are kept and returned when the last capture ends.
  void begin_capture();
  void end_capture();
  AllocatorStats stats() const;
  const DeviceMemory& memory() const { return *mem_; }

 private:
  struct Block {
    void* ptr;
    size_t size;
    uintptr_t stream;
    bool small;
    bool allocated = false;
    Block* prev = nullptr;  // neighbours inside the same segment
    Block* next = nullptr;
  };
  struct Order {  // best fit: same stream, smallest size that fits, lowest address
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, Order>;

  struct Segment {
    void* ptr;
    size_t size;
  };
  Block* take_from_pool(Pool& pool, size_t size, uintptr_t stream);
  Block* new_segment(size_t size, bool small, uintptr_t stream, size_t requested, bool may_release);
  void split(Block* b, size_t size, Pool& pool);
  // Caller holds mu_. Takes every completely free segment (only those of `stream` unless `any`
  // is set) out of the pools into `out`, or, while a capture is underway, into deferred_.
  void take_free_segments(std::vector<Segment>& out, bool any = true, uintptr_t stream = 0);
  // Caller holds mu_. Takes the whole free segment `b` out of galley's hands, as above.
  void retire(Block* b, std::vector<Segment>& out);
  // Returns `segs` (already taken off the statistics by retire) to the device; with `locked` the
  // caller holds mu_ (an allocation making room), else the device calls run outside the mutex,
  // so that other threads keep allocating meanwhile.
  void give_back(std::vector<Segment>& segs, bool locked);
  [[noreturn]] void out_of_memory(size_t requested, size_t segment, const char* why) const;

  std::unique_ptr<DeviceMemory> mem_;
  mutable std::mutex mu_;
  Pool small_, large_;
  std::unordered_map<void*, Block*> live_;
  std::set<uintptr_t> open_pools_;  // private pools in use: never released
  std::set<uintptr_t> dead_pools_;  // ended pools with blocks still in use
  int captures_ = 0;                // CUDA graph captures underway on the device
  std::vector<Segment> deferred_;   // free segments kept back while a capture is underway
  int releasing_ = 0;               // segments being returned outside the mutex right now
  std::condition_variable released_;
  std::unordered_map<uintptr_t, std::vector<void*>> held_;  // blocks freed during a capture
  AllocatorStats stats_;
};

}  // namespace galley::detail
