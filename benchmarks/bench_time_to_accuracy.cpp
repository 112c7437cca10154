// Time to a Fashion-MNIST test accuracy in galley (CPU): the "fashion" model of models.h,
// Adam(lr=1e-3), batch 64, images scaled to [0, 1] and normalised with mean 0.2860 and
// std 0.3530, a fresh shuffle each epoch. Every --eval-every steps of an epoch and at its
// end it measures the accuracy on the 10,000 test images; the run stops at the first
// evaluation at or above --target, or after --epochs epochs ("not reached").
// time_to_accuracy_torch.py runs the same recipe in PyTorch; run_cpu.py --suite tta runs both.
//
//   bench_time_to_accuracy [--data DIR] [--threads T] [--target 0.9] [--epochs 3]
//                          [--eval-every 235] [--seed 0] [--json]
//
// The reported time is training only (forward, backward, optimizer and loading batches);
// evaluation time is reported separately.
#include <galley/galley.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "bench_args.h"
#include "models.h"

namespace {

struct Args {
  std::string data = galley::data::default_fashion_mnist_dir();
  int threads = 0;
  double target = 0.9;
  int epochs = 3;
  int eval_every = 235;
  uint64_t seed = 0;
  bool json = false;
};

void usage(const char* prog, std::FILE* out) {
  std::fprintf(out,
               "usage: %s [--data DIR] [--threads T] [--target ACC] [--epochs N] "
               "[--eval-every STEPS] [--seed N] [--json]\n",
               prog);
}

// Parses the command line into `a`. Returns nothing when the program should go on, or the
// status it should exit with: 0 after --help / -h, 2 after a bad option (reason on stderr).
std::optional<int> parse(int argc, char** argv, Args& a) {
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "%s: %s\n", argv[0], why.c_str());
    usage(argv[0], stderr);
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "-h" || k == "--help") {
      usage(argv[0], stdout);
      return 0;
    }
    if (k == "--json") {
      a.json = true;
      continue;
    }
    const bool known = k == "--data" || k == "--threads" || k == "--target" || k == "--epochs" ||
                       k == "--eval-every" || k == "--seed";
    if (!known) return fail("unknown option " + k);
    if (i + 1 >= argc) return fail(k + " needs a value");
    const char* v = argv[++i];
    const auto whole = [&](long long lo, long long hi) -> std::optional<long long> {
      return bench::whole_number(v, lo, hi);
    };
    const std::string bad = k + " " + v + ": expected ";
    if (k == "--data") {
      if (!*v) return fail("--data needs a directory");
      a.data = v;
    } else if (k == "--threads") {
      const auto t = whole(1, 4096);
      if (!t) return fail(bad + "a whole number in [1, 4096]");
      a.threads = int(*t);
    } else if (k == "--target") {
      const auto t = bench::real_in(v, 1e-9, 1);
      if (!t) return fail(bad + "an accuracy in (0, 1]");
      a.target = *t;
    } else if (k == "--epochs") {
      const auto e = whole(1, 1000000);
      if (!e) return fail(bad + "a whole number in [1, 1000000]");
      a.epochs = int(*e);
    } else if (k == "--eval-every") {
      const auto e = whole(1, 1 << 30);
      if (!e) return fail(bad + "a whole number in [1, 1073741824]");
      a.eval_every = int(*e);
    } else if (k == "--seed") {
      const auto s = whole(0, INT64_MAX);
      if (!s) return fail(bad + "a whole number in [0, 2^63)");
      a.seed = uint64_t(*s);
    }
  }
  return std::nullopt;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double evaluate(galley::nn::Layer& model, galley::data::DataLoader& test) {
  galley::NoGradGuard no_grad;
  model.eval();
  int64_t correct = 0, total = 0;
  for (auto& [data, label] : test) {
    // Compared on the host, wherever the model ran.
    const galley::Tensor pred = galley::argmax(model(data), 1).to(galley::Device::cpu());
    const galley::Tensor truth = label.to(galley::Device::cpu());
    const int64_t* p = pred.data<int64_t>();
    const int64_t* y = truth.data<int64_t>();
    for (int64_t i = 0; i < truth.numel(); ++i) correct += p[i] == y[i];
    total += truth.numel();
  }
  model.train();
  return double(correct) / double(total);
}

