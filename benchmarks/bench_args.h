#pragma once
// Command line and timing helpers shared by the train-step benchmarks (galley and libtorch),
// so that both programs take the same options and report the same statistic.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace bench {

struct Args {
  std::string model = "simple";
  int batch = 64;
  int threads = 1;
  int warmup = 5;
  int iters = 20;
  int repeats = 5;
  bool json = false;
  bool phases = false;
  std::string device = "cpu";  // "cpu" or "cuda[:N]"
  bool graph = false;          // capture the step in a CUDA graph and time its replays
};

inline void usage(const char* prog) {
  std::fprintf(stderr,
               "usage: %s [--model simple|fashion|vgg] [--batch N] [--threads T] [--warmup W] "
               "[--iters I] [--repeats R] "
               "[--json] [--phases] [--device cpu|cuda:N] [--graph]\n",
               prog);
}

inline bool parse(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto next = [&](int& v) {
      if (i + 1 >= argc) return false;
      v = std::atoi(argv[++i]);
      return v > 0 || (s == "--warmup" && v == 0);
    };
    if (s == "--model") {
      if (i + 1 >= argc) return false;
      a.model = argv[++i];
    } else if (s == "--batch") {
      if (!next(a.batch)) return false;
    } else if (s == "--threads") {
      if (!next(a.threads)) return false;
    } else if (s == "--warmup") {
      if (!next(a.warmup)) return false;
    } else if (s == "--iters") {
      if (!next(a.iters)) return false;
    } else if (s == "--repeats") {
      if (!next(a.repeats)) return false;
    } else if (s == "--json") {
      a.json = true;
    } else if (s == "--phases") {
      a.phases = true;
    } else if (s == "--device") {
      if (i + 1 >= argc) return false;
      a.device = argv[++i];
    } else if (s == "--graph") {
      a.graph = true;
    } else {
      return false;
    }
  }
  return true;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace bench
