// Trains a ResNet-20-style network on Fashion-MNIST: three stages of basic blocks (3x3 conv,
// BatchNorm, ReLU, 3x3 conv, BatchNorm, plus the shortcut), 16, 32 and 64 channels at 28x28,
// 14x14 and 7x7, identity shortcuts inside a stage and 1x1 projections (conv + BatchNorm) where
// the shape changes, global average pooling and one linear layer. SGD with Nesterov momentum and
// weight decay under a one-cycle schedule, label smoothing 0.1; the loader pads and crops at random
// and flips.
//
// Usage: resnet [options]   (resnet --help lists them)
// The model runs under DataParallel over every device (--device picks one) and as it is under
// `mpirun -np N`: each process takes its share of every epoch, gradients are averaged across
// all replicas of all processes, and every replica uses replica 0's BatchNorm statistics at each
// forward (broadcast_buffers), so the running statistics stay the same everywhere.
// --amp bf16 (or fp16) runs the forward and the loss under galley::amp::Autocast (every replica
// inherits it): convolutions and the linear layer in that dtype, BatchNorm's statistics, the loss
// and the weights in float32; fp16 adds a GradScaler, whose Inf check agrees across replicas.
#include <galley/galley.h>

#include "args.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace nn = galley::nn;
using galley::Tensor;

// ResNet-20 (galley/models/resnet.h) with a one-channel input.
constexpr galley::models::ResNetOptions kResNet20{.in_channels = 1, .num_classes = 10};
using galley::models::ResNet;

namespace {

using example::bad_usage;
using example::non_empty;
using example::number;
using example::number_in;
using example::parse_amp;
using example::parse_device;

// The mean and standard deviation of the Fashion-MNIST training images in [0, 1].
constexpr float kFashionMean = 0.2860f, kFashionStd = 0.3530f;

struct Args {
  int epochs = 10;
  int64_t batch_size = 128;
  double lr = 0.1;
  double weight_decay = 5e-4;
  float label_smoothing = 0.1f;
  std::string data = galley::data::default_fashion_mnist_dir();
  int threads = 0;
  int64_t limit = 0;
  int64_t test_limit = 0;
  double target = 0;
  uint64_t seed = 0;
  int workers = 2;
  std::string device;
  std::string metrics;
  example::Amp amp;
};

void usage(std::FILE* out, const char* prog) {
  std::fprintf(
      out,
      "usage: %s [options]\n"
      "Trains a ResNet-20-style network on Fashion-MNIST and reports the test accuracy "
      "after each epoch.\n\n"
      "  --epochs N          epochs to train (default 10)\n"
      "  --batch-size N      images per step and process, at least 2 (BatchNorm; default 128)\n"
      "  --lr X              peak rate of the one-cycle schedule (default 0.1)\n"
      "  --weight-decay X    SGD's weight decay (default 5e-4)\n"
      "  --label-smoothing X the loss's label smoothing (default 0.1)\n"
      "  --data DIR          the Fashion-MNIST IDX files (default %s)\n"
      "  --threads N         galley's threads (default: the cores available)\n"
      "  --limit N           train on the first N training images only\n"
      "  --test-limit N      test on the first N test images only\n"
      "  --target ACC        exit with status 2 if the final test accuracy is below ACC\n"
      "  --seed N            seed of the weights, the shuffle and the augmentation\n"
      "  --workers N         data loader threads (default 2)\n"
      "  --device D          cpu or cuda:N (default: every GPU, else the CPU)\n"
      "  --metrics FILE      append a JSON line per epoch to FILE\n"
      "  --amp MODE          off, bf16 or fp16: conv and linear under autocast in that\n"
      "                      dtype (fp16 with dynamic loss scaling); default off\n"
      "  -h, --help          show this and exit\n",
      prog, galley::data::default_fashion_mnist_dir().c_str());
}

Args parse(int argc, char** argv) {
  Args a;
  const char* prog = argv[0];
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) bad_usage(prog, k + " needs a value");
      return argv[++i];
    };
    if (k == "-h" || k == "--help") {
      usage(stdout, prog);
      std::exit(0);
    } else if (k == "--epochs") {
      a.epochs = number_in<int>(prog, k, next(), 1, 1000000);
    } else if (k == "--batch-size") {
      a.batch_size = number_in<int64_t>(prog, k, next(), 2, int64_t(1) << 31);
    } else if (k == "--lr") {
      a.lr = number_in<double>(prog, k, next(), 1e-12, 1e6);
    } else if (k == "--weight-decay") {
      a.weight_decay = number_in<double>(prog, k, next(), 0, 1e6);
    } else if (k == "--label-smoothing") {
      a.label_smoothing = number_in<float>(prog, k, next(), 0, 1);
    } else if (k == "--data") {
      a.data = non_empty(prog, k, next());
    } else if (k == "--threads") {
      a.threads = number_in<int>(prog, k, next(), 1, 4096);
    } else if (k == "--limit") {
      a.limit = number_in<int64_t>(prog, k, next(), 1, INT64_MAX);
    } else if (k == "--test-limit") {
      a.test_limit = number_in<int64_t>(prog, k, next(), 1, INT64_MAX);
    } else if (k == "--target") {
      a.target = number_in<double>(prog, k, next(), 0, 1);
    } else if (k == "--seed") {
      a.seed = number<uint64_t>(prog, k, next());
    } else if (k == "--workers") {
      a.workers = number_in<int>(prog, k, next(), 0, 1024);
    } else if (k == "--device") {
      a.device = non_empty(prog, k, next());
    } else if (k == "--metrics") {
      a.metrics = non_empty(prog, k, next());
    } else if (k == "--amp") {
      a.amp = parse_amp(prog, next());
    } else {
      bad_usage(prog, "unknown option " + k);
    }
  }
  if (!a.device.empty()) (void)parse_device(prog, a.device);  // checked before any data loads
  return a;
}

