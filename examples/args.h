#pragma once
// What the examples share: a usage error, an option's value as a number or a device, and
// --amp with its training step.
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>

#include <galley/galley.h>

namespace example {

// Prints "PROG: MESSAGE (PROG --help lists the options)" and exits with 64 (EX_USAGE).
[[noreturn]] inline void bad_usage(const char* prog, const std::string& message) {
  std::fprintf(stderr, "%s: %s (%s --help lists the options)\n", prog, message.c_str(), prog);
  std::exit(64);
}

// The whole of `text` as a number of type T, or a usage error naming the option: a number past
// T's range (4294967297 epochs read as 1), a negative one for an unsigned T (-1 read as 2^64 - 1)
// and a floating one that is not finite (NaN passes every comparison) are errors too.
template <typename T>
T number(const char* prog, const std::string& option, const char* text) {
  errno = 0;
  char* end = nullptr;
  const std::string what = option + ": '" + text + "'";
  if constexpr (std::is_floating_point_v<T>) {
    const double v = std::strtod(text, &end);
    if (end == text || *end != '\0') bad_usage(prog, what + " is not a number");
    if (!std::isfinite(v) || errno == ERANGE ||
        std::fabs(v) > double(std::numeric_limits<T>::max()))
      bad_usage(prog, what + " is not a finite number");
    return static_cast<T>(v);
  } else if constexpr (std::is_unsigned_v<T>) {
    const char* digits = text;
    while (std::isspace(static_cast<unsigned char>(*digits))) ++digits;
    const unsigned long long v = std::strtoull(text, &end, 10);
    if (end == text || *end != '\0') bad_usage(prog, what + " is not a number");
    if (*digits == '-' || errno == ERANGE || v > std::numeric_limits<T>::max())
      bad_usage(prog, what + " is out of range [0, " +
                          std::to_string(std::numeric_limits<T>::max()) + "]");
    return static_cast<T>(v);
  } else {
    const long long v = std::strtoll(text, &end, 10);
    if (end == text || *end != '\0') bad_usage(prog, what + " is not a number");
    if (errno == ERANGE || v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max())
      bad_usage(prog, what + " is out of range [" + std::to_string(std::numeric_limits<T>::min()) +
                          ", " + std::to_string(std::numeric_limits<T>::max()) + "]");
    return static_cast<T>(v);
  }
}

// number<T>, which must also lie in [lo, hi].
template <typename T>
T number_in(const char* prog, const std::string& option, const char* text, T lo, T hi) {
  const T v = number<T>(prog, option, text);
  if (v < lo || v > hi) {
    std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    if constexpr (std::is_floating_point_v<T>) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "[%g, %g]", double(lo), double(hi));
      range = buf;
    }
    bad_usage(prog, option + " " + text + ": must be in " + range);
  }
  return v;
}

// A number saved as text in a file (a checkpoint's extra entries): the whole of `text`, finite,
// or an error naming the file and the entry (strtod took garbage as 0).
template <typename T>
T number_or_error(const std::string& file, const std::string& entry, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const char* s = text.c_str();
  bool ok;
  T v{};
  if constexpr (std::is_floating_point_v<T>) {
    const double d = std::strtod(s, &end);
    ok = end != s && *end == '\0' && std::isfinite(d);
    v = static_cast<T>(d);
  } else {
    const long long n = std::strtoll(s, &end, 10);
    ok = end != s && *end == '\0' && errno != ERANGE && n >= 0;
    v = static_cast<T>(n);
  }
  if (!ok) throw galley::Error(file + ": entry " + entry + " '" + text + "' is not a valid number");
  return v;
}

// A path or name option's value, which must not be empty (an empty one silently turned the
// feature off, or searched the root directory).
inline const char* non_empty(const char* prog, const std::string& option, const char* text) {
  if (!*text) bad_usage(prog, option + " needs a non-empty value");
  return text;
}

// "cpu", "cuda" or "cuda:N" as a device of this machine, or a usage error (before any data is
// loaded).
inline galley::Device parse_device(const char* prog, const std::string& s) {
  if (s == "cpu") return galley::Device::cpu();
  int index = -1;
  if (s == "cuda")
    index = 0;
  else if (s.rfind("cuda:", 0) == 0)
    index = number_in<int>(prog, "--device", s.c_str() + 5, 0, 1 << 20);
  else
    bad_usage(prog, "--device " + s + ": expected cpu or cuda:N");
  if (index >= galley::cuda_device_count())
    bad_usage(prog, "--device " + s + ": this machine has " +
                        std::to_string(galley::cuda_device_count()) + " CUDA device(s)");
  return galley::Device::cuda(index);
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
