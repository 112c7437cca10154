// galley's own worker threads (kernels/cpu/thread_pool.cpp, behind parallel_for) and the
// default thread count, which follows the process's affinity mask.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "galley/galley.h"
#include "kernels/cpu/parallel.h"
#include "src/thread_budget.h"
#include "test_util.h"

using galley::kernels::cpu::ChunkSums;
using galley::kernels::cpu::in_region;
using galley::kernels::cpu::parallel_chunks;
using galley::kernels::cpu::parallel_for;
using galley::kernels::cpu::region_thread;

TEST(ParallelFor, EveryIndexOnceInContiguousChunksForAnyThreadCount) {
  for (int threads : {1, 2, 3, 4, 7, 16}) {
    galley::detail::ThreadBudget budget(threads);
    for (int64_t n : {1, 2, 5, 64, 1000, 4099}) {
      std::vector<int> hits(static_cast<size_t>(n), 0);
      std::vector<int> owner(static_cast<size_t>(n), -1);
      std::atomic<int> calls{0};
      parallel_for(n, 1, [&](int64_t b, int64_t e) {
        ++calls;
        EXPECT_TRUE(threads == 1 || n == 1 || in_region());
        for (int64_t i = b; i < e; ++i) {
          ++hits[size_t(i)];
          owner[size_t(i)] = region_thread();
        }
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)], 1) << "n " << n << " i " << i;
      const int64_t t = std::min<int64_t>(threads, n), chunk = (n + t - 1) / t;
      EXPECT_EQ(calls.load(), (n + chunk - 1) / chunk) << "n " << n;
      // Thread t owns one contiguous chunk, chunks in thread order: deterministic splits.
      for (int64_t i = 1; i < n; ++i) ASSERT_LE(owner[size_t(i - 1)], owner[size_t(i)]);
    }
  }
}

TEST(ParallelFor, GrainKeepsSmallLoopsOnTheCallingThread) {
  galley::detail::ThreadBudget budget(4);
  int calls = 0;
  parallel_for(100, 1000, [&](int64_t b, int64_t e) {
    ++calls;
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 100);
    EXPECT_FALSE(in_region());
  });
  EXPECT_EQ(calls, 1);
}

TEST(ParallelFor, NestedLoopsRunSeriallyInsideARegion) {
  galley::detail::ThreadBudget budget(3);
  std::vector<int> inner_calls(3, 0);
  parallel_for(3, 1, [&](int64_t b, int64_t) {
    const int t = region_thread();
    parallel_for(50, 1, [&](int64_t ib, int64_t ie) {
      EXPECT_EQ(ib, 0);
      EXPECT_EQ(ie, 50);
      ++inner_calls[size_t(b)];
    });
    EXPECT_EQ(region_thread(), t);
  });
  EXPECT_EQ(inner_calls, (std::vector<int>{1, 1, 1}));
}

// An exception in a region reaches the caller as it was thrown, from a worker's chunk or the
// caller's own: what the caller catches does not depend on the thread count (an OutOfMemoryError
// became a plain Error naming "a worker thread").
TEST(ParallelFor, AnExceptionReachesTheCallerAsItWasThrown) {
  galley::detail::ThreadBudget budget(4);
  for (int64_t failing : {0, 2}) {
    try {
      parallel_for(4, 1, [&](int64_t b, int64_t) {
        if (b == failing) throw std::runtime_error("chunk " + std::to_string(b) + " failed");
      });
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "chunk " + std::to_string(failing) + " failed");
    }
  }
  EXPECT_THROW(parallel_for(4, 1,
                            [](int64_t b, int64_t) {
                              if (b == 3) throw galley::OutOfMemoryError("scratch");
                            }),
               galley::OutOfMemoryError);
  // The workers are still there and well.
  std::atomic<int> sum{0};
  parallel_for(4, 1, [&](int64_t b, int64_t e) { sum += int(e - b); });
  EXPECT_EQ(sum.load(), 4);
}

