// Trains a small CNN on Fashion-MNIST with a live progress line and per-epoch test accuracy.
//
// Usage: fashion_mnist [--epochs N] [--batch-size N] [--lr X] [--data DIR] [--threads N]
//                      [--limit N] [--target ACC] [--seed N] [--workers N]
//                      [--checkpoint-dir DIR] [--resume] [--stop-after N] [--device D]
// --limit trains on the first N training images (quick runs); --target makes the program exit
// with status 2 when the final test accuracy is below ACC (e.g. 0.91); --workers sets the data
// loader's threads (default 2; 0 loads in the training thread). Each epoch line ends with the
// time the training loop waited for data and its share of the epoch (starvation).
// --checkpoint-dir saves a checkpoint (model, optimizer, schedule, generator) after every epoch;
// --resume continues from the newest one there, exactly as if the run had not stopped;
// --stop-after N ends the run after epoch N (as a killed run would), for trying that out.
// --device cpu or cuda:N picks where to train (default: the first GPU if there is one); on a GPU
// the loader delivers batches there from page-locked buffers, copied on side streams.
#include <galley/galley.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

namespace nn = galley::nn;
using galley::Tensor;

// conv(1->32, 3, pad 1) relu pool2 -> conv(32->64, 3, pad 1) relu pool2 -> fc 3136->128 relu -> fc
// 10
class FashionCNN : public nn::Layer {
 public:
  FashionCNN() {
    register_layer("conv1", conv1_);
    register_layer("conv2", conv2_);
    register_layer("fc1", fc1_);
    register_layer("fc2", fc2_);
  }
  Tensor forward(const Tensor& x) override {
    auto h = pool_(galley::relu(conv1_(x)));
    h = pool_(galley::relu(conv2_(h)));
    h = galley::relu(fc1_(galley::flatten(h, 1)));
    return fc2_(h);
  }

 private:
  nn::Conv2D conv1_{1, 32, 3, {.padding = 1}};
  nn::Conv2D conv2_{32, 64, 3, {.padding = 1}};
  nn::MaxPool2D pool_{2};
  nn::Linear fc1_{64 * 7 * 7, 128};
  nn::Linear fc2_{128, 10};
};

