// Trains a small CNN on Fashion-MNIST with a live progress line and per-epoch test accuracy.
//
// Usage: fashion_mnist [options]   (fashion_mnist --help lists them)
// --limit trains on the first N training images (quick runs); --target makes the program exit
// with status 2 when the final test accuracy is below ACC (e.g. 0.91); --workers sets the data
// loader's threads (default 2; 0 loads in the training thread). Each epoch line ends with the
// time the training loop waited for data and its share of the epoch (starvation).
// --checkpoint-dir saves a checkpoint (model, optimizer, schedule, generator) after every epoch;
// --resume continues from the newest one there, exactly as if the run had not stopped;
// --stop-after N ends the run after epoch N (as a killed run would), for trying that out.
// With --checkpoint-dir, SIGTERM or SIGUSR1 (how Slurm and Kubernetes preempt a job) saves a
// checkpoint after the step in progress and exits with status 75 (io::kPreemptedExitCode);
// --resume then continues mid-epoch, exactly as if the run had not stopped. --preempt-at STEP
// sends the run SIGTERM itself after that step, to rehearse a preemption.
// --device cpu or cuda:N picks where to train (default: the first GPU if there is one); on a GPU
// the loader delivers batches there from page-locked buffers, copied on side streams.
// --amp bf16 (or fp16) runs the forward and the loss under galley::amp::Autocast: conv and linear
// in that dtype, the loss in float32, the weights and their update in float32; fp16 adds a
// GradScaler (its state goes into the checkpoints).
//
// The progress line comes every --log-every steps: on a terminal it is one line rewritten in
// place, with the time left in the epoch; in a log file or a pipe it is a plain line each time.
// --metrics FILE appends a JSON line (galley::MetricsLogger) at the same steps, with the loss
// and throughput since the previous line, the learning rate, the loader's starvation and the
// memory in use, and one line per epoch ("event": "epoch") with the epoch's mean loss, its
// throughput and the test accuracy (`accuracy`); scripts/plot-metrics.py FILE OUT.png draws it.
#include <galley/galley.h>

#include "args.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

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

using example::bad_usage;
using example::non_empty;
using example::number;
using example::number_in;
using example::parse_amp;
using example::parse_device;
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
  int64_t preempt_at = 0;
  galley::Device device = galley::all_devices()[0];
  std::string metrics;
  int log_every = 50;
  example::Amp amp;
};

void usage(std::FILE* out, const char* prog) {
  std::fprintf(out,
               "usage: %s [options]\n"
               "Trains a small CNN on Fashion-MNIST and reports the test accuracy after each "
               "epoch.\n\n"
               "  --epochs N            epochs to train (default 5)\n"
               "  --batch-size N        images per step (default 64)\n"
               "  --lr X                Adam's learning rate, cosine-annealed to X/100 "
               "(default 1e-3)\n"
               "  --data DIR            the Fashion-MNIST IDX files (default %s)\n"
               "  --threads N           galley's threads (default: the cores available)\n"
               "  --limit N             train on the first N training images only\n"
               "  --target ACC          exit with status 2 if the final test accuracy is below "
               "ACC\n"
               "  --seed N              seed of the weights and the shuffle (default 0)\n"
               "  --workers N           data loader threads (default 2; 0: load in the training "
               "thread)\n"
               "  --device D            cpu or cuda:N (default: the first GPU, else the CPU)\n"
               "  --checkpoint-dir DIR  save a checkpoint after every epoch (a directory that\n"
               "                        holds some already needs --resume); SIGTERM or SIGUSR1\n"
               "                        saves one after the current step and exits with 75\n"
               "  --resume              continue from the newest checkpoint in --checkpoint-dir\n"
               "  --stop-after N        end the run after epoch N (to try --resume)\n"
               "  --preempt-at STEP     send this run SIGTERM after step STEP (to rehearse a\n"
               "                        preemption; needs --checkpoint-dir)\n"
               "  --metrics FILE        append JSON lines of metrics to FILE (see "
               "scripts/plot-metrics.py)\n"
               "  --log-every N         steps between progress and metrics lines (default 50)\n"
               "  --amp MODE            off, bf16 or fp16: conv and linear under autocast in that\n"
               "                        dtype (fp16 with dynamic loss scaling); default off\n"
               "  -h, --help            show this and exit\n",
               prog, galley::data::default_fashion_mnist_dir().c_str());
}

