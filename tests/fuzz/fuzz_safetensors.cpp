// libFuzzer target for the safetensors reader: any bytes must either load or raise
// galley::Error; a crash, a sanitizer report or another exception type is a bug.
#include "fuzz_input.h"
#include "galley/io/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = galley::fuzz::write_input(data, size, ".safetensors");
  if (path.empty()) return 0;
  try {
    auto file = galley::io::read_safetensors(path);
    for (auto& [name, t] : file.tensors) (void)t.numel();
  } catch (const galley::Error&) {
    // Rejected with a message: the expected outcome for malformed input.
  }
  return 0;
}
