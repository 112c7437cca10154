#pragma once
// A setting's text read as a whole number (internal): the environment variables the library reads.
#include <cerrno>
#include <cstdlib>
#include <optional>

namespace galley::detail {

// The whole of `text` as an integer in [lo, hi]; nothing when it is not one (a sign or digits
// missing, anything after them, or out of range), for the caller to say so naming the setting.
inline std::optional<long long> whole_number(const char* text, long long lo, long long hi) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || errno == ERANGE || v < lo || v > hi) return std::nullopt;
  return v;
}

}  // namespace galley::detail
