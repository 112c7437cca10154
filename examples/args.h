#pragma once
// What the examples share: a usage error, an option's value as a number or a device, and
// --amp with its training step.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include <galley/galley.h>

namespace example {

// Prints "PROG: MESSAGE (PROG --help lists the options)" and exits with 64 (EX_USAGE).
[[noreturn]] inline void bad_usage(const char* prog, const std::string& message) {
  std::fprintf(stderr, "%s: %s (%s --help lists the options)\n", prog, message.c_str(), prog);
  std::exit(64);
}

// The whole of `text` as a number of type T, or a usage error naming the option.
template <typename T>
T number(const char* prog, const std::string& option, const char* text) {
  errno = 0;
  char* end = nullptr;
  T v{};
  if constexpr (std::is_floating_point_v<T>)
    v = static_cast<T>(std::strtod(text, &end));
  else if constexpr (std::is_unsigned_v<T>)
    v = static_cast<T>(std::strtoull(text, &end, 10));
  else
    v = static_cast<T>(std::strtoll(text, &end, 10));
  if (end == text || *end != '\0' || errno == ERANGE)
    bad_usage(prog, option + ": '" + text + "' is not a number");
  return v;
}

// "cpu", "cuda" or "cuda:N" as a device, or a usage error.
inline galley::Device parse_device(const char* prog, const std::string& s) {
  if (s == "cpu") return galley::Device::cpu();
  if (s == "cuda") return galley::Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0)
    return galley::Device::cuda(number<int>(prog, "--device", s.c_str() + 5));
  bad_usage(prog, "--device " + s + ": expected cpu or cuda:N");
}

// What --amp asks for: "off" (float32), "bf16" or "fp16" autocast.
struct Amp {
  bool enabled = false;
  galley::DType dtype = galley::DType::BFloat16;
  const char* name() const {
    return !enabled ? "off" : dtype == galley::DType::BFloat16 ? "bf16" : "fp16";
  }
  // float16's range needs the loss scaled; bfloat16 has float32's.
  galley::amp::GradScalerOptions scaler() const {
    return {.enabled = enabled && dtype == galley::DType::Float16};
  }
};

// One training step under --amp's setting: the forward and the loss (`loss_of()`) under
// autocast, backward from the scaled loss, the scaler's step and update, the gradients cleared.
// Returns the (unscaled) loss.
template <class LossOf>
galley::Tensor train_step(const Amp& amp, galley::amp::GradScaler& scaler,
                          galley::optim::Optimizer& optimizer, LossOf&& loss_of) {
  galley::Tensor loss;
  {
    galley::amp::Autocast autocast(amp.dtype, amp.enabled);
    loss = loss_of();
  }
  scaler.scale(loss).backward();
  scaler.step(optimizer);
  scaler.update();
  optimizer.clear_grad();
  return loss;
}

// "off", "bf16" or "fp16", or a usage error.
inline Amp parse_amp(const char* prog, const std::string& s) {
  if (s == "off") return {};
  if (s == "bf16") return {true, galley::DType::BFloat16};
  if (s == "fp16") return {true, galley::DType::Float16};
  bad_usage(prog, "--amp " + s + ": expected off, bf16 or fp16");
}

}  // namespace example