// Each calling thread has its own workers (DataParallel's CPU replicas run regions at the same
// time); many short regions in a row exercise the hand-over between spinning and sleeping.
TEST(ParallelFor, ConcurrentCallersAndManyShortRegions) {
  std::vector<std::thread> callers;
  std::vector<int64_t> totals(4, 0);
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([c, &totals] {
      galley::detail::ThreadBudget budget(2 + c % 2);
      std::vector<int64_t> v(1000);
      for (int round = 0; round < 2000; ++round) {
        parallel_for(1000, 1, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) v[size_t(i)] = i + round;
        });
        if (round % 500 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      totals[size_t(c)] = std::accumulate(v.begin(), v.end(), int64_t(0));
    });
  for (auto& t : callers) t.join();
  const int64_t want = 999 * 1000 / 2 + 1999 * 1000;
  for (int64_t t : totals) EXPECT_EQ(t, want);
}

TEST(ParallelChunks, EveryChunkOnceAtItsBoundariesAndOneFirstCallAThread) {
  for (int threads : {1, 2, 3, 7}) {
    galley::detail::ThreadBudget budget(threads);
    for (int64_t n : {1, 5, 64, 1000}) {
      for (int64_t chunk : {1, 3, 64}) {
        std::vector<int> hits(static_cast<size_t>(n), 0);
        std::mutex mu;
        std::vector<int> firsts(size_t(threads), 0), ran(size_t(threads), 0);
        parallel_chunks(n, chunk, [&](int64_t b, int64_t e, bool first) {
          ASSERT_EQ(b % chunk, 0) << "n " << n << " chunk " << chunk;
          ASSERT_EQ(e, std::min(n, b + chunk));
          for (int64_t i = b; i < e; ++i) ++hits[size_t(i)];
          std::lock_guard<std::mutex> lock(mu);
          const int t = region_thread();
          EXPECT_EQ(first, ran[size_t(t)] == 0) << "thread " << t << " n " << n;
          firsts[size_t(t)] += first;
          ++ran[size_t(t)];
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)], 1) << "n " << n << " i " << i;
        for (int t = 0; t < threads; ++t) EXPECT_LE(firsts[size_t(t)], 1);
      }
    }
  }
}

