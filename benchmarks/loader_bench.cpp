// DataLoader benchmark: loader throughput alone, and the consumer's starvation behind a
// simulated training step, on Fashion-MNIST and on CIFAR-shaped synthetic data.
//
// Usage: loader_bench [--dataset fashion|cifar|all] [--workers 0,2] [--step-ms 0,5,20]
//                     [--batch-size N] [--batches N] [--data DIR] [--json]
// Each run takes --batches batches (default: one epoch for throughput, 100 behind a step)
// after a warm-up epoch that starts the workers and touches every buffer. The step is a sleep:
// the training thread is busy elsewhere (a GPU step) and the cores are free for the loader.
// benchmarks/loader_torch.py measures PyTorch's DataLoader the same way.
#include <galley/data/cifar.h>
#include <galley/data/dataloader.h>
#include <galley/data/idx.h>
#include <galley/data/transforms.h>
#include <galley/galley.h>

#include "bench_args.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace data = galley::data;

namespace {

struct Args {
  std::string dataset = "all";
  std::vector<int> workers = {0, 2};
  std::vector<double> step_ms = {0, 5, 20};
  int64_t batch_size = 256;
  int64_t batches = 0;
  std::string data_dir = data::default_fashion_mnist_dir();
  bool json = false;
};

[[noreturn]] void bad_usage(const char* prog, const std::string& why) {
  std::fprintf(stderr, "%s: %s (%s --help lists the options)\n", prog, why.c_str(), prog);
  std::exit(64);
}

// A comma-separated list of numbers in [lo, hi] (whole ones for T = int), or a usage error naming
// the flag: atof read "abc" as 0 and let NaN and negative step times through.
template <typename T>
std::vector<T> parse_list(const char* prog, const std::string& flag, const std::string& s, T lo,
                          T hi) {
  std::vector<T> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::optional<double> v;
    if constexpr (std::is_integral_v<T>) {
      if (auto w = bench::whole_number(item.c_str(), lo, hi)) v = double(*w);
    } else {
      v = bench::real_in(item.c_str(), lo, hi);
    }
    if (!v)
      bad_usage(prog, flag + " " + s + ": '" + item + "' is not a number in [" +
                          (std::ostringstream() << lo << ", " << hi).str() + "]");
    out.push_back(static_cast<T>(*v));
  }
  if (out.empty()) bad_usage(prog, flag + " needs at least one value");
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", k.c_str());
        std::exit(64);
      }
      return argv[++i];
    };
    if (k == "-h" || k == "--help") {
      std::printf(
          "usage: %s [--dataset fashion|cifar|all] [--workers 0,2] [--step-ms 0,5,20] "
          "[--batch-size N]\n"
          "          [--batches N] [--data DIR] [--json]\n"
          "DataLoader throughput alone and the training loop's starvation behind a simulated "
          "step,\nfor each worker count and step time in the lists (defaults as shown; batch "
          "size 256,\none epoch for throughput and 100 batches behind a step).\n",
          argv[0]);
      std::exit(0);
    } else if (k == "--dataset") {
      a.dataset = next();
      if (a.dataset != "fashion" && a.dataset != "cifar" && a.dataset != "all")
        bad_usage(argv[0], "--dataset " + a.dataset + ": expected fashion, cifar or all");
    } else if (k == "--workers") {
      a.workers = parse_list<int>(argv[0], k, next(), 0, 256);
    } else if (k == "--step-ms") {
      a.step_ms = parse_list<double>(argv[0], k, next(), 0, 1e6);
    } else if (k == "--batch-size" || k == "--batches") {
      const std::string text = next();
      const auto v = bench::whole_number(text.c_str(), 1, int64_t(1) << 31);
      if (!v) bad_usage(argv[0], k + " " + text + ": expected a whole number in [1, 2147483648]");
      (k == "--batch-size" ? a.batch_size : a.batches) = *v;
    } else if (k == "--data") {
      a.data_dir = next();
      if (a.data_dir.empty()) bad_usage(argv[0], "--data needs a directory");
    } else if (k == "--json")
      a.json = true;
    else {
      std::fprintf(stderr, "%s: unknown option %s (%s --help lists the options)\n", argv[0],
                   k.c_str(), argv[0]);
      std::exit(64);
    }
  }
  return a;
}

// Fashion-MNIST's training set in memory (float32, normalised), or random images of its shape
// when the files are absent.
std::unique_ptr<data::Dataset> fashion(const std::string& dir, std::string& source) {
  try {
    auto ds = std::make_unique<data::MNIST>(dir, data::Split::Train, /*normalize=*/true);
    source = "Fashion-MNIST files";
    return ds;
  } catch (const galley::Error&) {
    // Damaged files are an error; only a directory without them falls back.
    std::error_code ec;
    if (std::filesystem::exists(dir, ec) && !std::filesystem::is_empty(dir, ec)) throw;
    galley::Generator gen(1);
    source = "random images of Fashion-MNIST's shape (files not found)";
    std::vector<int64_t> labels(60000);
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = int64_t(i % 10);
    return std::make_unique<data::TensorDataset>(galley::randn({60000, 1, 28, 28}, gen),
                                                 galley::Tensor::from_vector(labels, {60000}));
  }
}

