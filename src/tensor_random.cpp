// Random numbers: the generator (xoshiro256**), the default generator, and the random factories
// (rand, randn, uniform, randint and their _like forms).
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "galley/tensor.h"

namespace galley {

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}
std::mutex& generator_mutex() {
  static std::mutex mu;
  return mu;
}
}  // namespace

Generator::Generator(uint64_t seed) {
  manual_seed(seed);
}

void Generator::manual_seed(uint64_t seed) {
  for (auto& s : state_) s = splitmix64(seed);
  has_spare_ = false;
}

uint64_t Generator::next_u64() {  // xoshiro256**
  uint64_t result = rotl(state_[1] * 5, 7) * 9;
  uint64_t t = state_[1] << 17;
  state_[2] ^= state_[0];
  state_[3] ^= state_[1];
  state_[1] ^= state_[2];
  state_[0] ^= state_[3];
  state_[2] ^= t;
  state_[3] = rotl(state_[3], 45);
  return result;
}

float Generator::next_float() {
  return (next_u64() >> 40) * (1.0f / 16777216.0f);
}

float Generator::next_normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1, u2;
  do u1 = (next_u64() >> 11) * (1.0 / 9007199254740992.0);
  while (u1 <= 0.0);
  u2 = (next_u64() >> 11) * (1.0 / 9007199254740992.0);
  double r = std::sqrt(-2.0 * std::log(u1));
  spare_ = static_cast<float>(r * std::sin(2 * M_PI * u2));
  has_spare_ = true;
  return static_cast<float>(r * std::cos(2 * M_PI * u2));
}

std::string Generator::state() const {
  char buf[128];
  uint32_t spare_bits;
  std::memcpy(&spare_bits, &spare_, 4);
  std::snprintf(buf, sizeof buf, "%016llx %016llx %016llx %016llx %d %08x",
                static_cast<unsigned long long>(state_[0]),
                static_cast<unsigned long long>(state_[1]),
                static_cast<unsigned long long>(state_[2]),
                static_cast<unsigned long long>(state_[3]), has_spare_ ? 1 : 0, spare_bits);
  return buf;
}

void Generator::set_state(const std::string& text) {
  unsigned long long s[4];
  int spare = 0;
  unsigned int bits = 0;
  char tail = 0;
  const int n = std::sscanf(text.c_str(), "%llx %llx %llx %llx %d %x%c", &s[0], &s[1], &s[2], &s[3],
                            &spare, &bits, &tail);
  // sscanf's %llx takes a sign and saturates past 64 bits: state() writes neither, so a text
  // with a sign or a word of more than 16 digits is not one of its states (a damaged one).
  bool words_fit = text.find_first_of("+-") == std::string::npos;
  size_t run = 0;
  for (char c : text) {
    run = std::isxdigit(static_cast<unsigned char>(c)) ? run + 1 : 0;
    words_fit = words_fit && run <= 16;
  }
  GALLEY_CHECK(n == 6 && (spare == 0 || spare == 1) && words_fit, "Generator::set_state: '", text,
               "' is not a generator state");
  // xoshiro256's all-zero state stays zero (rand() would give 0 forever and randn() never
  // return), and a kept normal value must be a number: no generator holds either.
  GALLEY_CHECK((s[0] | s[1] | s[2] | s[3]) != 0, "Generator::set_state: '", text,
               "' is the all-zero state, which no generator reaches");
  float kept;
  std::memcpy(&kept, &bits, 4);
  GALLEY_CHECK(spare == 0 || std::isfinite(kept), "Generator::set_state: '", text,
               "' keeps a normal value that is not finite");
  for (int i = 0; i < 4; ++i) state_[i] = s[i];
  has_spare_ = spare == 1;
  spare_ = kept;
}

namespace {
Generator& process_generator() {
  static Generator gen(0);
  return gen;
}
thread_local Generator* scoped_generator = nullptr;  // GeneratorScope's, on this thread
}  // namespace

Generator& default_generator() {
  return scoped_generator ? *scoped_generator : process_generator();
}

void manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(generator_mutex());
  process_generator().manual_seed(seed);
}

std::string default_generator_state() {
  std::lock_guard<std::mutex> lock(generator_mutex());
  return process_generator().state();
}

void set_default_generator_state(const Generator& from) {
  std::lock_guard<std::mutex> lock(generator_mutex());
  process_generator() = from;
}

GeneratorScope::GeneratorScope(Generator& gen) : previous_(scoped_generator) {
  scoped_generator = &gen;
}

GeneratorScope::~GeneratorScope() {
  scoped_generator = previous_;
}

uint64_t next_seed(Generator& gen) {
  std::lock_guard<std::mutex> lock(generator_mutex());
  return gen.next_u64();
}

uint64_t stream_seed(uint64_t seed, uint64_t stream) {
  if (stream == 0) return seed;
  // splitmix64's finaliser of the stream
  uint64_t z = stream * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return seed ^ z ^ (z >> 31);
}

namespace {
// The bounds of a uniform draw: low <= high, both finite and their span too (as PyTorch's
// uniform_ asks: an infinite span gave infinities and NaNs).
void check_bounds(const char* op, float low, float high) {
  GALLEY_CHECK(std::isfinite(low) && std::isfinite(high), op, ": low ", low, " and high ", high,
               " must be finite");
  GALLEY_CHECK(low <= high, op, ": low ", low, " is above high ", high);
  GALLEY_CHECK(std::isfinite(high - low), op, ": high - low (", high, " - ", low,
               ") must be finite: at most float32's largest, 3.40282e+38");
}
}  // namespace