// The point of handing chunks out as threads come free: a thread held up (here in its first
// chunk until the other thread has done 21, as a preempted one would be) does fewer chunks, and
// the others take up its share. A static split would leave the caller 20 and hold it up for
// good (30 s, then the test fails); how fast the machine runs the other thread does not matter.
TEST(ParallelChunks, AThreadHeldUpDoesFewerChunks) {
  galley::detail::ThreadBudget budget(2);
  std::atomic<int> on_caller{0}, total{0};
  parallel_chunks(40, 1, [&](int64_t, int64_t, bool) {
    ++total;
    if (region_thread() == 0 && ++on_caller == 1) {
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (total.load() - on_caller.load() < 21 && std::chrono::steady_clock::now() < end)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  EXPECT_EQ(total.load(), 40);
  EXPECT_LT(on_caller.load(), 20) << "the held-up caller did its whole static share";
}

TEST(ParallelChunks, InsideARegionRunsEveryChunkInOrderOnTheCallingThread) {
  galley::detail::ThreadBudget budget(2);
  parallel_for(2, 1, [&](int64_t, int64_t) {
    std::vector<int64_t> starts;
    std::vector<bool> firsts;
    parallel_chunks(10, 4, [&](int64_t b, int64_t, bool first) {
      EXPECT_TRUE(in_region());
      starts.push_back(b);
      firsts.push_back(first);
    });
    EXPECT_EQ(starts, (std::vector<int64_t>{0, 4, 8}));
    EXPECT_EQ(firsts, (std::vector<bool>{true, false, false}));
  });
}

// Per-chunk partial sums added in chunk order: the same bits however the chunks fall to threads,
// here with the caller made slow on every other run so that the split changes.
TEST(ParallelChunks, ChunkSumsGiveTheSameBitsWhicheverThreadRunsAChunk) {
  galley::detail::ThreadBudget budget(2);
  const int64_t n = 64, chunk = 4, elems = 300;
  std::vector<float> values(size_t(n * elems));
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = 1.f / float(3 + i % 97) - 0.01f * float(i % 13);
  // The sums as the chunks define them, on one thread.
  std::vector<float> want(size_t(elems), 0.f);
  for (int64_t c = 0; c < n / chunk; ++c) {
    std::vector<float> part(size_t(elems), 0.f);
    for (int64_t i = c * chunk; i < (c + 1) * chunk; ++i)
      for (int64_t j = 0; j < elems; ++j) part[size_t(j)] += values[size_t(i * elems + j)];
    for (int64_t j = 0; j < elems; ++j) want[size_t(j)] += part[size_t(j)];
  }
  for (int run = 0; run < 6; ++run) {
    const ChunkSums sums(n, chunk, elems);
    std::atomic<int> on_caller{0};
    parallel_chunks(n, chunk, [&](int64_t b, int64_t e, bool) {
      if (run % 2 == 1 && region_thread() == 0) {
        ++on_caller;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      float* part = sums.start(b);
      for (int64_t i = b; i < e; ++i)
        for (int64_t j = 0; j < elems; ++j) part[j] += values[size_t(i * elems + j)];
    });
    const float* got = sums.total();
    ASSERT_EQ(std::vector<float>(got, got + elems), want) << "run " << run;
  }
}

// Without GALLEY_NUM_THREADS, galley uses the cores its affinity mask allows (a job pinned by a
// launcher or taskset), not every core of the machine.
TEST(Threads, AvailableCpusFollowTheAffinityMask) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  int first = -1;
  for (int c = 0; c < CPU_SETSIZE && first < 0; ++c)
    if (CPU_ISSET(c, &saved)) first = c;
  ASSERT_GE(first, 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  EXPECT_EQ(galley::detail::cpus_available(), 1);
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
  EXPECT_EQ(galley::detail::cpus_available(), std::min(CPU_COUNT(&saved), 1 << 20));
}

TEST(Threads, TheDefaultThreadCountIsTheAvailableCpus) {
  if (std::getenv("GALLEY_NUM_THREADS")) GTEST_SKIP() << "GALLEY_NUM_THREADS is set";
  EXPECT_EQ(galley::num_threads(), galley::detail::cpus_available());
  if (const char* want = std::getenv("GALLEY_TEST_EXPECT_THREADS"))
    EXPECT_EQ(galley::num_threads(), std::atoi(want));
}

// A child forked after the workers started runs parallel regions with workers of its own (the
// team it inherited has none behind it: its first region waited for ever).
TEST(ParallelFor, AForkedChildRunsRegions) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer does not start threads in a child forked with threads running";
#endif
  galley::detail::ThreadBudget budget(2);
  std::atomic<int> sum{0};
  parallel_for(4, 1, [&](int64_t b, int64_t e) { sum += int(e - b); });
  ASSERT_EQ(sum.load(), 4);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(20);  // a hang ends the child with SIGALRM
    std::atomic<int> s{0};
    parallel_for(4, 1, [&](int64_t b, int64_t e) { s += int(e - b); });
    const galley::Tensor a = galley::ones({256, 256});
    const float v = galley::sum(galley::matmul(a, a)).item();
    _exit(s.load() == 4 && v == 256.f * 256.f * 256.f ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

// The cores available are the process's, not those of the thread that asks first: a thread
// pinned to one core made every later op of the process single-threaded.
TEST(ParallelFor, TheCoresAvailableAreTheProcesssWhateverThreadAsks) {
  cpu_set_t process;
  CPU_ZERO(&process);
  ASSERT_EQ(sched_getaffinity(getpid(), sizeof process, &process), 0);
  const int expected = galley::detail::cpus_available();
  int first = -1;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &process)) {
      first = c;
      break;
    }
  ASSERT_GE(first, 0);
  int seen = 0;
  std::thread pinned([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
    seen = galley::detail::cpus_available();
  });
  pinned.join();
  EXPECT_EQ(seen, expected);
}
