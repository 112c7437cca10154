#pragma once
// Command line, timing and reporting shared by the train-step benchmarks (galley and libtorch),
// so that both programs take the same options and report the same statistic in the same form.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "src/whole_number.h"

namespace bench {

// The whole of `text` as an integer in [lo, hi], or nothing (the caller names the flag): the
// library's reading of its environment's numbers (atoi read "abc" as 0 and 4294967297 as 1).
using galley::detail::whole_number;
// The whole of `text` as a finite number in [lo, hi]; nothing when it is not one.
inline std::optional<double> real_in(const char* text, double lo, double hi) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || errno == ERANGE || !(v >= lo && v <= hi)) return std::nullopt;
  return v;
}

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
  std::string amp = "off";     // "off", "bf16" or "fp16": the forward and the loss under autocast
};

inline void usage(const char* prog, std::FILE* out = stderr) {
  std::fprintf(
      out,
      "usage: %s [--model simple|fashion|vgg|resnet] [--batch N] [--threads T] [--warmup W] "
      "[--iters I] [--repeats R] "
      "[--json] [--phases] [--device cpu|cuda:N] [--graph] [--amp off|bf16|fp16]\n",
      prog);
}

// Parses the command line into `a`. Returns nothing when the program should go on, or the
// status it should exit with: 0 after --help / -h (the usage went to stdout), 2 after a bad
// option (the reason and the usage went to stderr).
inline std::optional<int> parse(int argc, char** argv, Args& a) {
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "%s: %s\n", argv[0], why.c_str());
    usage(argv[0]);
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    const bool takes_value = s == "--model" || s == "--batch" || s == "--threads" ||
                             s == "--warmup" || s == "--iters" || s == "--repeats" ||
                             s == "--device" || s == "--amp";
    if (takes_value && i + 1 >= argc) return fail(s + " needs a value");
    // A whole number in [1, 2^30] (0 too for --warmup): past that a step's sizes overflow, and
    // a cast of 4294967297 to int read as 1.
    auto count = [&](int& v) {
      const auto n = whole_number(argv[++i], s == "--warmup" ? 0 : 1, 1 << 30);
      if (n) v = static_cast<int>(*n);
      return n.has_value();
    };
    if (s == "-h" || s == "--help") {
      usage(argv[0], stdout);
      return 0;
    } else if (s == "--model") {
      a.model = argv[++i];
    } else if (s == "--batch" || s == "--threads" || s == "--warmup" || s == "--iters" ||
               s == "--repeats") {
      int& v = s == "--batch"     ? a.batch
               : s == "--threads" ? a.threads
               : s == "--warmup"  ? a.warmup
               : s == "--iters"   ? a.iters
                                  : a.repeats;
      if (!count(v))
        return fail(s + " " + argv[i] + ": expected a whole number in [1, 1073741824]");
    } else if (s == "--json") {
      a.json = true;
    } else if (s == "--phases") {
      a.phases = true;
    } else if (s == "--device") {
      a.device = argv[++i];
      // "cpu", "cuda" or "cuda:N" exactly (a bad index read as cuda:0).
      const std::string& d = a.device;
      const bool index = d.rfind("cuda:", 0) == 0 && d.size() > 5 && d.size() <= 9 &&
                         d.find_first_not_of("0123456789", 5) == std::string::npos;
      if (d != "cpu" && d != "cuda" && !index)
        return fail("--device " + d + ": expected cpu, cuda or cuda:N");
    } else if (s == "--graph") {
      a.graph = true;
    } else if (s == "--amp") {
      a.amp = argv[++i];
      if (a.amp != "off" && a.amp != "bf16" && a.amp != "fp16")
        return fail("--amp " + a.amp + ": expected off, bf16 or fp16");
    } else {
      return fail("unknown option " + s);
    }
  }
  return std::nullopt;
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

