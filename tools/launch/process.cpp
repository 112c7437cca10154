#include "process.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>

#include "job.h"

extern char** environ;

namespace galley::launch {
namespace {

void close_both(int fds[2]) {
  if (fds[0] >= 0) close(fds[0]);
  if (fds[1] >= 0) close(fds[1]);
}

// Writes all of `size` bytes, retrying after signals; used in the child after fork.
void write_all(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    size -= size_t(n);
  }
}

}  // namespace

std::vector<std::string> merged_environment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::map<std::string, std::string> vars;
  std::vector<std::string> order;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    auto eq = entry.find('=');
    if (eq == std::string::npos) continue;
    std::string name = entry.substr(0, eq);
    if (!vars.count(name)) order.push_back(name);
    vars[name] = entry.substr(eq + 1);
  }
  for (const auto& [name, value] : overrides) {
    if (!vars.count(name)) order.push_back(name);
    vars[name] = value;
  }
  std::vector<std::string> env;
  env.reserve(order.size());
  for (const auto& name : order) env.push_back(name + "=" + vars[name]);
  return env;
}

std::string signal_name(int signal) {
  switch (signal) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    default:
      return "signal " + std::to_string(signal);
  }
}

Child spawn_child(const SpawnRequest& request) {
  if (request.argv.empty()) throw LaunchError("cannot start a job with an empty command");
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<char*> argv, envp;
  for (const auto& a : request.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : request.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const char* dir = request.working_dir.empty() ? nullptr : request.working_dir.c_str();
  // The affinity mask too: CPU_ALLOC is malloc, not allowed after fork.
  const int max_cpu =
      request.cpus.empty() ? 0 : *std::max_element(request.cpus.begin(), request.cpus.end());
  if (max_cpu < 0) throw LaunchError("cannot pin a job to a negative CPU id");
  const std::size_t mask_size = CPU_ALLOC_SIZE(max_cpu + 1);
  std::unique_ptr<cpu_set_t, void (*)(cpu_set_t*)> mask(
      request.cpus.empty() ? nullptr : CPU_ALLOC(max_cpu + 1), [](cpu_set_t* p) {
        if (p) CPU_FREE(p);
      });
  if (mask) {
    CPU_ZERO_S(mask_size, mask.get());
    for (int id : request.cpus) CPU_SET_S(id, mask_size, mask.get());
  }

  // The open-file limit too, set in the child.
  rlimit open_files{};
  bool set_open_files = false;
  if (request.open_files && getrlimit(RLIMIT_NOFILE, &open_files) == 0) {
    open_files.rlim_cur = std::min(*request.open_files, open_files.rlim_max);
    set_open_files = true;
  }

  int out[2] = {-1, -1}, err[2] = {-1, -1}, status[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || pipe2(status, O_CLOEXEC) != 0) {
    const int e = errno;
    close_both(out), close_both(err), close_both(status);
    throw LaunchError(std::string("cannot create pipes for a job: ") + strerror(e));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    close_both(out), close_both(err), close_both(status);
    throw LaunchError(std::string("cannot fork a job: ") + strerror(e));
  }
  if (pid == 0) {
    // Child. Report a failure as "<stage>:<errno>" through the status pipe, then _exit.
    auto fail = [&](char stage) {
      int e = errno;
      char msg[2 + sizeof(int)];
      msg[0] = stage;
      memcpy(msg + 1, &e, sizeof(int));
      write_all(status[1], msg, 1 + sizeof(int));
      _exit(127);
    };
    setpgid(0, 0);
    // Backstop against orphans: if the launcher is killed outright, the job dies with it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(137);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int s : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE, SIGHUP, SIGQUIT}) signal(s, SIG_DFL);
    if (dup2(out[1], STDOUT_FILENO) < 0 || dup2(err[1], STDERR_FILENO) < 0) fail('p');
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0 && devnull != STDIN_FILENO) {  // stdin only: no other descriptor leaks
      dup2(devnull, STDIN_FILENO);
      close(devnull);
    }
    if (dir && chdir(dir) != 0) fail('d');
    if (mask && sched_setaffinity(0, mask_size, mask.get()) != 0) fail('a');
    if (set_open_files) setrlimit(RLIMIT_NOFILE, &open_files);
    execvpe(argv[0], argv.data(), envp.data());
    fail('e');
  }
  // Parent.
  setpgid(pid, pid);  // also done by the child; whichever runs first wins the race
  close(out[1]), close(err[1]), close(status[1]);
  char msg[1 + sizeof(int)];
  ssize_t got = 0;
  while (true) {
    ssize_t n = read(status[0], msg + got, sizeof msg - size_t(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += n;
    if (got == ssize_t(sizeof msg)) break;
  }
  close(status[0]);
  if (got == ssize_t(sizeof msg)) {
    int e = 0;
    memcpy(&e, msg + 1, sizeof(int));
    close(out[0]), close(err[0]);
    // Collected by the launcher's waitpid loop like any other child.
    std::string cpus;
    for (std::size_t i = 0; i < request.cpus.size(); ++i)
      cpus += (i ? "," : "") + std::to_string(request.cpus[i]);
    std::string what = msg[0] == 'd'
                           ? "cannot enter working directory '" + request.working_dir + "'"
                       : msg[0] == 'e' ? "cannot run '" + request.argv[0] + "'"
                       : msg[0] == 'a' ? "cannot pin the job to CPUs " + cpus
                                       : std::string("cannot redirect the job's output");
    throw LaunchError(what + ": " + strerror(e));
  }
  for (int fd : {out[0], err[0]}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return Child{pid, out[0], err[0]};
}

}  // namespace galley::launch
