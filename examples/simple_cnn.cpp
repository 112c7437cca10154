// The SimpleCNN program of galley's design: DataParallel over every device, the prefetching
// DataLoader, Adam. Synthetic 3x32x32 data. Runs as it is on one machine, or under
// `mpirun -np N` (each process takes its share of every epoch and its gradients are averaged
// with the others').
//
// Usage: simple_cnn [epochs] [samples] [--metrics FILE]   (simple_cnn --help says more)
// Each epoch line ends with the share of the epoch the loop waited for data (starvation) and
// how much of the gradient all-reduce ran hidden behind backward. --metrics FILE appends one
// JSON line per epoch to FILE (galley::MetricsLogger; the first process only under mpirun).
#include <galley/galley.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace nn = galley::nn;

class SimpleCNN : public nn::Layer {
 public:
  SimpleCNN() {
    register_layer("conv", conv_);
    register_layer("pool", pool_);
    register_layer("fc", fc_);
  }
  galley::Tensor forward(const galley::Tensor& x) override {
    auto h = pool_(galley::relu(conv_(x)));
    return fc_(galley::flatten(h, /*start_axis=*/1));
  }

 private:
  nn::Conv2D conv_{3, 64, 3};
  nn::MaxPool2D pool_{2};
  nn::Linear fc_{64 * 15 * 15, 10};
};

// Synthetic data with a learnable rule: the label is the brightest of 10 image bands.
galley::data::TensorDataset make_dataset(int64_t samples) {
  galley::Generator gen(0);
  auto images = galley::randn({samples, 3, 32, 32}, gen);
  std::vector<int64_t> labels(samples);
  float* p = images.data<float>();
  for (int64_t i = 0; i < samples; ++i) {
    labels[i] = i % 10;
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t x = 0; x < 32; ++x) p[((i * 3 + c) * 32 + 3 * (i % 10)) * 32 + x] += 2.f;
  }
  return galley::data::TensorDataset(images, galley::Tensor::from_vector(labels, {samples}));
}

struct Args {
  int epochs = 5;
  int64_t samples = 2048;
  std::string metrics;
};

void usage(std::FILE* out, const char* prog) {
  std::fprintf(out,
               "usage: %s [EPOCHS [SAMPLES]] [--metrics FILE]\n"
               "Trains the SimpleCNN with DataParallel over every device on SAMPLES synthetic "
               "3x32x32 images\n"
               "(default 5 epochs of 2048); runs as it is under mpirun -np N.\n\n"
               "  --metrics FILE  append a JSON line per epoch to FILE (see "
               "scripts/plot-metrics.py)\n"
               "  -h, --help      show this and exit\n",
               prog);
}

[[noreturn]] void bad_usage(const char* prog, const std::string& message) {
  std::fprintf(stderr, "%s: %s (%s --help says how to call it)\n", prog, message.c_str(), prog);
  std::exit(64);
}

int64_t positive(const char* prog, const char* what, const char* text, int64_t most) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || errno == ERANGE || v < 1 || v > most)
    bad_usage(prog, std::string(what) + ": '" + text + "' is not a whole number in [1, " +
                        std::to_string(most) + "]");
  return v;
}

Args parse(int argc, char** argv) {
  Args a;
  const char* prog = argv[0];
  int positional = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "-h" || k == "--help") {
      usage(stdout, prog);
      std::exit(0);
    } else if (k == "--metrics") {
      if (i + 1 >= argc) bad_usage(prog, "--metrics needs a file name");
      a.metrics = argv[++i];
    } else if (k.size() > 1 && k[0] == '-' && !std::isdigit(static_cast<unsigned char>(k[1]))) {
      bad_usage(prog, "unknown option " + k);
    } else if (positional == 0) {
      a.epochs = static_cast<int>(positive(prog, "EPOCHS", argv[i], 1000000));
      ++positional;
    } else if (positional == 1) {
      a.samples = positive(prog, "SAMPLES", argv[i], int64_t(1) << 40);
      ++positional;
    } else {
      bad_usage(prog, "unexpected argument " + k);
    }
  }
  return a;
}

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  const int epochs = args.epochs;
  const int64_t samples = args.samples;
  try {
    const auto& env = galley::distributed::init_parallel_env();
    auto dataset = make_dataset(samples);

    auto model = galley::DataParallel<SimpleCNN>(galley::all_devices());
    galley::optim::Adam optimizer(model.parameters(), {.learning_rate = 1e-3});
    nn::CrossEntropyLoss loss_fn;
    // Every process sees its own share of each epoch (one process: the whole, shuffled).
    auto sampler = std::make_shared<galley::data::DistributedSampler>(
        dataset.size(),
        galley::data::DistributedSamplerOptions{.rank = env.rank, .world_size = env.world_size});
    galley::data::DataLoader train_loader(
        dataset, {.batch_size = 256, .num_workers = 4, .sampler = sampler});
    // One log for the whole job: the first process writes it.
    std::unique_ptr<galley::MetricsLogger> metrics;
    if (!args.metrics.empty() && env.rank == 0)
      metrics = std::make_unique<galley::MetricsLogger>(galley::MetricsLoggerOptions{
          .path = args.metrics, .memory_devices = galley::all_devices()});
    int64_t step = 0;
    for (int epoch = 0; epoch < epochs; ++epoch) {
      auto t0 = std::chrono::steady_clock::now();
      double loss_sum = 0, hidden = 0;
      int batches = 0;
      for (auto& [data, label] : train_loader) {
        auto loss = loss_fn(model(data), label);
        loss.backward();
        optimizer.step();
        optimizer.clear_grad();
        loss_sum += loss.item();
        hidden += model.last_stats().hidden_fraction();
        ++batches;
        ++step;
      }
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double rate = env.world_size * sampler->size() / s;
      const double starvation = train_loader.stats().starvation();
      if (env.rank == 0)
        std::printf(
            "epoch %d  loss %.4f  %.0f samples/s  %.2f%% starved  %zu device(s) x %d "
            "process(es)  all-reduce %.0f%% hidden\n",
            epoch + 1, loss_sum / batches, rate, 100 * starvation, model.num_replicas(),
            env.world_size, 100 * hidden / batches);
      if (metrics)
        metrics->log({.event = "epoch",
                      .step = step,
                      .epoch = epoch + 1,
                      .loss = loss_sum / batches,
                      .learning_rate = optimizer.learning_rate(),
                      .samples_per_s = rate,
                      .starvation = starvation,
                      .values = {{"allreduce_hidden", hidden / batches},
                                 {"replicas", model.num_replicas()},
                                 {"processes", env.world_size}}});
    }
  } catch (const galley::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