// `repeats` timed blocks of `iters` steps each; `sync` waits for the work (reads the loss).
// Returns samples/s per block.
template <class Step, class Sync>
std::vector<double> time_blocks(const Args& a, Step&& step, Sync&& sync) {
  std::vector<double> rates;
  for (int r = 0; r < a.repeats; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < a.iters; ++i) step();
    sync();
    rates.push_back(double(a.batch) * a.iters / seconds_since(t0));
  }
  return rates;
}

// Milliseconds per step of each part, averaged over iters * repeats extra steps, each part timed
// alone: forward() returns the output that loss(out) takes.
struct Phases {
  double forward = 0, loss = 0, backward = 0, optimizer = 0;
};
template <class Forward, class Loss, class Backward, class Optimizer>
Phases time_phases(const Args& a, Forward&& forward, Loss&& loss, Backward&& backward,
                   Optimizer&& optimizer) {
  Phases ph;
  const int n = a.iters * a.repeats;
  for (int i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    auto out = forward();
    ph.forward += seconds_since(t0);
    t0 = Clock::now();
    loss(out);
    ph.loss += seconds_since(t0);
    t0 = Clock::now();
    backward();
    ph.backward += seconds_since(t0);
    t0 = Clock::now();
    optimizer();
    ph.optimizer += seconds_since(t0);
  }
  for (double* p : {&ph.forward, &ph.loss, &ph.backward, &ph.optimizer}) *p *= 1e3 / n;
  return ph;
}

struct Report {
  std::string impl, version;
  std::string device;  // printed when not empty
  bool graph = false;
  int threads = 1;
  std::vector<double> rates;  // samples/s per timed block
  float final_loss = 0.f;
};

// One JSON object (--json) or a line of text, plus the phases when --phases timed them.
inline void print_report(const Args& a, const Report& r, const Phases& ph) {
  const double med = median(r.rates);
  if (a.json) {
    std::printf("{\"impl\": \"%s\", \"version\": \"%s\", \"model\": \"%s\", \"batch\": %d, ",
                r.impl.c_str(), r.version.c_str(), a.model.c_str(), a.batch);
    if (!r.device.empty())
      std::printf("\"device\": \"%s\", \"graph\": %s, ", r.device.c_str(),
                  r.graph ? "true" : "false");
    std::printf(
        "\"threads\": %d, \"warmup\": %d, \"iters\": %d, \"repeats\": %d, "
        "\"samples_per_s\": %.3f, \"samples_per_s_all\": [",
        r.threads, a.warmup, a.iters, a.repeats, med);
    for (size_t i = 0; i < r.rates.size(); ++i) std::printf("%s%.3f", i ? ", " : "", r.rates[i]);
    std::printf("], \"step_ms\": %.4f, \"final_loss\": %.6f, \"amp\": \"%s\"", 1e3 * a.batch / med,
                r.final_loss, a.amp.c_str());
    if (a.phases)
      std::printf(
          ", \"phases_ms\": {\"forward\": %.4f, \"loss\": %.4f, \"backward\": %.4f, "
          "\"optimizer\": %.4f}",
          ph.forward, ph.loss, ph.backward, ph.optimizer);
    std::printf("}\n");
    return;
  }
  std::printf("%s %s %s batch=%d%s%s%s%s%s threads=%d: %.1f samples/s (%.2f ms/step, loss %.4f)\n",
              r.impl.c_str(), r.version.c_str(), a.model.c_str(), a.batch,
              r.device.empty() ? "" : " ", r.device.c_str(), r.graph ? " graph" : "",
              a.amp == "off" ? "" : " amp ", a.amp == "off" ? "" : a.amp.c_str(), r.threads, med,
              1e3 * a.batch / med, r.final_loss);
  if (a.phases)
    std::printf("  forward %.2f ms  loss %.2f ms  backward %.2f ms  optimizer %.2f ms\n",
                ph.forward, ph.loss, ph.backward, ph.optimizer);
}

}  // namespace bench