namespace {
struct Args {
  int epochs = 5;
  int64_t batch_size = 64;
  double lr = 1e-3;
  std::string data = galley::data::default_fashion_mnist_dir();
  int threads = 0;
  int64_t limit = 0;
  double target = 0;
  uint64_t seed = 0;
  int workers = 2;
  std::string checkpoint_dir;
  bool resume = false;
  int stop_after = 0;
  galley::Device device = galley::all_devices()[0];
};

galley::Device parse_device(const std::string& s) {
  if (s == "cpu") return galley::Device::cpu();
  if (s.rfind("cuda", 0) == 0) {
    const int index = s.size() > 5 && s[4] == ':' ? std::atoi(s.c_str() + 5) : 0;
    return galley::Device::cuda(index);
  }
  std::fprintf(stderr, "--device %s: expected cpu or cuda:N\n", s.c_str());
  std::exit(64);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", k.c_str());
        std::exit(64);
      }
      return argv[++i];
    };
    if (k == "--epochs")
      a.epochs = std::atoi(next());
    else if (k == "--batch-size")
      a.batch_size = std::atoll(next());
    else if (k == "--lr")
      a.lr = std::atof(next());
    else if (k == "--data")
      a.data = next();
    else if (k == "--threads")
      a.threads = std::atoi(next());
    else if (k == "--limit")
      a.limit = std::atoll(next());
    else if (k == "--target")
      a.target = std::atof(next());
    else if (k == "--seed")
      a.seed = std::strtoull(next(), nullptr, 10);
    else if (k == "--workers")
      a.workers = std::atoi(next());
    else if (k == "--checkpoint-dir")
      a.checkpoint_dir = next();
    else if (k == "--resume")
      a.resume = true;
    else if (k == "--stop-after")
      a.stop_after = std::atoi(next());
    else if (k == "--device")
      a.device = parse_device(next());
    else {
      std::fprintf(stderr, "unknown option %s (see the comment at the top of fashion_mnist.cpp)\n",
                   k.c_str());
      std::exit(64);
    }
  }
  return a;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double evaluate(FashionCNN& model, galley::data::DataLoader& test) {
  galley::NoGradGuard no_grad;
  model.eval();
  int64_t correct = 0, total = 0;
  for (auto& [data, label] : test) {
    const auto p = galley::argmax(model(data), 1).to_vector<int64_t>();
    const auto y = label.to_vector<int64_t>();
    for (size_t i = 0; i < y.size(); ++i) correct += p[i] == y[i];
    total += static_cast<int64_t>(y.size());
  }
  model.train();
  return double(correct) / double(total);
}
}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  try {
    if (args.threads > 0) galley::set_num_threads(args.threads);
    galley::manual_seed(args.seed);
    galley::data::MNIST train_full(args.data, galley::data::Split::Train, /*normalize=*/true);
    galley::data::MNIST test(args.data, galley::data::Split::Test, /*normalize=*/true);
    galley::data::TensorDataset train = train_full;
    if (args.limit > 0 && args.limit < int64_t(train_full.size())) {
      const auto& d = train_full.data();
      const auto& l = train_full.labels();
      train = galley::data::TensorDataset(
          Tensor::from_host(d.raw_data(), {args.limit, 1, 28, 28}),
          Tensor::from_host(l.raw_data(), {args.limit}, galley::DType::Int64));
    }
    std::printf("Fashion-MNIST: %zu training, %zu test images from %s; %s, %d threads\n",
                train.size(), test.size(), args.data.c_str(), args.device.str().c_str(),
                galley::num_threads());

    FashionCNN model;
    model.to(args.device);
    galley::optim::Adam optimizer(model.parameters(), {.learning_rate = args.lr});
    // The rate follows a cosine from lr down to lr/100 over the run, stepped once per epoch.
    galley::optim::CosineAnnealingLR schedule(optimizer, args.epochs, args.lr / 100);
    nn::CrossEntropyLoss loss_fn;
    // Same seed, same order as before the loader had workers: the order depends only on the
    // seed and the epoch.
    galley::data::DataLoader loader(train, {.batch_size = args.batch_size,
                                            .shuffle = true,
                                            .seed = args.seed,
                                            .num_workers = args.workers,
                                            .pin_memory = true,
                                            .device = args.device});
    galley::data::DataLoader test_loader(test, {.batch_size = 1000,
                                                .num_workers = args.workers,
                                                .pin_memory = true,
                                                .device = args.device});
    double accuracy = 0, last_loss = 0;
    int first_epoch = 1;
    std::unique_ptr<galley::io::Checkpointer> checkpoints;
    galley::io::TrainingState state{
        .model = &model, .optimizer = &optimizer, .scheduler = &schedule};
    if (!args.checkpoint_dir.empty()) {
      checkpoints = std::make_unique<galley::io::Checkpointer>(args.checkpoint_dir);
      if (args.resume && checkpoints->resume(state)) {
        first_epoch = static_cast<int>(state.epoch) + 1;
        loader.set_epoch(state.epoch);  // the next epoch's order, as in an uninterrupted run
        std::printf("resumed after epoch %lld from %s\n", static_cast<long long>(state.epoch),
                    checkpoints->list().back().c_str());
      }
    } else if (args.resume) {
      std::fprintf(stderr, "--resume needs --checkpoint-dir\n");
      return 64;
    }
    const auto start = std::chrono::steady_clock::now();
    for (int epoch = first_epoch; epoch <= args.epochs; ++epoch) {
      const auto t0 = std::chrono::steady_clock::now();
      double loss_sum = 0;
      int64_t seen = 0, batches = 0;
      // The losses add up where they are computed; reading them back (a wait for the GPU) is
      // left to the progress line.
      Tensor loss_total = galley::zeros({}, galley::DType::Float32, args.device);
      for (auto& [data, label] : loader) {
        auto loss = loss_fn(model(data), label);
        loss.backward();
        optimizer.step();
        optimizer.clear_grad();
        loss_total = galley::add(loss_total, loss.detach());
        seen += label.numel();
        if (++batches % 50 == 0 || seen == int64_t(train.size())) {
          loss_sum = loss_total.item();
          std::printf("\repoch %d/%d  %6lld/%zu  loss %.4f  %.0f samples/s", epoch, args.epochs,
                      static_cast<long long>(seen), train.size(), loss_sum / batches,
                      seen / seconds_since(t0));
          std::fflush(stdout);
        }
      }
      loss_sum = loss_total.item();  // waits for the epoch's last step
      const double train_s = seconds_since(t0);
      schedule.step();
      last_loss = loss_sum / batches;
      if (checkpoints) {
        state.epoch = epoch;
        state.step += batches;
        checkpoints->save(state);
      }
      const galley::data::LoaderStats data = loader.stats();
      accuracy = evaluate(model, test_loader);
      std::printf(
          "\repoch %d/%d  loss %.4f  %.0f samples/s  train %.1f s  test accuracy %.2f%%  "
          "data wait %.3f s (%.2f%% starved)\n",
          epoch, args.epochs, loss_sum / batches, seen / train_s, train_s, 100 * accuracy,
          data.wait_seconds, 100 * data.starvation());
      if (args.stop_after > 0 && epoch == args.stop_after) {
        std::printf("stopping after epoch %d as asked\n", epoch);
        return 0;
      }
    }
    std::printf("final test accuracy %.2f%% after %d epochs in %.1f s (last epoch loss %.6f)\n",
                100 * accuracy, args.epochs, seconds_since(start), last_loss);
    if (args.target > 0 && accuracy < args.target) {
      std::fprintf(stderr, "test accuracy %.2f%% is below the target %.2f%%\n", 100 * accuracy,
                   100 * args.target);
      return 2;
    }
  } catch (const galley::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