std::vector<galley::Device> devices_of(const char* prog, const std::string& s) {
  if (s.empty()) return galley::all_devices();
  return {parse_device(prog, s)};
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Accuracy {
  double plain = 0;    // of the test images as they are
  double flipped = 0;  // of the logits summed over each image and its mirror image
};

// Test accuracy of replica 0 in evaluation mode (the running statistics); `mirrored` yields the
// same batches flipped left to right.
Accuracy evaluate(galley::DataParallel<ResNet>& model, galley::data::DataLoader& test,
                  galley::data::DataLoader& mirrored, const example::Amp& amp) {
  galley::NoGradGuard no_grad;
  galley::amp::Autocast autocast(amp.dtype, amp.enabled);
  model.eval();
  int64_t correct = 0, correct_flipped = 0, total = 0;
  auto m = mirrored.begin();
  for (auto& [data, label] : test) {
    const Tensor logits = model.module(0)(data);
    const Tensor both = galley::add(logits, model.module(0)((*m).data));
    ++m;
    const auto p = galley::argmax(logits, 1).to(galley::Device::cpu()).to_vector<int64_t>();
    const auto pf = galley::argmax(both, 1).to(galley::Device::cpu()).to_vector<int64_t>();
    const auto y = label.to(galley::Device::cpu()).to_vector<int64_t>();
    for (size_t i = 0; i < y.size(); ++i) correct += p[i] == y[i], correct_flipped += pf[i] == y[i];
    total += static_cast<int64_t>(y.size());
  }
  model.train();
  return {double(correct) / double(total), double(correct_flipped) / double(total)};
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
    const auto& env = galley::distributed::init_parallel_env();
    if (args.threads > 0) galley::set_num_threads(args.threads);
    galley::manual_seed(args.seed);
    namespace data = galley::data;
    data::MNIST train_full(args.data, data::Split::Train);
    data::MNIST test_full(args.data, data::Split::Test);
    // The first n images of `full` (all of them when n is 0 or more than it has).
    auto first = [](const data::MNIST& full, int64_t n) {
      if (n <= 0 || n >= int64_t(full.size())) return data::TensorDataset(full);
      return data::TensorDataset(
          Tensor::from_host(full.data().raw_data(), {n, 1, 28, 28}),
          Tensor::from_host(full.labels().raw_data(), {n}, galley::DType::Int64));
    };
    data::TensorDataset train = first(train_full, args.limit);
    data::TensorDataset test = first(test_full, args.test_limit);
    if (train.size() == 0 || test.size() == 0)
      throw galley::Error("the " + std::string(train.size() == 0 ? "training" : "test") +
                          " set in " + args.data + " holds no images");
    const std::vector<galley::Device> devices = devices_of(argv[0], args.device);

    galley::DataParallel<ResNet> model(devices, {}, kResNet20);
    galley::optim::SGD optimizer(model.parameters(), {.learning_rate = args.lr,
                                                      .momentum = 0.9,
                                                      .weight_decay = args.weight_decay,
                                                      .nesterov = true});
    auto sampler = std::make_shared<data::DistributedSampler>(
        train.size(), data::DistributedSamplerOptions{
                          .rank = env.rank, .world_size = env.world_size, .seed = args.seed});
    data::DataLoader loader(train,
                            {.batch_size = args.batch_size,
                             .seed = args.seed,
                             .drop_last = true,
                             .num_workers = args.workers,
                             .sampler = sampler,
                             .transforms = {data::random_crop(2), data::random_horizontal_flip(),
                                            data::normalize({kFashionMean}, {kFashionStd})}});
    data::DataLoader test_loader(test,
                                 {.batch_size = 1000,
                                  .num_workers = args.workers,
                                  .device = devices[0],
                                  .transforms = {data::normalize({kFashionMean}, {kFashionStd})}});
    data::DataLoader mirrored_loader(
        test, {.batch_size = 1000,
               .num_workers = args.workers,
               .device = devices[0],
               .transforms = {data::random_horizontal_flip(1.f),
                              data::normalize({kFashionMean}, {kFashionStd})}});
    if (loader.size() == 0)
      throw galley::Error(std::to_string(train.size()) + " training images (--limit) over " +
                          std::to_string(env.world_size) + " process(es) give no whole batch of " +
                          std::to_string(args.batch_size) + " (--batch-size)");
    galley::optim::OneCycleLR schedule(optimizer,
                                       {.max_lr = args.lr,
                                        .epochs = args.epochs,
                                        .steps_per_epoch = static_cast<int64_t>(loader.size())});
    nn::CrossEntropyLoss loss_fn({.label_smoothing = args.label_smoothing});
    galley::amp::GradScaler scaler(args.amp.scaler());
    std::unique_ptr<galley::MetricsLogger> metrics;
    if (!args.metrics.empty() && env.rank == 0)
      metrics = std::make_unique<galley::MetricsLogger>(
          galley::MetricsLoggerOptions{.path = args.metrics, .memory_devices = devices});
    if (env.rank == 0)
      std::printf(
          "Fashion-MNIST: %zu training, %zu test images; ResNet-20 on %zu device(s) x %d "
          "process(es), %d threads, amp %s\n",
          train.size(), test.size(), model.num_replicas(), env.world_size, galley::num_threads(),
          args.amp.name());

    Accuracy accuracy;
    int64_t step = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int epoch = 1; epoch <= args.epochs; ++epoch) {
      const auto t0 = std::chrono::steady_clock::now();
      Tensor loss_total = galley::zeros({});
      int64_t batches = 0, seen = 0;
      for (auto& [x, y] : loader) {
        Tensor loss =
            example::train_step(args.amp, scaler, optimizer, [&] { return loss_fn(model(x), y); });
        schedule.step();
        loss_total = galley::add(loss_total, loss.detach().to(galley::Device::cpu()));
        ++batches, ++step;
        seen += y.numel();
      }
      const double train_s = seconds_since(t0);
      accuracy = evaluate(model, test_loader, mirrored_loader, args.amp);
      const double loss = loss_total.item() / double(batches);
      if (env.rank == 0)
        std::printf(
            "epoch %d/%d  loss %.4f  %.0f samples/s  train %.1f s  test accuracy %.2f%% "
            "(with mirror images %.2f%%)\n",
            epoch, args.epochs, loss, env.world_size * seen / train_s, train_s,
            100 * accuracy.plain, 100 * accuracy.flipped);
      if (metrics)
        metrics->log({.event = "epoch",
                      .step = step,
                      .epoch = epoch,
                      .loss = loss,
                      .accuracy = accuracy.plain,
                      .learning_rate = optimizer.learning_rate(),
                      .samples_per_s = env.world_size * seen / train_s,
                      .values = {{"train_s", train_s}, {"accuracy_mirrored", accuracy.flipped}}});
      std::fflush(stdout);
    }
    if (env.rank == 0)
      std::printf(
          "final test accuracy %.2f%% (with mirror images %.2f%%) after %d epochs in %.1f s\n",
          100 * accuracy.plain, 100 * accuracy.flipped, args.epochs, seconds_since(start));
    if (args.target > 0 && accuracy.plain < args.target) {
      std::fprintf(stderr, "test accuracy %.2f%% is below the target %.2f%%\n",
                   100 * accuracy.plain, 100 * args.target);
      return 2;
    }
  } catch (const galley::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