struct Eval {
  int64_t step;
  double epoch, train_s, accuracy;
};

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (const auto status = parse(argc, argv, a)) return *status;
  try {
    if (a.threads > 0) galley::set_num_threads(a.threads);
    galley::manual_seed(a.seed);
    galley::data::MNIST train(a.data, galley::data::Split::Train, /*normalize=*/true);
    galley::data::MNIST test(a.data, galley::data::Split::Test, /*normalize=*/true);
    bench::Model m = bench::make_model("fashion");
    galley::nn::Layer& model = *m.net;
    galley::optim::Adam opt(model.parameters(), {.learning_rate = 1e-3});
    galley::nn::CrossEntropyLoss loss_fn;
    galley::data::DataLoader loader(train, {.batch_size = 64, .shuffle = true, .seed = a.seed});
    galley::data::DataLoader test_loader(test, {.batch_size = 1000});
    const double steps_per_epoch = double(loader.size());

    std::vector<Eval> evals;
    double train_s = 0, eval_s = 0;
    int64_t step = 0;
    bool reached = false;
    auto check = [&] {
      auto t0 = Clock::now();
      double acc = evaluate(model, test_loader);
      eval_s += seconds_since(t0);
      evals.push_back({step, step / steps_per_epoch, train_s, acc});
      if (!a.json)
        std::printf("step %6lld  epoch %.2f  train %.1f s  test accuracy %.2f%%\n",
                    static_cast<long long>(step), step / steps_per_epoch, train_s, 100 * acc);
      reached = acc >= a.target;
    };
    for (int epoch = 0; epoch < a.epochs && !reached; ++epoch) {
      auto t0 = Clock::now();
      int64_t in_epoch = 0;
      for (auto& [data, label] : loader) {
        auto loss = loss_fn(model(data), label);
        loss.backward();
        opt.step();
        opt.clear_grad();
        ++step;
        if (++in_epoch % a.eval_every == 0 || in_epoch == int64_t(loader.size())) {
          train_s += seconds_since(t0);
          check();
          if (reached) break;
          t0 = Clock::now();
        }
      }
    }

    if (evals.empty())
      throw galley::Error("no evaluation ran: the training set in " + a.data + " has no batch");
    const Eval& last = evals.back();
    if (a.json) {
      std::printf(
          "{\"impl\": \"galley\", \"version\": \"%s\", \"threads\": %d, \"target\": %.4f, "
          "\"reached\": %s, \"time_s\": %s, \"steps\": %lld, \"epochs\": %.3f, "
          "\"train_s\": %.3f, \"eval_s\": %.3f, \"best_accuracy\": %.4f, \"evals\": [",
          GALLEY_BENCH_VERSION, galley::num_threads(), a.target, reached ? "true" : "false",
          reached ? std::to_string(last.train_s).c_str() : "null",
          static_cast<long long>(last.step), last.epoch, train_s, eval_s, last.accuracy);
      for (size_t i = 0; i < evals.size(); ++i)
        std::printf("%s{\"step\": %lld, \"epoch\": %.3f, \"train_s\": %.3f, \"accuracy\": %.4f}",
                    i ? ", " : "", static_cast<long long>(evals[i].step), evals[i].epoch,
                    evals[i].train_s, evals[i].accuracy);
      std::printf("]}\n");
    } else if (reached) {
      std::printf("reached %.2f%% after %lld steps (%.2f epochs) in %.1f s of training\n",
                  100 * last.accuracy, static_cast<long long>(last.step), last.epoch, last.train_s);
    } else {
      std::printf("not reached: %.2f%% after %d epochs (%.1f s of training)\n", 100 * last.accuracy,
                  a.epochs, train_s);
    }
  } catch (const galley::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
