#include "galley/state.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace galley {

void StateDict::set(const std::string& key, double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  values[key] = buf;
}

void StateDict::set(const std::string& key, int64_t v) {
  values[key] = std::to_string(v);
}

double StateDict::get_double(const std::string& key, const std::string& owner) const {
  auto it = values.find(key);
  GALLEY_CHECK(it != values.end(), owner, ": saved state lacks '", key, "'");
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  GALLEY_CHECK(end && *end == '\0' && !it->second.empty(), owner, ": saved value '", key, "' = '",
               it->second, "' is not a number");
  return v;
}

int64_t StateDict::get_int(const std::string& key, const std::string& owner) const {
  auto it = values.find(key);
  GALLEY_CHECK(it != values.end(), owner, ": saved state lacks '", key, "'");
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  GALLEY_CHECK(end && *end == '\0' && !it->second.empty(), owner, ": saved value '", key, "' = '",
               it->second, "' is not an integer");
  GALLEY_CHECK(errno != ERANGE, owner, ": saved value '", key, "' = '", it->second,
               "' is past the range of a 64-bit integer");
  return v;
}

}  // namespace galley