Args parse(int argc, char** argv) {
  Args a;
  const char* prog = argv[0];
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) bad_usage(prog, k + " needs a value");
      return argv[++i];
    };
    if (k == "-h" || k == "--help") {
      usage(stdout, prog);
      std::exit(0);
    } else if (k == "--epochs")
      a.epochs = number_in<int>(prog, k, next(), 1, 1000000);
    else if (k == "--batch-size")
      a.batch_size = number_in<int64_t>(prog, k, next(), 1, int64_t(1) << 31);
    else if (k == "--lr")
      a.lr = number_in<double>(prog, k, next(), 1e-12, 1e6);
    else if (k == "--data")
      a.data = non_empty(prog, k, next());
    else if (k == "--threads")
      a.threads = number_in<int>(prog, k, next(), 1, 4096);
    else if (k == "--limit")
      a.limit = number_in<int64_t>(prog, k, next(), 1, INT64_MAX);
    else if (k == "--target")
      a.target = number_in<double>(prog, k, next(), 0, 1);
    else if (k == "--seed")
      a.seed = number<uint64_t>(prog, k, next());
    else if (k == "--workers")
      a.workers = number_in<int>(prog, k, next(), 0, 1024);
    else if (k == "--checkpoint-dir")
      a.checkpoint_dir = non_empty(prog, k, next());
    else if (k == "--resume")
      a.resume = true;
    else if (k == "--stop-after")
      a.stop_after = number_in<int>(prog, k, next(), 1, 1000000);
    else if (k == "--preempt-at")
      a.preempt_at = number_in<int64_t>(prog, k, next(), 1, INT64_MAX);
    else if (k == "--device")
      a.device = parse_device(prog, next());
    else if (k == "--metrics")
      a.metrics = non_empty(prog, k, next());
    else if (k == "--log-every")
      a.log_every = number_in<int>(prog, k, next(), 1, INT32_MAX);
    else if (k == "--amp")
      a.amp = parse_amp(prog, next());
    else
      bad_usage(prog, "unknown option " + k);
  }
  if (a.preempt_at != 0 && a.checkpoint_dir.empty())
    bad_usage(prog, "--preempt-at needs --checkpoint-dir");
  if (a.resume && a.checkpoint_dir.empty()) bad_usage(prog, "--resume needs --checkpoint-dir");
  return a;
}

// The progress line. On a terminal it is rewritten in place (carriage return, then erase to
// the end of the line); anywhere else (a log file, a pipe) each update is a line of its own,
// so that logs hold no carriage returns.
class Progress {
 public:
  Progress() : tty_(isatty(fileno(stdout)) == 1) {}
  /// Shows `text` until the next update.
  void update(const std::string& text) {
    if (tty_)
      std::printf("\r%s\x1b[K", text.c_str());
    else
      std::printf("%s\n", text.c_str());
    std::fflush(stdout);
  }
  /// Shows `text` on a terminal until the next update; prints nothing elsewhere.
  void status(const std::string& text) {
    if (tty_) update(text);
  }
  /// Replaces the progress line with `text`, which stays.
  void finish(const std::string& text) {
    std::printf(tty_ ? "\r%s\x1b[K\n" : "%s\n", text.c_str());
    std::fflush(stdout);
  }

 private:
  bool tty_;
};

