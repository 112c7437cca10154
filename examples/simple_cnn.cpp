// The SimpleCNN program of galley's design: DataParallel over every device, the prefetching
// DataLoader, Adam. Synthetic 3x32x32 data. Runs as it is on one machine, or under
// `mpirun -np N` (each process takes its share of every epoch and its gradients are averaged
// with the others').
//
// Usage: simple_cnn [epochs] [samples]
// Each epoch line ends with the share of the epoch the loop waited for data (starvation) and
// how much of the gradient all-reduce ran hidden behind backward.
#include <galley/galley.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

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

int main(int argc, char** argv) {
  const int epochs = argc > 1 ? std::atoi(argv[1]) : 5;
  const int64_t samples = argc > 2 ? std::atoll(argv[2]) : 2048;
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
      }
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (env.rank == 0)
        std::printf(
            "epoch %d  loss %.4f  %.0f samples/s  %.2f%% starved  %zu device(s) x %d "
            "process(es)  all-reduce %.0f%% hidden\n",
            epoch + 1, loss_sum / batches, env.world_size * sampler->size() / s,
            100 * train_loader.stats().starvation(), model.num_replicas(), env.world_size,
            100 * hidden / batches);
    }
  } catch (const galley::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
