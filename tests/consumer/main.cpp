// A program outside the galley tree: one Adam step on a Linear layer through the installed package.
#include <galley/galley.h>

#include <cstdio>

int main() {
  galley::manual_seed(1);
  galley::nn::Linear fc(4, 2);
  galley::optim::Adam opt(fc.parameters(), {.learning_rate = 1e-2});
  auto x = galley::randn({8, 4});
  auto y = galley::Tensor::from_vector(std::vector<int64_t>{0, 1, 0, 1, 0, 1, 0, 1}, {8});
  galley::nn::CrossEntropyLoss loss_fn;
  auto loss = loss_fn(fc(x), y);
  loss.backward();
  opt.step();
  std::printf("consumer ok, loss %.4f\n", loss.item());
  return 0;
}