// "1:05", "1:02:05".
std::string clock_time(double seconds) {
  const long long s = std::isfinite(seconds) && seconds > 0 ? std::llround(seconds) : 0;
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

template <typename... T>
std::string format(const char* fmt, T... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double evaluate(FashionCNN& model, galley::data::DataLoader& test, const example::Amp& amp) {
  galley::NoGradGuard no_grad;
  galley::amp::Autocast autocast(amp.dtype, amp.enabled);
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
    if (train.size() == 0 || test.size() == 0)
      throw galley::Error("the " + std::string(train.size() == 0 ? "training" : "test") +
                          " set in " + args.data + " holds no images");
    std::printf("Fashion-MNIST: %zu training, %zu test images from %s; %s, %d threads, amp %s\n",
                train.size(), test.size(), args.data.c_str(), args.device.str().c_str(),
                galley::num_threads(), args.amp.name());

    FashionCNN model;
    model.to(args.device);
    galley::optim::Adam optimizer(model.parameters(), {.learning_rate = args.lr});
    // The rate follows a cosine from lr down to lr/100 over the run, stepped once per epoch.
    galley::optim::CosineAnnealingLR schedule(optimizer, args.epochs, args.lr / 100);
    nn::CrossEntropyLoss loss_fn;
    galley::amp::GradScaler scaler(args.amp.scaler());
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
    // A checkpoint taken mid-epoch (preempted) also holds the epoch's running sums.
    double resumed_loss = 0;
    int64_t resumed_seen = 0, resumed_batches = 0;
    std::unique_ptr<galley::io::Checkpointer> checkpoints;
    // state.epoch counts the epochs done and state.batch the batches of the next one: a
    // checkpoint at an epoch's end has batch 0.
    galley::io::TrainingState state{
        .model = &model, .optimizer = &optimizer, .scheduler = &schedule, .grad_scaler = &scaler};
    if (!args.checkpoint_dir.empty()) {
      checkpoints = std::make_unique<galley::io::Checkpointer>(
          args.checkpoint_dir,
          galley::io::CheckpointOptions{.preempt_signals = {SIGTERM, SIGUSR1}});
      // A directory holding another run's checkpoints is continued only when asked: a new run
      // there would lose its own first checkpoints to the old run's newer ones, and a later
      // --resume would continue the old run.
      if (!args.resume)
        if (const auto earlier = checkpoints->list(); !earlier.empty())
          throw galley::Error(args.checkpoint_dir +
                              " holds checkpoints of an earlier run (newest " + earlier.back() +
                              "); pass --resume to continue it, or choose another directory");
      if (args.resume && checkpoints->resume(state)) {
        for (const std::string& skipped : checkpoints->skipped())
          std::fprintf(stderr, "skipped %s\n", skipped.c_str());
        const std::string& from = checkpoints->resumed_from();
        first_epoch = static_cast<int>(state.epoch) + 1;
        if (state.batch > 0) {
          // The running sums of the epoch in progress, which this program saves with it.
          auto extra = [&](const char* key) {
            const auto it = state.extra.find(key);
            if (it == state.extra.end())
              throw galley::Error(from + ": a checkpoint taken in epoch " +
                                  std::to_string(first_epoch) + " lacks its entry extra." + key +
                                  " (not written by this program?)");
            return it->second;
          };
          resumed_loss =
              example::number_or_error<double>(from, "extra.loss_sum", extra("loss_sum"));
          resumed_seen = example::number_or_error<int64_t>(from, "extra.seen", extra("seen"));
          resumed_batches = state.batch;
          // The order of the epoch in progress, from where it stopped, as in an uninterrupted
          // run; a checkpoint of another --batch-size or --limit has no such place.
          if (state.batch >= int64_t(loader.size()))
            throw galley::Error(from + " was taken after batch " + std::to_string(state.batch) +
                                " of an epoch, which has " + std::to_string(loader.size()) +
                                " batches here: resume with the run's --batch-size and --limit");
          std::printf("resumed in epoch %d after batch %lld from %s\n", first_epoch,
                      static_cast<long long>(state.batch), from.c_str());
        } else {
          std::printf("resumed after epoch %lld from %s\n", static_cast<long long>(state.epoch),
                      from.c_str());
        }
        loader.set_position(state.epoch, state.batch);
      }
    }
    std::unique_ptr<galley::MetricsLogger> metrics;
    if (!args.metrics.empty())
      metrics = std::make_unique<galley::MetricsLogger>(
          galley::MetricsLoggerOptions{.path = args.metrics, .memory_devices = {args.device}});
    int64_t step = state.step;  // optimizer steps of the whole run, resumed ones included
    Progress progress;
    const auto start = std::chrono::steady_clock::now();
    for (int epoch = first_epoch; epoch <= args.epochs; ++epoch) {
      const auto t0 = std::chrono::steady_clock::now();
      const double lr = optimizer.learning_rate();  // the epoch's rate (the schedule steps after)
      double loss_sum = resumed_loss;
      int64_t seen = resumed_seen, batches = resumed_batches;
      const int64_t seen0 = seen;  // samples/s count this process's samples only
      resumed_loss = 0, resumed_seen = 0, resumed_batches = 0;
      // Since the previous progress line, for the metrics.
      double line_loss = loss_sum, line_t = 0;
      int64_t line_seen = seen, line_batches = batches;
      // The losses add up where they are computed; reading them back (a wait for the GPU) is
      // left to the progress line.
      Tensor loss_total =
          galley::full({}, static_cast<float>(loss_sum), galley::DType::Float32, args.device);
      for (auto& [data, label] : loader) {
        Tensor loss = example::train_step(args.amp, scaler, optimizer,
                                          [&] { return loss_fn(model(data), label); });
        loss_total = galley::add(loss_total, loss.detach());
        seen += label.numel();
        ++step;
        if (step == args.preempt_at) std::raise(SIGTERM);  // handled: a checkpoint below
        if (++batches % args.log_every == 0 || seen == int64_t(train.size())) {
          loss_sum = loss_total.item();
          const double t = seconds_since(t0), rate = (seen - seen0) / t;
          progress.update(format("epoch %d/%d  %6lld/%zu  loss %.4f  %.0f samples/s  ETA %s", epoch,
                                 args.epochs, static_cast<long long>(seen), train.size(),
                                 loss_sum / batches, rate,
                                 clock_time((int64_t(train.size()) - seen) / rate).c_str()));
          if (metrics)
            metrics->log({.step = step,
                          .epoch = epoch,
                          .loss = (loss_sum - line_loss) / double(batches - line_batches),
                          .learning_rate = lr,
                          .samples_per_s = (seen - line_seen) / (t - line_t),
                          .starvation = loader.stats().starvation()});
          line_loss = loss_sum, line_t = t, line_seen = seen, line_batches = batches;
        }
        // A step boundary: after SIGTERM/SIGUSR1, save here and stop (Preempted, caught below).
        if (checkpoints && checkpoints->preempted()) {
          state.epoch = epoch - 1;
          state.batch = batches;
          state.step = step;
          state.extra = {{"loss_sum", format("%a", double(loss_total.item()))},
                         {"seen", std::to_string(seen)}};
          checkpoints->stop_if_preempted(state);
        }
      }
      loss_sum = loss_total.item();  // waits for the epoch's last step
      const double train_s = seconds_since(t0);
      schedule.step();
      last_loss = loss_sum / batches;
      if (checkpoints) {
        state.epoch = epoch;
        state.batch = 0;
        state.step = step;
        state.extra.clear();
        checkpoints->save(state);
      }
      const galley::data::LoaderStats data = loader.stats();
      progress.status(
          format("epoch %d/%d  testing on %zu images", epoch, args.epochs, test.size()));
      const auto e0 = std::chrono::steady_clock::now();
      accuracy = evaluate(model, test_loader, args.amp);
      const double eval_s = seconds_since(e0);
      progress.finish(
          format("epoch %d/%d  loss %.4f  %.0f samples/s  train %.1f s  test accuracy %.2f%%  "
                 "data wait %.3f s (%.2f%% starved)",
                 epoch, args.epochs, loss_sum / batches, (seen - seen0) / train_s, train_s,
                 100 * accuracy, data.wait_seconds, 100 * data.starvation()));
      if (metrics)
        metrics->log(
            {.event = "epoch",
             .step = step,
             .epoch = epoch,
             .loss = last_loss,
             .accuracy = accuracy,
             .learning_rate = lr,
             .samples_per_s = (seen - seen0) / train_s,
             .starvation = data.starvation(),
             .values = {
                 {"train_s", train_s}, {"eval_s", eval_s}, {"data_wait_s", data.wait_seconds}}});
      if (args.stop_after > 0 && epoch == args.stop_after) {
        std::printf("stopping after epoch %d as asked\n", epoch);
        return 0;
      }
    }
    if (args.preempt_at > step)  // a rehearsal that did not happen should not pass for one
      std::fprintf(stderr, "--preempt-at %lld was never reached: the run ended at step %lld\n",
                   static_cast<long long>(args.preempt_at), static_cast<long long>(step));
    if (first_epoch > args.epochs) {  // a finished run resumed: its model, tested
      std::printf("nothing left to train: the checkpoint is after epoch %d of %d\n",
                  first_epoch - 1, args.epochs);
      accuracy = evaluate(model, test_loader, args.amp);
      std::printf("test accuracy %.2f%% after %d epochs\n", 100 * accuracy, first_epoch - 1);
    } else {
      std::printf("final test accuracy %.2f%% after %d epochs in %.1f s (last epoch loss %.6f)\n",
                  100 * accuracy, args.epochs, seconds_since(start), last_loss);
    }
    if (args.target > 0 && accuracy < args.target) {
      std::fprintf(stderr, "test accuracy %.2f%% is below the target %.2f%%\n", 100 * accuracy,
                   100 * args.target);
      return 2;
    }
  } catch (const galley::io::Preempted& p) {
    std::printf("\n%s; exiting with %d to be restarted (--resume continues)\n", p.what(),
                galley::io::kPreemptedExitCode);
    return galley::io::kPreemptedExitCode;
  } catch (const galley::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
