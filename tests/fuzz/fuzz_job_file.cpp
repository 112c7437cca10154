// libFuzzer target for galley-launch's job-file parser: any text must either parse into jobs
// and launcher settings or raise LaunchError with a message; a crash, a sanitizer report or
// another exception type (toml++'s own, std::out_of_range, ...) is a bug.
#include <string_view>

#include "job_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  galley::launch::LauncherOptions options;
  try {
    const auto jobs = galley::launch::parse_job_file_text(text, "jobs.toml", options);
    for (const auto& job : jobs) (void)job.name.size();
  } catch (const galley::launch::LaunchError&) {
    // Rejected with a message naming the line and the key.
  }
  return 0;
}
