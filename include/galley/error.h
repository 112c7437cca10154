#pragma once
/// \file Exceptions and the GALLEY_CHECK macro.
#include <exception>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

namespace galley {

/// Every error galley raises derives from this; the message says what is at fault.
///
/// Code that adds context to an error (a layer naming itself, a replica naming its device)
/// rethrows it through these members, so the error keeps its type: an OutOfMemoryError raised
/// deep inside a kernel reaches the caller as an OutOfMemoryError.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  /// A new error of this one's own type carrying `message`.
  virtual std::unique_ptr<Error> with_message(const std::string& message) const;
  /// Throws a copy of this error as its own type.
  [[noreturn]] virtual void raise() const;
  /// Throws an error of this one's own type carrying `message`, with the exception being
  /// handled nested inside it (std::throw_with_nested); call it from a catch block.
  [[noreturn]] virtual void raise_nested(const std::string& message) const;
};

namespace detail {
/// Gives the error type `Self` (derived from `Base`) the members above for its own type.
template <typename Self, typename Base>
class ErrorOfType : public Base {
 public:
  using Base::Base;
  std::unique_ptr<Error> with_message(const std::string& message) const override {
    return std::make_unique<Self>(message);
  }
  [[noreturn]] void raise() const override { throw static_cast<const Self&>(*this); }
  [[noreturn]] void raise_nested(const std::string& message) const override {
    std::throw_with_nested(Self(message));
  }
};
}  // namespace detail

/// Raised when an allocation would exceed a memory cap or the system has no memory left.
class OutOfMemoryError : public detail::ErrorOfType<OutOfMemoryError, Error> {
 public:
  using ErrorOfType::ErrorOfType;
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
/// Throws `message` as `e`'s type when `e` is a galley::Error (of any subclass), else as a plain
/// galley::Error: how a caller adds context to an error without changing its type.
[[noreturn]] void rethrow_with_message(const std::exception& e, const std::string& message);
/// From a catch block: throws `message` with the exception being handled nested inside it, of
/// that exception's type when it is a galley::Error (an OutOfMemoryError stays one), an
/// OutOfMemoryError for a std::bad_alloc, else a plain galley::Error.
[[noreturn]] void raise_nested(const std::string& message);
/// From a catch block: whether the exception being handled is the host out of memory, the one
/// rule raise_nested and rethrow_with_prefix follow: a std::bad_alloc, but not a
/// std::bad_array_new_length (a size out of range, which more memory would not cure: a training
/// loop that lowers its batch on an OutOfMemoryError would try for ever).
bool host_out_of_memory();
/// From a catch block: throws the exception being handled again with `prefix` before its
/// message, so that every std::exception leaves as a galley::Error. A galley::Error keeps its
/// type and its nested cause (rethrow_with_message); a std::bad_alloc (the host's heap exhausted
/// inside a kernel) becomes an OutOfMemoryError and any other std::exception (a thread the
/// library could not start, a std::bad_array_new_length) a plain galley::Error, each with the
/// original nested inside. What is not a std::exception (a user's own type, thrown from a
/// user's layer) is rethrown as it is. How layers, the replica threads and backward add their
/// context.
[[noreturn]] void rethrow_with_prefix(const std::string& prefix);
/// From a catch block: what the exception being handled says (its what(), or that it is not a
/// std::exception).
std::string current_what();
}  // namespace detail

}  // namespace galley

/// Throws galley::Error with file:line, the failed condition and a message built from the rest.
#define GALLEY_CHECK(cond, ...)                                              \
  do {                                                                       \
    if (!(cond))                                                             \
      ::galley::detail::throw_error(__FILE__, __LINE__, #cond,               \
                                    ::galley::detail::str_cat(__VA_ARGS__)); \
  } while (0)
