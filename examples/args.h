#pragma once
// Command-line helpers the examples share: a usage error, and an option's value as a number.
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

}  // namespace example
