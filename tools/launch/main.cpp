// galley-launch: packs independent training jobs onto a machine's GPUs and CPU cores.

#include <iostream>
#include <string>
#include <vector>

#include "cli.h"
#include "launcher.h"

#ifndef GALLEY_LAUNCH_VERSION
#define GALLEY_LAUNCH_VERSION "unknown"
#endif

int main(int argc, char** argv) {
  using namespace galley::launch;
  try {
    CommandLine command_line = parse_command_line(std::vector<std::string>(argv + 1, argv + argc));
    if (command_line.help) {
      std::cout << usage();
      return 0;
    }
    if (command_line.version) {
      std::cout << "galley-launch " << GALLEY_LAUNCH_VERSION << "\n";
      return 0;
    }
    std::vector<JobSpec> jobs = collect_jobs(command_line);
    Launcher launcher(jobs, command_line.options);
    if (command_line.check) {
      std::cout << "galley-launch: allocation: " << launcher.allocation() << "\n"
                << "galley-launch: " << jobs.size() << " job(s) can run on this machine\n";
      return 0;
    }
    return launcher.run().exit_code;
  } catch (const LaunchError& e) {
    std::cerr << "galley-launch: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "galley-launch: unexpected error: " << e.what() << "\n";
    return 2;
  }
}
