#pragma once
/// \file Exceptions and the GALLEY_CHECK macro.
#include <sstream>
#include <stdexcept>
#include <string>

namespace galley {

/// Every error galley raises derives from this; the message says what is at fault.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Raised when an allocation would exceed a memory cap or the system has no memory left.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

namespace detail {
/// Concatenates any streamable arguments into one string.
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (void)(os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const char* expr, const std::string& msg);
}  // namespace detail

}  // namespace galley

/// Throws galley::Error with file:line, the failed condition and a message built from the rest.
#define GALLEY_CHECK(cond, ...)                                              \
  do {                                                                       \
    if (!(cond))                                                             \
      ::galley::detail::throw_error(__FILE__, __LINE__, #cond,               \
                                    ::galley::detail::str_cat(__VA_ARGS__)); \
  } while (0)