// 50000 random uint8 images [3, 32, 32] in memory, like CIFAR-10's training set.
std::unique_ptr<data::Dataset> cifar_shaped() {
  const size_t n = 50000, bytes = 3 * 32 * 32;
  std::vector<uint8_t> pixels(n * bytes);
  uint64_t s = 12345;
  for (auto& p : pixels) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    p = uint8_t(s >> 56);
  }
  std::vector<int64_t> labels(n);
  for (size_t i = 0; i < n; ++i) labels[i] = int64_t(i % 10);
  return std::make_unique<data::UInt8ImageDataset>(std::move(pixels), std::move(labels),
                                                   galley::Shape{3, 32, 32});
}

struct Result {
  double samples_per_s = 0, starvation = 0, wait_ms_per_batch = 0, step_ms = 0;
  int64_t batches = 0;
};

Result run(const data::Dataset& ds, const std::vector<data::Transform>& transforms, int workers,
           double step_ms, const Args& args) {
  data::DataLoader loader(ds, {.batch_size = args.batch_size,
                               .shuffle = true,
                               .seed = 1,
                               .num_workers = workers,
                               .transforms = transforms});
  for (auto& b : loader) (void)b;  // warm-up epoch: workers started, buffers touched
  if (loader.size() == 0) throw galley::Error("the dataset has no batch to load");
  const int64_t want = args.batches > 0
                           ? args.batches
                           : (step_ms > 0 ? std::min<int64_t>(100, loader.size()) : loader.size());
  using Clock = std::chrono::steady_clock;
  Result r;
  r.step_ms = step_ms;
  double wait = 0;
  int64_t samples = 0;
  const auto t0 = Clock::now();
  while (r.batches < want) {
    auto it = loader.begin();
    for (; it != loader.end() && r.batches < want; ++it) {
      const auto w0 = Clock::now();
      auto& [x, y] = *it;
      wait += std::chrono::duration<double>(Clock::now() - w0).count();
      samples += y.numel();
      ++r.batches;
      if (step_ms > 0)
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(step_ms));
    }
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  r.samples_per_s = samples / wall;
  r.starvation = wait / wall;
  r.wait_ms_per_batch = 1e3 * wait / r.batches;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
    struct Case {
      std::string name;
      std::unique_ptr<data::Dataset> ds;
      std::vector<data::Transform> transforms;
      std::string source;
    };
    std::vector<Case> cases;
    if (args.dataset == "fashion" || args.dataset == "all") {
      Case c{"fashion", nullptr, {}, ""};
      c.ds = fashion(args.data_dir, c.source);
      cases.push_back(std::move(c));
    }
    if (args.dataset == "cifar" || args.dataset == "all")
      cases.push_back({"cifar",
                       cifar_shaped(),
                       {data::random_crop(4), data::random_horizontal_flip(),
                        data::normalize(data::kCifar10Mean, data::kCifar10Std)},
                       "random uint8 [3, 32, 32]; uint8->float, crop 4, flip, normalise"});
    if (!args.json)
      std::printf("%-8s %7s %7s %8s %12s %11s %10s\n", "dataset", "workers", "step", "batches",
                  "samples/s", "starvation", "wait/batch");
    for (const Case& c : cases)
      for (double step : args.step_ms)
        for (int w : args.workers) {
          const Result r = run(*c.ds, c.transforms, w, step, args);
          if (args.json)
            std::printf(
                "{\"framework\": \"galley\", \"dataset\": \"%s\", \"workers\": %d, \"step_ms\": "
                "%g, \"batch_size\": %lld, \"batches\": %lld, \"samples_per_s\": %.1f, "
                "\"starvation\": %.5f, \"wait_ms_per_batch\": %.4f}\n",
                c.name.c_str(), w, step, static_cast<long long>(args.batch_size),
                static_cast<long long>(r.batches), r.samples_per_s, r.starvation,
                r.wait_ms_per_batch);
          else
            std::printf("%-8s %7d %5gms %8lld %12.0f %10.2f%% %8.3fms\n", c.name.c_str(), w, step,
                        static_cast<long long>(r.batches), r.samples_per_s, 100 * r.starvation,
                        r.wait_ms_per_batch);
          std::fflush(stdout);
        }
    if (!args.json)
      for (const Case& c : cases) std::printf("%s: %s\n", c.name.c_str(), c.source.c_str());
  } catch (const galley::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