// A draw that rounds up to high is low instead (a 24-bit draw of 1 - 2^-24 scaled into [1, 2)
// rounds to 2), as the 16-bit draws below and PyTorch's CUDA kernel do: the range stays
// [low, high).
Tensor uniform(const Shape& shape, float low, float high, Generator& gen) {
  check_bounds("uniform", low, high);
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  std::lock_guard<std::mutex> lock(generator_mutex());
  for (int64_t i = 0, n = t.numel(); i < n; ++i) {
    const float v = low + (high - low) * gen.next_float();
    p[i] = v >= high && high > low ? low : v;
  }
  return t;
}

Tensor rand(const Shape& shape, Generator& gen) {
  return uniform(shape, 0.f, 1.f, gen);
}

Tensor randn(const Shape& shape, Generator& gen) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  std::lock_guard<std::mutex> lock(generator_mutex());
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = gen.next_normal();
  return t;
}

namespace {
// Host float32 values placed as `options` asks (rounded once, then copied).
Tensor placed(const Tensor& host, const TensorOptions& options) {
  return host.to(options.device, options.dtype);
}
// rand, randn and uniform draw floating values only.
void check_floating_draw(const char* op, DType dtype) {
  GALLEY_CHECK(is_floating_point(dtype), op, ": dtype ", dtype_name(dtype),
               " is not a floating dtype (float32, bfloat16, float16); randint draws integers");
}

// The binary digits of a floating dtype's significand, its implicit bit counted: every integer
// up to 2^digits is one of its values.
int significand_digits(DType dtype) {
  return dtype == DType::Float32 ? 24 : dtype == DType::Float16 ? 11 : 8;
}

// uniform for `op` (rand or uniform) in options' floating dtype. A 16-bit dtype draws on its own
// grid, as PyTorch's uniform_ does: x = k / 2^digits for k of `digits` random bits (8 for
// bfloat16, 11 for float16), so rand stays below 1 (a float32 draw of 0.998 or more rounds up to
// 1.0 in bfloat16); a value that rounds up to high is low instead, as PyTorch's CUDA kernel does,
// so the range stays [low, high).
Tensor uniform_as(const char* op, const Shape& shape, float low, float high,
                  const TensorOptions& options, Generator& gen) {
  check_floating_draw(op, options.dtype);
  if (options.dtype == DType::Float32) return placed(uniform(shape, low, high, gen), options);
  check_bounds(op, low, high);
  const bool bf16 = options.dtype == DType::BFloat16;
  const int digits = significand_digits(options.dtype);
  const float unit = std::ldexp(1.f, -digits);
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  {
    std::lock_guard<std::mutex> lock(generator_mutex());
    for (int64_t i = 0, n = t.numel(); i < n; ++i) {
      const float v = low + (high - low) * (float(gen.next_u64() >> (64 - digits)) * unit);
      const float r = bf16 ? float(bfloat16(v)) : float(float16(v));
      // (high itself, or past it where high is not one of the dtype's values)
      p[i] = r >= high && high > low ? low : v;
    }
  }
  return placed(t, options);
}
}  // namespace

Tensor rand(const Shape& shape, const TensorOptions& options, Generator& gen) {
  return uniform_as("rand", shape, 0.f, 1.f, options, gen);
}
Tensor randn(const Shape& shape, const TensorOptions& options, Generator& gen) {
  check_floating_draw("randn", options.dtype);
  return placed(randn(shape, gen), options);
}
Tensor uniform(const Shape& shape, float low, float high, const TensorOptions& options,
               Generator& gen) {
  return uniform_as("uniform", shape, low, high, options, gen);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator& gen) {
  return randint(low, high, shape, {DType::Int64, Device::cpu()}, gen);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, const TensorOptions& options,
               Generator& gen) {
  GALLEY_CHECK(low < high, "randint: the range [", low, ", ", high, ") is empty");
  GALLEY_CHECK(options.dtype == DType::Int64 || is_floating_point(options.dtype), "randint: dtype ",
               dtype_name(options.dtype), " is not int64 or a floating dtype");
  if (options.dtype != DType::Int64) {
    const int digits = significand_digits(options.dtype);
    const int64_t reach = int64_t(1) << digits;
    GALLEY_CHECK(low >= -reach && high - 1 <= reach, "randint: the range [", low, ", ", high,
                 ") reaches past +-2^", digits, " = ", reach, ", beyond which ",
                 dtype_name(options.dtype),
                 " does not hold every integer (values would round, some to high); draw int64 "
                 "and convert, or narrow the range");
  }
  const uint64_t span = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
  Tensor t = Tensor::empty(shape, DType::Int64);
  int64_t* p = t.data<int64_t>();
  {
    std::lock_guard<std::mutex> lock(generator_mutex());
    // Rejection keeps every value equally likely when span does not divide 2^64.
    const uint64_t limit = UINT64_MAX - UINT64_MAX % span;
    for (int64_t i = 0, n = t.numel(); i < n; ++i) {
      uint64_t r;
      do r = gen.next_u64();
      while (r >= limit);
      p[i] = static_cast<int64_t>(static_cast<uint64_t>(low) + r % span);
    }
  }
  if (options.dtype == DType::Int64) return t.to(options.device);
  Tensor f = t.to(DType::Float32);
  return f.to(options.device, options.dtype);
}

Tensor rand_like(const Tensor& like, Generator& gen) {
  return rand(like.shape(), {like.dtype(), like.device()}, gen);
}
Tensor randn_like(const Tensor& like, Generator& gen) {
  return randn(like.shape(), {like.dtype(), like.device()}, gen);
}

}  // namespace galley
