#pragma once
/// \file The saved state of a training component (optimizer, scheduler, ...).
#include <map>
#include <string>

#include "galley/tensor.h"

namespace galley {

/// Named tensors plus exact scalars kept as text ("%.17g" for doubles), so that a component
/// restored from it continues bit for bit.
struct StateDict {
  std::map<std::string, Tensor> tensors{};
  std::map<std::string, std::string> values{};

  /// Stores a double exactly.
  void set(const std::string& key, double v);
  /// Stores an integer.
  void set(const std::string& key, int64_t v);
  /// Reads a double stored with set(); errors name `owner` and the key.
  double get_double(const std::string& key, const std::string& owner) const;
  /// Reads an integer stored with set().
  int64_t get_int(const std::string& key, const std::string& owner) const;
};

}  // namespace galley
