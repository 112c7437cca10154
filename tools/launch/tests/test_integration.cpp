// Runs the built galley-launch binary on small shell jobs and checks what it did through its
// exit status, its JSON-lines event log, its summary and the jobs' log files.

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using namespace std::chrono_literals;

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

// The CPUs this test process may use.
std::vector<int> usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> ids;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int id = 0; id < CPU_SETSIZE; ++id)
      if (CPU_ISSET(id, &set)) ids.push_back(id);
  return ids;
}

// Expands a Linux CPU list ("0-2,5").
std::vector<int> expand_cpu_list(const std::string& text) {
  std::vector<int> ids;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const auto dash = item.find('-');
    const int a = std::stoi(item.substr(0, dash));
    const int b = dash == std::string::npos ? a : std::stoi(item.substr(dash + 1));
    for (int id = a; id <= b; ++id) ids.push_back(id);
  }
  return ids;
}

// The affinity mask a job printed with `grep Cpus_allowed_list /proc/self/status`.
std::vector<int> printed_mask(const std::string& log) {
  std::smatch m;
  if (!std::regex_search(log, m, std::regex(R"(Cpus_allowed_list:\s*([0-9,-]+))"))) return {};
  return expand_cpu_list(m[1]);
}

// The value a job printed as `NAME=value`.
std::string printed(const std::string& log, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(log, m, std::regex(name + "=([^ \n]*)"))) return "<none>";
  return m[1];
}

bool overlap(std::vector<int> a, std::vector<int> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::vector<int> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  return !both.empty();
}

// A job that shows what it was given, then holds its CPUs for `seconds`.
std::string show_and_sleep(double seconds) {
  return "grep Cpus_allowed_list /proc/self/status; echo GALLEY_NUM_THREADS=$GALLEY_NUM_THREADS "
         "OMP_NUM_THREADS=$OMP_NUM_THREADS CUDA=$CUDA_VISIBLE_DEVICES; sleep " +
         std::to_string(seconds);
}

// A job command that proves it ran beside another job: it marks its start with the file
// `self`.up, then waits (up to about 10 s) for `other`'s mark, and fails without it. Two jobs that
// meet each other both succeed only if each started before the other ended, however slow or
// loaded the machine; a fixed sleep that should outlast the other's start does not say that.
std::string meet(const std::string& self, const std::string& other) {
  return "touch " + self + ".up; i=0; while [ $i -lt 200 ]; do [ -e " + other +
         ".up ] && exit 0; sleep 0.05; i=$((i+1)); done; echo no " + other + "; exit 1";
}

// One test's scratch directory; the launcher runs inside it.
class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(GALLEY_LAUNCH_TEST_DIR) / info->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }

  // Starts galley-launch with `args` (and extra environment) in the test directory, pinned to
  // `cpus` when given. What the launcher would read as its allocation (Slurm and CUDA
  // variables) and thread settings are cleared first, so that the tests see only their own.
  pid_t start(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
              const std::vector<int>& cpus = {}) {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    for (int id : cpus) CPU_SET(id, &mask);
    const pid_t pid = fork();
    if (pid == 0) {
      if (chdir(dir_.c_str()) != 0) _exit(99);
      int out = open("stdout.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = open("stderr.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(out, 1);
      dup2(err, 2);
      for (const char* name :
           {"CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_CPUS_ON_NODE",
            "SLURM_JOB_ID", "GALLEY_NUM_THREADS", "OMP_NUM_THREADS", "GALLEY_LAUNCH_FAKE_GPUS"})
        unsetenv(name);
      if (!cpus.empty() && sched_setaffinity(0, sizeof mask, &mask) != 0) _exit(97);
      if (open_files_ && setrlimit(RLIMIT_NOFILE, &*open_files_) != 0) _exit(96);
      for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> argv{const_cast<char*>(GALLEY_LAUNCH_BIN)};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(GALLEY_LAUNCH_BIN, argv.data());
      _exit(98);
    }
    return pid;
  }

  // Waits for the launcher; fails the test (and kills it) after `limit`.
  int wait_for(pid_t pid, std::chrono::milliseconds limit = 20s) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid)
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      std::this_thread::sleep_for(10ms);
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    ADD_FAILURE() << "galley-launch did not finish in time";
    return -1;
  }

  int run(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
          const std::vector<int>& cpus = {}, std::chrono::milliseconds limit = 20s) {
    return wait_for(start(args, env, cpus), limit);
  }

  // The first two CPUs this process may use; skips the test where there are fewer.
  std::vector<int> two_cpus() {
    const auto cpus = usable_cpus();
    if (cpus.size() < 2) return {};
    return {cpus[0], cpus[1]};
  }

  // The event log's whole lines (one the running launcher is still writing is left out).
  std::vector<Json> events() const {
    std::vector<Json> list;
    std::string text = read_text(dir_ / "galley-launch-logs/events.jsonl");
    text.erase(text.find_last_of('\n') == std::string::npos ? 0 : text.find_last_of('\n') + 1);
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) list.push_back(Json::parse(line));
    return list;
  }

  std::vector<Json> events(const std::string& kind, const std::string& job = "") const {
    std::vector<Json> list;
    for (const auto& e : events())
      if (e["event"] == kind && (job.empty() || e.value("job", "") == job)) list.push_back(e);
    return list;
  }

  // Where the one `kind` event of `job` stands in the event log: the log's order is the order
  // the launcher saw things happen, finer than its millisecond times. Fails the test, and
  // returns the log's length, where there is not exactly one.
  std::size_t position(const std::string& kind, const std::string& job) const {
    const auto all = events();
    std::size_t found = all.size(), count = 0;
    for (std::size_t i = 0; i < all.size(); ++i)
      if (all[i]["event"] == kind && all[i].value("job", "") == job) found = i, count += 1;
    EXPECT_EQ(count, 1u) << kind << " events of job " << job;
    return count == 1 ? found : all.size();
  }

  Json summary() const { return Json::parse(read_text(dir_ / "galley-launch-logs/summary.json")); }

  Json summary_of(const std::string& job) const {
    const Json all = summary();
    for (const auto& j : all["jobs"])
      if (j["name"] == job) return j;
    ADD_FAILURE() << "no job " << job << " in the summary";
    return Json();
  }

  std::string job_log(const std::string& job) const {
    return read_text(dir_ / "galley-launch-logs" / (job + ".log"));
  }

  std::string stderr_text() const { return read_text(dir_ / "stderr.txt"); }

  fs::path dir_;
  // The launcher's limit on open files, where a test sets one.
  std::optional<rlimit> open_files_;
};

TEST_F(LaunchTest, ExitCodesReachTheEventLogAndTheSummary) {
  write_text(dir_ / "jobs.toml", R"(
[[job]]
name = "ok"
command = "exit 0"

[[job]]
name = "bad"
command = ["sh", "-c", "exit 3"]
)");
  EXPECT_EQ(run({"jobs.toml"}), 1);
  auto exited = events("exited", "bad");
  ASSERT_EQ(exited.size(), 1u);
  EXPECT_EQ(exited[0]["code"], 3);
  EXPECT_EQ(summary_of("bad")["status"], "failed");
  EXPECT_EQ(summary_of("bad")["exit_code"], 3);
  EXPECT_EQ(summary_of("ok")["status"], "succeeded");
  EXPECT_EQ(events("queued").size(), 2u);
}

TEST_F(LaunchTest, AllJobsSucceedingExitsZero) {
  EXPECT_EQ(run({"--", "sh", "-c", "exit 0"}), 0);
  EXPECT_EQ(summary_of("sh")["status"], "succeeded");
  const auto s = summary();
  EXPECT_GE(s["makespan_s"].get<double>(), 0.0);
  EXPECT_EQ(s["gpus"]["sampled"], false);
  EXPECT_FALSE(s["gpus"]["note"].get<std::string>().empty());
}

TEST_F(LaunchTest, FailuresRestartWithDoublingBackoff) {
  // Each attempt stamps its start: consecutive starts are at least the back-off apart, since
  // each back-off runs from the end of an attempt. The event log's times are taken after the
  // launcher has read the exited job's output, so they bound the back-off only to a margin.
  EXPECT_EQ(run({"--backoff-initial", "0.2", "--max-restarts", "2", "--", "sh", "-c",
                 "date +%s.%N >> starts; exit 1"}),
            1);
  const auto started = events("started");
  const auto exited = events("exited");
  const auto backoff = events("backoff");
  ASSERT_EQ(started.size(), 3u);
  ASSERT_EQ(exited.size(), 3u);
  ASSERT_EQ(backoff.size(), 2u);
  EXPECT_EQ(events("restarted").size(), 2u);
  EXPECT_DOUBLE_EQ(backoff[0]["delay_s"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(backoff[1]["delay_s"].get<double>(), 0.4);
  std::vector<double> starts;
  std::istringstream stamps(read_text(dir_ / "starts"));
  for (double t; stamps >> t;) starts.push_back(t);
  ASSERT_EQ(starts.size(), 3u) << read_text(dir_ / "starts");
  EXPECT_GE(starts[1] - starts[0], 0.2);
  EXPECT_GE(starts[2] - starts[1], 0.4);
  EXPECT_EQ(summary_of("sh")["restarts"], 2);
  EXPECT_EQ(summary_of("sh")["attempts"], 3);
}

TEST_F(LaunchTest, ARestartThatSucceedsEndsTheJobWell) {
  EXPECT_EQ(run({"--backoff-initial", "0.05", "--max-restarts", "3", "--name", "flaky", "--", "sh",
                 "-c", "test \"$GALLEY_LAUNCH_ATTEMPT\" = 2"}),
            0);
  EXPECT_EQ(summary_of("flaky")["status"], "succeeded");
  EXPECT_EQ(summary_of("flaky")["restarts"], 1);
}

TEST_F(LaunchTest, APreemptedJobIsRestartedWithoutCountingARestart) {
  // Exit 75 (preempted, checkpoint saved) twice, then succeed: with no restarts allowed.
  EXPECT_EQ(run({"--max-restarts", "0", "--name", "preempted", "--", "sh", "-c",
                 "test \"$GALLEY_LAUNCH_ATTEMPT\" -ge 3 || exit 75"}),
            0);
  EXPECT_EQ(events("preempted", "preempted").size(), 2u);
  EXPECT_EQ(events("started").size(), 3u);
  EXPECT_TRUE(events("backoff").empty());
  EXPECT_EQ(summary_of("preempted")["status"], "succeeded");
  EXPECT_EQ(summary_of("preempted")["restarts"], 0);
  EXPECT_EQ(summary_of("preempted")["attempts"], 3);
}

// A job that exits 75 as it starts, every time, is restarted after the first backoff, not in a
// tight loop (it was restarted hundreds of times a second).
TEST_F(LaunchTest, AJobPreemptedAsItStartsWaitsTheFirstBackoff) {
  const pid_t pid =
      start({"--backoff-initial", "0.2", "--name", "spin", "--", "sh", "-c", "exit 75"});
  std::this_thread::sleep_for(1500ms);
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_for(pid), 143);
  const auto preempted = events("preempted", "spin");
  EXPECT_GE(preempted.size(), 2u);
  EXPECT_LE(preempted.size(), 10u);  // about 7 at 0.2 s apart; hundreds before
  if (!preempted.empty()) EXPECT_EQ(preempted[0]["delay_s"], 0.2);
}

TEST_F(LaunchTest, PrioritiesDecideTheStartOrder) {
  write_text(dir_ / "jobs.toml", R"(
[launcher]
gpus_available = [0]

[[job]]
name = "low"
command = "sleep 0.05"
gpus = 1
priority = 1

[[job]]
name = "high"
command = "sleep 0.05"
gpus = 1
priority = 5

[[job]]
name = "mid1"
command = "sleep 0.05"
gpus = 1
priority = 3

[[job]]
name = "mid2"
command = "sleep 0.05"
gpus = 1
priority = 3
)");
  EXPECT_EQ(run({"jobs.toml"}), 0);
  std::vector<std::string> order;
  for (const auto& e : events("started")) order.push_back(e["job"]);
  EXPECT_EQ(order, (std::vector<std::string>{"high", "mid1", "mid2", "low"}));
}

TEST_F(LaunchTest, TwoJobsAtPointFourShareAGpuAndPointSevenWaits) {
  write_text(dir_ / "jobs.toml", R"(
[[job]]
name = "a"
command = "echo gpu=$CUDA_VISIBLE_DEVICES; )" +
                                     meet("a", "b") + R"("
gpus = 1
memory_fraction = 0.4
serial_time = 5.0

[[job]]
name = "b"
command = ")" + meet("b", "a") + R"("
gpus = 1
memory_fraction = 0.4
serial_time = 5.0

[[job]]
name = "c"
command = "sleep 0.2"
gpus = 1
memory_fraction = 0.7
serial_time = 1.0
)");
  // The fake inventory through the environment: one GPU, id 0.
  // Exit 0: a and b each saw the other's mark, so they ran together.
  EXPECT_EQ(run({"jobs.toml"}, {"GALLEY_LAUNCH_FAKE_GPUS=1"}), 0);
  EXPECT_LT(position("started", "b"), position("exited", "a"));  // a and b ran together
  EXPECT_GT(position("started", "c"), position("exited", "a"));  // 0.7 + 0.4 > 1: c waited
  EXPECT_GT(position("started", "c"), position("exited", "b"));
  EXPECT_EQ(events("started", "a")[0]["gpus"], Json::array({0}));
  EXPECT_NE(job_log("a").find("gpu=0"), std::string::npos);
  // Against the jobs' measured serial times (11 s in all), not their packed ones: the packed run
  // takes well under a second, so packing pays by a wide margin on a loaded machine too.
  const Json s = summary();
  EXPECT_EQ(s["serial_estimate_method"], "measured");
  EXPECT_DOUBLE_EQ(s["serial_estimate_s"].get<double>(), 11.0);
  EXPECT_NEAR(s["packing_speedup"].get<double>(), 11.0 / s["makespan_s"].get<double>(),
              0.01 * s["packing_speedup"].get<double>());
  EXPECT_GT(s["packing_speedup"].get<double>(), 1.0);
}

TEST_F(LaunchTest, JobLogsHaveTimestampedLinesFromBothStreams) {
  EXPECT_EQ(run({"--name", "talk", "--", "sh", "-c", "echo hello; echo oops >&2; printf tail"}), 0);
  const std::string log = job_log("talk");
  const std::string ts = R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d{4})";
  EXPECT_TRUE(std::regex_search(log, std::regex("(^|\n)" + ts + R"( \[out\] hello\n)"))) << log;
  EXPECT_TRUE(std::regex_search(log, std::regex("(^|\n)" + ts + R"( \[err\] oops\n)"))) << log;
  EXPECT_TRUE(std::regex_search(log, std::regex("(^|\n)" + ts + R"( \[out\] tail\n)"))) << log;
}

TEST_F(LaunchTest, LogFileAndWorkingDirectoryCanBeChosen) {
  fs::create_directories(dir_ / "work");
  EXPECT_EQ(run({"--log", "mine/custom.log", "--workdir", "work", "--", "sh", "-c", "pwd"}), 0);
  const std::string log = read_text(dir_ / "mine/custom.log");
  EXPECT_NE(log.find("/work\n"), std::string::npos) << log;
}

TEST_F(LaunchTest, SilentJobIsHungKilledAndRestarted) {
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(
      run({"--heartbeat-timeout", "0.4", "--max-restarts", "1", "--backoff-initial", "0.05",
           "--grace-period", "0.5", "--name", "quiet", "--", "sh", "-c", "echo start; sleep 30"}),
      1);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_EQ(events("hung", "quiet").size(), 2u);
  EXPECT_EQ(events("started", "quiet").size(), 2u);
  const auto signalled = events("signalled", "quiet");
  ASSERT_EQ(signalled.size(), 2u);
  EXPECT_EQ(signalled[0]["signal"], "SIGTERM");
  EXPECT_EQ(summary_of("quiet")["status"], "hung");
}

// Polls `done` every 10 ms until it holds or `limit` has passed; says whether it held. The
// limits are seconds where the thing awaited takes milliseconds: a loaded machine may stall.
template <typename F>
bool eventually(F done, std::chrono::milliseconds limit = 10s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= end) return done();
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// Reads a pid the job wrote, waiting for it to appear.
pid_t wait_for_pid(const fs::path& path) {
  pid_t pid = 0;
  if (eventually([&] {
        std::ifstream in(path);
        return in >> pid && pid > 0;
      }))
    return pid;
  ADD_FAILURE() << "no pid in " << path;
  return -1;
}

bool alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const auto paren = text.rfind(')');
  return paren == std::string::npos || text.substr(paren + 2, 1) != "Z";
}

// Any live process whose command line holds `marker`.
std::vector<pid_t> processes_with(const std::string& marker) {
  std::vector<pid_t> found;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = read_text(entry.path() / "cmdline");
    for (char& c : cmdline)
      if (c == '\0') c = ' ';
    if (cmdline.find(marker) != std::string::npos && alive(std::stoi(name)))
      found.push_back(std::stoi(name));
  }
  return found;
}

TEST_F(LaunchTest, SigtermStopsEveryJobAndLeavesNoOrphans) {
  // `polite` dies on SIGTERM; `stubborn` (and its children) ignore it and need SIGKILL; `later`
  // waits for the GPU and is cancelled.
  write_text(dir_ / "jobs.toml", R"(
[launcher]
gpus_available = [0]
grace_period = 0.5

[[job]]
name = "polite"
command = "echo $$ > polite.pid; sleep 47.1234 & echo $! > polite.child; wait"

[[job]]
name = "stubborn"
command = "trap '' TERM; echo $$ > stubborn.pid; sleep 47.1234 & echo $! > stubborn.child; wait; wait"

[[job]]
name = "holder"
command = "sleep 47.1234"
gpus = 1

[[job]]
name = "later"
command = "true"
gpus = 1
)");
  const pid_t launcher = start({"jobs.toml"});
  std::vector<pid_t> pids;
  for (const char* file : {"polite.pid", "polite.child", "stubborn.pid", "stubborn.child"})
    pids.push_back(wait_for_pid(dir_ / file));
  kill(launcher, SIGTERM);
  EXPECT_EQ(wait_for(launcher), 128 + SIGTERM);
  // Killed, they are gone once the kernel has run their exit: poll rather than look once.
  for (pid_t pid : pids)
    EXPECT_TRUE(eventually([&] { return !alive(pid); })) << "pid " << pid << " survived";
  EXPECT_TRUE(eventually([] { return processes_with("47.1234").empty(); }));
  EXPECT_EQ(events("stopping").size(), 1u);
  EXPECT_EQ(events("killed", "stubborn").size(), 1u);
  EXPECT_EQ(summary_of("later")["status"], "cancelled");
  EXPECT_EQ(summary_of("polite")["status"], "stopped");
  EXPECT_EQ(summary_of("stubborn")["signal"], "SIGKILL");
}

// --- stopping ---------------------------------------------------------------------------------

// A job command whose shell runs the real program under a second shell: on SIGTERM the outer
// shell dies at once while the program (the inner shell) checkpoints for a second, saves and
// exits 75, as a galley program answers a preemption. The program marks `ready` once its trap is
// set. As a TOML literal string, with `before` run first by the outer shell.
std::string wrapped_checkpointing_program(const std::string& before = "") {
  return "'''" + before +
         "sh -c 'trap \"echo checkpointing; sleep 1; echo saved; exit 75\" TERM; touch ready; "
         "while :; do sleep 0.1; done'; echo wrapper-done'''";
}

TEST_F(LaunchTest, AWrappedProgramKeepsItsGracePeriodWhenTheLauncherStops) {
  // The outer shell's exit made the launcher SIGKILL the whole group at once: the program never
  // saved. The job now ends when its group does, well before the 30 s grace period.
  write_text(dir_ / "jobs.toml",
             "[launcher]\ngrace_period = 30\n[[job]]\nname = \"wrapped\"\ncommand = " +
                 wrapped_checkpointing_program() + "\n");
  const pid_t launcher = start({"jobs.toml"});
  ASSERT_TRUE(eventually([&] { return fs::exists(dir_ / "ready"); }));
  kill(launcher, SIGTERM);
  EXPECT_EQ(wait_for(launcher), 128 + SIGTERM);
  const std::string log = job_log("wrapped");
  EXPECT_NE(log.find("[out] checkpointing"), std::string::npos) << log;
  EXPECT_NE(log.find("[out] saved"), std::string::npos) << log;
  EXPECT_EQ(log.find("wrapper-done"), std::string::npos) << log;  // the outer shell died
  EXPECT_TRUE(events("killed").empty());                          // nothing needed SIGKILL
  EXPECT_EQ(summary_of("wrapped")["status"], "stopped");
  EXPECT_EQ(summary_of("wrapped")["signal"], "SIGTERM");  // how the main process ended
}

TEST_F(LaunchTest, AWrappedProgramKeepsItsGracePeriodWhenItHangs) {
  // The same for a job stopped as hung; its restart, which succeeds at once, waits until the
  // group has ended. The timeout gives the program ample time to set its trap.
  write_text(dir_ / "jobs.toml",
             "[launcher]\ngrace_period = 30\nbackoff_initial = 0\n[[job]]\nname = \"hung\"\n"
             "heartbeat_timeout = 2\nmax_restarts = 1\ncommand = " +
                 wrapped_checkpointing_program("test $GALLEY_LAUNCH_ATTEMPT = 2 && exit 0; ") +
                 "\n");
  EXPECT_EQ(run({"jobs.toml"}), 0) << stderr_text();
  const std::string log = job_log("hung");
  EXPECT_NE(log.find("[out] saved"), std::string::npos) << log;
  EXPECT_LT(log.find("[out] saved"), log.find("restart 1"));
  EXPECT_EQ(events("hung", "hung").size(), 1u);
  EXPECT_TRUE(events("killed").empty());
  EXPECT_EQ(summary_of("hung")["status"], "succeeded");
  EXPECT_EQ(summary_of("hung")["attempts"], 2);
}

TEST_F(LaunchTest, WhatIsLeftOfAStoppedJobsGroupIsKilledAtItsDeadline) {
  // A program that ignores SIGTERM under a wrapper that does not: the wrapper's end no longer
  // kills the group at once; the grace period's end does.
  write_text(dir_ / "jobs.toml",
             "[launcher]\ngrace_period = 0.5\n[[job]]\nname = \"deaf\"\ncommand = '''sh -c "
             "'trap \"\" TERM; echo $$ > inner.pid; while :; do sleep 0.1; done'; echo "
             "wrapper-done'''\n");
  const pid_t launcher = start({"jobs.toml"});
  const pid_t inner = wait_for_pid(dir_ / "inner.pid");
  kill(launcher, SIGTERM);
  EXPECT_EQ(wait_for(launcher), 128 + SIGTERM);
  EXPECT_TRUE(eventually([&] { return !alive(inner); })) << "pid " << inner << " survived";
  EXPECT_EQ(events("killed", "deaf").size(), 1u);
  EXPECT_LT(position("killed", "deaf"), position("signalled", "deaf"));  // the job ends after
  EXPECT_EQ(summary_of("deaf")["status"], "stopped");
}

TEST_F(LaunchTest, AJobWritingWithoutPauseLeavesTheLauncherFreeToAct) {
  // `yes` keeps its pipe full: the launcher read it until it was empty, that is for ever, and
  // neither another job's end nor SIGTERM was ever handled.
  write_text(dir_ / "jobs.toml", R"(
[[job]]
name = "fast"
command = ["yes"]
log = "/dev/null"

[[job]]
name = "quick"
command = "sleep 0.3; echo done"
)");
  const pid_t launcher = start({"jobs.toml"});
  EXPECT_TRUE(eventually([&] { return !events("finished", "quick").empty(); }));
  kill(launcher, SIGTERM);
  EXPECT_EQ(wait_for(launcher), 128 + SIGTERM);
  EXPECT_EQ(summary_of("quick")["status"], "succeeded");
  EXPECT_EQ(summary_of("fast")["status"], "stopped");
  EXPECT_NE(job_log("quick").find("[out] done"), std::string::npos);
}

TEST_F(LaunchTest, AllTheOutputOfAJobThatWritesFastReachesItsLog) {
  // Read 64 KiB per turn of the loop, and at the job's end what its pipe still holds.
  EXPECT_EQ(run({"--name", "count", "--", "seq", "200000"}), 0);
  const std::string log = job_log("count");
  std::size_t lines = 0;
  for (std::size_t at = log.find("[out] "); at != std::string::npos;
       at = log.find("[out] ", at + 1))
    lines += 1;
  EXPECT_EQ(lines, 200000u);
  EXPECT_NE(log.find("[out] 199999\n"), std::string::npos);
  EXPECT_NE(log.find("[out] 200000\n"), std::string::npos);
}

// Whether process `pid` is stopped (SIGSTOP).
bool stopped(pid_t pid) {
  const std::string text = read_text("/proc/" + std::to_string(pid) + "/stat");
  const auto paren = text.rfind(')');
  return paren != std::string::npos && text.substr(paren + 2, 1) == "T";
}

TEST_F(LaunchTest, TwoStopSignalsArrivingTogetherKillAtOnce) {
  // Both arrive while the launcher is stopped, so both handlers run before its loop does: a
  // single "last signal" slot counted them as one, and the job ignoring SIGTERM lived out the
  // 30 s grace period.
  write_text(dir_ / "jobs.toml",
             "[launcher]\ngrace_period = 30\n[[job]]\nname = \"deaf\"\n"
             "command = \"trap '' TERM INT; touch ready; sleep 47.3579\"\n");
  const pid_t launcher = start({"jobs.toml"});
  ASSERT_TRUE(eventually([&] { return fs::exists(dir_ / "ready"); }));
  kill(launcher, SIGSTOP);
  ASSERT_TRUE(eventually([&] { return stopped(launcher); }));
  kill(launcher, SIGINT);
  kill(launcher, SIGTERM);
  kill(launcher, SIGCONT);
  const int code = wait_for(launcher);
  ASSERT_EQ(events("stopping").size(), 1u);
  EXPECT_EQ(code, 128 + (events("stopping")[0]["signal"] == "SIGINT" ? SIGINT : SIGTERM));
  EXPECT_EQ(events("kill").size(), 1u);
  EXPECT_EQ(summary_of("deaf")["signal"], "SIGKILL");
  EXPECT_TRUE(eventually([] { return processes_with("47.3579").empty(); }));
}

TEST_F(LaunchTest, SighupAndSigquitStopTheJobsLikeSigterm) {
  // SIGHUP (a closed terminal) ended the launcher at once: no summary, and the jobs, in process
  // groups of their own, ran on.
  for (const int sig : {SIGHUP, SIGQUIT}) {
    fs::remove(dir_ / "ready");
    const pid_t launcher = start({"--name", "job", "--", "sh", "-c", "touch ready; sleep 47.2468"});
    ASSERT_TRUE(eventually([&] { return fs::exists(dir_ / "ready"); }));
    kill(launcher, sig);
    EXPECT_EQ(wait_for(launcher), 128 + sig);
    const auto stopping = events("stopping");
    ASSERT_EQ(stopping.size(), 1u) << sig;
    EXPECT_EQ(stopping[0]["signal"], sig == SIGHUP ? "SIGHUP" : "SIGQUIT");
    EXPECT_EQ(summary()["stopped_by_signal"], stopping[0]["signal"]);
    EXPECT_EQ(summary_of("job")["status"], "stopped");
    EXPECT_TRUE(eventually([] { return processes_with("47.2468").empty(); }));
  }
}

TEST_F(LaunchTest, PlacementAndMemoryCapsReachTheChildEnvironment) {
  write_text(dir_ / "jobs.toml", R"(
[[job]]
name = "limit"
command = "echo \"[$CUDA_VISIBLE_DEVICES|$GALLEY_GPU_MEMORY_LIMIT_MB|$SEED]\""
gpus = [1]
memory_limit_mb = 1000
env = { SEED = 7 }

[[job]]
name = "cpu"
command = "echo \"[${CUDA_VISIBLE_DEVICES-unset}]\""
)");
  EXPECT_EQ(run({"--gpus-available", "0,1", "jobs.toml", "--gpus", "2", "--memory-fraction", "0.25",
                 "--env", "FOO=bar", "--name", "frac", "--", "sh", "-c",
                 "echo \"[$CUDA_VISIBLE_DEVICES|$GALLEY_GPU_MEMORY_FRACTION|$FOO|"
                 "$GALLEY_LAUNCH_JOB|$CUDA_DEVICE_ORDER]\""}),
            0);
  EXPECT_NE(job_log("frac").find("[0,1|0.25|bar|frac|PCI_BUS_ID]"), std::string::npos)
      << job_log("frac");
  EXPECT_NE(job_log("limit").find("[1|1000|7]"), std::string::npos) << job_log("limit");
  EXPECT_NE(job_log("cpu").find("[]"), std::string::npos) << job_log("cpu");  // no GPU visible
}

TEST_F(LaunchTest, BadJobFileExitsTwoNamingLineAndKey) {
  write_text(dir_ / "jobs.toml", "[[job]]\nname = \"a\"\ncommand = \"true\"\ngpus = \"two\"\n");
  EXPECT_EQ(run({"jobs.toml"}), 2);
  EXPECT_NE(stderr_text().find("jobs.toml:4:"), std::string::npos) << stderr_text();
  EXPECT_NE(stderr_text().find("key 'gpus'"), std::string::npos) << stderr_text();
  EXPECT_FALSE(fs::exists(dir_ / "galley-launch-logs/events.jsonl"));
}

TEST_F(LaunchTest, JobLargerThanTheMachineIsRefusedBeforeAnythingRuns) {
  EXPECT_EQ(run({"--gpus-available", "0", "--gpus", "2", "--", "true"}), 2);
  EXPECT_NE(stderr_text().find("wants 2 GPU(s) but this machine has 1"), std::string::npos)
      << stderr_text();
}

TEST_F(LaunchTest, MissingProgramFailsToStartWithTheReason) {
  EXPECT_EQ(run({"--max-restarts", "3", "--", "no-such-program-galley"}), 1);
  const auto failed = events("failed_to_start");
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_NE(failed[0]["message"].get<std::string>().find("No such file"), std::string::npos);
}

TEST_F(LaunchTest, KilledLauncherTakesItsJobsWithIt) {
  const pid_t launcher = start({"--", "sleep", "47.5678"});
  eventually([&] { return !events("started").empty(); });
  ASSERT_EQ(events("started").size(), 1u);
  kill(launcher, SIGKILL);
  wait_for(launcher);
  // PR_SET_PDEATHSIG: the kernel kills the job when the launcher dies.
  EXPECT_TRUE(eventually([] { return processes_with("47.5678").empty(); }));
}

TEST_F(LaunchTest, UtilisationIsSampledThroughNvmlWhenPresent) {
  // A fake libnvidia-ml.so.1 with two 80 GiB GPUs at 50% and 60%.
  const std::string path = std::string("LD_LIBRARY_PATH=") + GALLEY_LAUNCH_FAKE_NVML_DIR;
  EXPECT_EQ(run({"--sample-interval", "0.05", "--gpus", "1", "--memory-limit-mb", "40960", "--name",
                 "big", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES; sleep 2"},
                {path}),
            0);
  const Json gpus = summary()["gpus"];
  ASSERT_TRUE(gpus["sampled"].get<bool>()) << gpus.dump();
  EXPECT_FALSE(gpus["fake_inventory"].get<bool>());
  ASSERT_EQ(gpus["devices"].size(), 2u);
  EXPECT_DOUBLE_EQ(gpus["devices"][0]["mean_utilization_percent"].get<double>(), 50.0);
  EXPECT_DOUBLE_EQ(gpus["devices"][1]["mean_utilization_percent"].get<double>(), 60.0);
  EXPECT_EQ(gpus["devices"][1]["max_memory_used_mb"], 2048);
  // At 0.05 s a sample over a 2 s job: at least 3 unless the launcher stalls for most of it.
  EXPECT_GE(gpus["devices"][0]["samples"].get<int>(), 3);
  // The inventory came from NVML with its memory: 40 GiB of 80 is a share of 0.5.
  EXPECT_DOUBLE_EQ(events("started", "big")[0]["share"].get<double>(), 0.5);
  EXPECT_NE(read_text(dir_ / "stdout.txt").find("mean utilisation 50.0%"), std::string::npos);
}

// --- CPUs and the allocation ------------------------------------------------------------------

TEST_F(LaunchTest, TwoJobsWithOneCpuEachRunSideBySideOnDisjointCpus) {
  const auto cpus = usable_cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "needs 2 usable CPUs, this process has " << cpus.size();
  write_text(dir_ / "jobs.toml", "[[job]]\nname = \"a\"\ncpus = 1\ncommand = \"" +
                                     show_and_sleep(0) + "; " + meet("a", "b") +
                                     "\"\n[[job]]\nname = \"b\"\ncpus = 1\ncommand = \"" +
                                     show_and_sleep(0) + "; " + meet("b", "a") + "\"\n");
  EXPECT_EQ(run({"jobs.toml"}), 0);  // both met the other: side by side
  const auto a = printed_mask(job_log("a")), b = printed_mask(job_log("b"));
  ASSERT_EQ(a.size(), 1u) << job_log("a");
  ASSERT_EQ(b.size(), 1u) << job_log("b");
  EXPECT_FALSE(overlap(a, b)) << a[0] << " and " << b[0];
  for (const char* job : {"a", "b"}) {
    EXPECT_EQ(printed(job_log(job), "GALLEY_NUM_THREADS"), "1") << job_log(job);
    EXPECT_EQ(printed(job_log(job), "OMP_NUM_THREADS"), "1") << job_log(job);
  }
  // Side by side, and what they were given is in the event log and the summary.
  EXPECT_LT(position("started", "b"), position("exited", "a"));
  EXPECT_EQ(events("started", "a")[0]["cpus"], Json::array({a[0]}));
  EXPECT_EQ(summary_of("b")["cpus"], Json::array({b[0]}));
  EXPECT_EQ(summary_of("b")["cpus_requested"], 1);
}

TEST_F(LaunchTest, TwoJobsWantingTwoCpusOnTwoCpusRunOneAfterTheOther) {
  const auto cpus = two_cpus();
  if (cpus.empty())
    GTEST_SKIP() << "needs 2 usable CPUs, this process has " << usable_cpus().size();
  write_text(dir_ / "jobs.toml", "[[job]]\nname = \"a\"\ncpus = 2\ncommand = \"" +
                                     show_and_sleep(0.3) +
                                     "\"\n[[job]]\nname = \"b\"\ncpus = 2\ncommand = \"" +
                                     show_and_sleep(0.3) + "\"\n");
  EXPECT_EQ(run({"jobs.toml"}, {}, cpus), 0);  // the launcher is given exactly 2 CPUs
  EXPECT_GT(position("started", "b"), position("exited", "a"));
  for (const char* job : {"a", "b"}) {
    EXPECT_EQ(printed_mask(job_log(job)), cpus) << job_log(job);
    EXPECT_EQ(printed(job_log(job), "GALLEY_NUM_THREADS"), "2") << job_log(job);
  }
}

TEST_F(LaunchTest, JobsWithoutCpusSplitTheCpusEvenly) {
  const auto cpus = two_cpus();
  if (cpus.empty())
    GTEST_SKIP() << "needs 2 usable CPUs, this process has " << usable_cpus().size();
  write_text(dir_ / "jobs.toml", "[[job]]\nname = \"a\"\ncommand = \"" + show_and_sleep(0.3) +
                                     "\"\n[[job]]\nname = \"b\"\ncommand = \"" +
                                     show_and_sleep(0.3) + "\"\n");
  EXPECT_EQ(run({"jobs.toml"}, {}, cpus), 0);
  const auto a = printed_mask(job_log("a")), b = printed_mask(job_log("b"));
  EXPECT_EQ(a.size(), 1u) << job_log("a");
  EXPECT_EQ(b.size(), 1u) << job_log("b");
  EXPECT_FALSE(overlap(a, b));
  EXPECT_EQ(printed(job_log("a"), "GALLEY_NUM_THREADS"), "1");
}

TEST_F(LaunchTest, TheJobsOwnThreadSettingsWin) {
  EXPECT_EQ(run({"--cpus", "1", "--env", "OMP_NUM_THREADS=7", "--name", "own", "--", "sh", "-c",
                 show_and_sleep(0)}),
            0);
  EXPECT_EQ(printed(job_log("own"), "OMP_NUM_THREADS"), "7");
  EXPECT_EQ(printed(job_log("own"), "GALLEY_NUM_THREADS"), "1");
}

TEST_F(LaunchTest, CheckRefusesMoreCpusThanTheAllocationNamingJobAndNumbers) {
  const auto cpus = usable_cpus();
  const std::string wanted = std::to_string(cpus.size() + 1);
  EXPECT_EQ(run({"--check", "--cpus", wanted, "--name", "big", "--", "true"}), 2);
  const std::string err = stderr_text();
  EXPECT_NE(err.find("job 'big'"), std::string::npos) << err;
  EXPECT_NE(err.find("wants " + wanted + " CPU(s) but only " + std::to_string(cpus.size())),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("affinity mask"), std::string::npos) << err;
  // What fits passes, and the check says what it was given.
  EXPECT_EQ(run({"--check", "--cpus", "1", "--", "true"}), 0);
  EXPECT_NE(read_text(dir_ / "stdout.txt").find("allocation: "), std::string::npos);
}

TEST_F(LaunchTest, SlurmCpusOnNodeLimitsTheCpusToTheFirstOfTheMask) {
  const auto cpus = two_cpus();
  if (cpus.empty())
    GTEST_SKIP() << "needs 2 usable CPUs, this process has " << usable_cpus().size();
  EXPECT_EQ(run({"--name", "slurm", "--", "sh", "-c", show_and_sleep(0)},
                {"SLURM_CPUS_ON_NODE=1", "SLURM_JOB_ID=42"}, cpus),
            0);
  const auto allocation = events("allocation");
  ASSERT_EQ(allocation.size(), 1u);
  EXPECT_EQ(allocation[0]["cpus"], Json::array({cpus[0]}));
  EXPECT_NE(allocation[0]["cpu_source"].get<std::string>().find("SLURM_CPUS_ON_NODE=1"),
            std::string::npos);
  EXPECT_EQ(printed_mask(job_log("slurm")), std::vector<int>{cpus[0]});
  EXPECT_NE(read_text(dir_ / "stdout.txt").find("SLURM_CPUS_ON_NODE=1"), std::string::npos);
  // A job that wants both CPUs cannot run inside this allocation.
  EXPECT_EQ(run({"--check", "--cpus", "2", "--", "true"}, {"SLURM_CPUS_ON_NODE=1"}, cpus), 2);
  EXPECT_NE(stderr_text().find("wants 2 CPU(s) but only 1"), std::string::npos) << stderr_text();
}

TEST_F(LaunchTest, AnInheritedCudaVisibleDevicesMapsJobGpuIdsOntoItsDevices) {
  write_text(dir_ / "jobs.toml", R"(
[launcher]
gpus_available = [0, 1, 2, 3]

[[job]]
name = "first"
command = "echo CUDA=$CUDA_VISIBLE_DEVICES"
gpus = [0]

[[job]]
name = "second"
command = "echo CUDA=$CUDA_VISIBLE_DEVICES"
gpus = [1]

[[job]]
name = "both"
command = "echo CUDA=$CUDA_VISIBLE_DEVICES"
gpus = 2
)");
  EXPECT_EQ(run({"jobs.toml"}, {"CUDA_VISIBLE_DEVICES=3,1"}), 0);
  EXPECT_EQ(printed(job_log("first"), "CUDA"), "3") << job_log("first");
  EXPECT_EQ(printed(job_log("second"), "CUDA"), "1") << job_log("second");
  EXPECT_EQ(printed(job_log("both"), "CUDA"), "3,1") << job_log("both");
  const auto allocation = events("allocation");
  ASSERT_EQ(allocation.size(), 1u);
  EXPECT_EQ(allocation[0]["gpu_source"], "CUDA_VISIBLE_DEVICES");
  EXPECT_EQ(allocation[0]["gpus_visible"], Json::array({"3", "1"}));
  EXPECT_EQ(events("started", "first")[0]["cuda_visible_devices"], "3");
  EXPECT_EQ(summary_of("second")["gpus"], Json::array({1}));
  EXPECT_EQ(summary_of("second")["cuda_visible_devices"], "1");
  // Only two GPUs were given: GPU 2 does not exist for the jobs.
  EXPECT_EQ(run({"--check", "--gpus-available", "0,1,2,3", "--gpu-ids", "2", "--", "true"},
                {"CUDA_VISIBLE_DEVICES=3,1"}),
            2);
  EXPECT_NE(stderr_text().find("asks for GPU 2"), std::string::npos) << stderr_text();
  EXPECT_NE(stderr_text().find("CUDA_VISIBLE_DEVICES"), std::string::npos) << stderr_text();
}

TEST_F(LaunchTest, ARestrictedGpuIsSampledUnderItsNvmlIndex) {
  // The fake NVML has GPUs 0 (50%) and 1 (60%); the launcher was given GPU 1 alone.
  const std::string path = std::string("LD_LIBRARY_PATH=") + GALLEY_LAUNCH_FAKE_NVML_DIR;
  EXPECT_EQ(run({"--sample-interval", "0.05", "--gpus", "1", "--name", "one", "--", "sh", "-c",
                 "echo CUDA=$CUDA_VISIBLE_DEVICES; sleep 0.3"},
                {path, "CUDA_VISIBLE_DEVICES=1"}),
            0);
  EXPECT_EQ(printed(job_log("one"), "CUDA"), "1");
  const Json gpus = summary()["gpus"];
  ASSERT_EQ(gpus["devices"].size(), 1u) << gpus.dump();
  EXPECT_EQ(gpus["devices"][0]["id"], 0);
  EXPECT_EQ(gpus["devices"][0]["visible_as"], "1");
  EXPECT_DOUBLE_EQ(gpus["devices"][0]["mean_utilization_percent"].get<double>(), 60.0);
}

TEST_F(LaunchTest, SlurmJobGpusRestrictTheGpusWithoutCudaVisibleDevices) {
  EXPECT_EQ(run({"--gpus", "1", "--name", "g", "--", "sh", "-c", "echo CUDA=$CUDA_VISIBLE_DEVICES"},
                {"GALLEY_LAUNCH_FAKE_GPUS=4", "SLURM_JOB_GPUS=2"}),
            0);
  EXPECT_EQ(printed(job_log("g"), "CUDA"), "2") << job_log("g");
  EXPECT_EQ(events("allocation")[0]["gpu_source"], "SLURM_JOB_GPUS");
}

TEST_F(LaunchTest, WithoutMeasuredTimesTheSerialTimeIsEstimatedFromCpuTime) {
  // A job that keeps one CPU busy for a moment.
  EXPECT_EQ(run({"--cpus", "1", "--name", "busy", "--", "sh", "-c",
                 "i=0; while [ $i -lt 30000 ]; do i=$((i+1)); done"}),
            0);
  const Json s = summary();
  const Json job = summary_of("busy");
  EXPECT_EQ(s["serial_estimate_method"], "estimated");
  EXPECT_EQ(job["serial_method"], "estimated");
  const double cpu = job["cpu_s"].get<double>(), run_s = job["run_s"].get<double>();
  EXPECT_GT(cpu, 0.0);
  const double cpus = double(s["allocation"]["cpus"].size());
  EXPECT_NEAR(job["serial_s"].get<double>(), std::min(run_s, cpu / cpus), 0.002);
  // The summary rounds every time to the millisecond and the speedup to 1e-3, which for a job of a
  // few milliseconds (the loop under a sanitizer) moves the ratio of the rounded times by more
  // than any fixed tolerance: allow what the roundings allow.
  const double serial = s["serial_estimate_s"].get<double>(),
               makespan = s["makespan_s"].get<double>();
  const double e = 0.0005, low = std::max(makespan - e, 1e-6);
  ASSERT_GT(makespan, 0.0);
  EXPECT_NEAR(s["packing_speedup"].get<double>(), serial / makespan,
              e / low * (1 + (serial + e) / low) + e + 1e-9);
  EXPECT_TRUE(s.contains("sum_of_job_times_s"));
}

// --- outputs ----------------------------------------------------------------------------------

TEST_F(LaunchTest, JobsSharingALogAreRefusedBeforeAnythingRunsOrIsTruncated) {
  // Each log was opened on its own and truncated the other's lines.
  write_text(dir_ / "shared.log", "an earlier run\n");
  write_text(dir_ / "jobs.toml", R"(
[[job]]
name = "a"
command = "touch ran-a"
log = "shared.log"

[[job]]
name = "b"
command = "touch ran-b"
log = "./logs/../shared.log"
)");
  EXPECT_EQ(run({"--check", "jobs.toml"}), 2);
  EXPECT_NE(stderr_text().find("the log of job 'a' and the log of job 'b' are the same file"),
            std::string::npos)
      << stderr_text();
  EXPECT_EQ(run({"jobs.toml"}), 2);
  EXPECT_NE(stderr_text().find("the log of job 'a' and the log of job 'b'"), std::string::npos)
      << stderr_text();
  EXPECT_FALSE(fs::exists(dir_ / "ran-a") || fs::exists(dir_ / "ran-b"));
  EXPECT_EQ(read_text(dir_ / "shared.log"), "an earlier run\n");
  EXPECT_FALSE(fs::exists(dir_ / "galley-launch-logs"));
  // The event log as a job's log.
  EXPECT_EQ(run({"--event-log", "out.txt", "--log", "out.txt", "--", "true"}), 2);
  EXPECT_NE(stderr_text().find("the event log and the log of job 'true'"), std::string::npos)
      << stderr_text();
}

TEST_F(LaunchTest, AnOutputPathThatCannotBeWrittenStopsTheLauncherBeforeAnyJob) {
  // A summary under a regular file was found only once every job had run.
  write_text(dir_ / "file", "x");
  fs::create_directories(dir_ / "galley-launch-logs");
  write_text(dir_ / "galley-launch-logs/events.jsonl", "an earlier run\n");
  EXPECT_EQ(run({"--check", "--summary", "file/summary.json", "--", "touch", "ran"}), 2);
  EXPECT_NE(
      stderr_text().find("cannot write the summary 'file/summary.json': 'file' is not a directory"),
      std::string::npos)
      << stderr_text();
  EXPECT_EQ(run({"--summary", "file/summary.json", "--", "touch", "ran"}), 2);
  EXPECT_NE(stderr_text().find("the summary"), std::string::npos) << stderr_text();
  EXPECT_FALSE(fs::exists(dir_ / "ran"));
  EXPECT_EQ(read_text(dir_ / "galley-launch-logs/events.jsonl"), "an earlier run\n");
  EXPECT_EQ(run({"--event-log", "file/deeper/events.jsonl", "--", "touch", "ran"}), 2);
  EXPECT_NE(stderr_text().find("cannot write the event log"), std::string::npos) << stderr_text();
  EXPECT_FALSE(fs::exists(dir_ / "ran"));
  // The summary's own directory is created before the jobs run, and written at the end.
  EXPECT_EQ(run({"--summary", "new/dir/summary.json", "--", "touch", "ran"}), 0);
  EXPECT_TRUE(fs::exists(dir_ / "new/dir/summary.json"));
}

TEST_F(LaunchTest, TextThatIsNotUtf8IsWrittenWithReplacementCharacters) {
  // nlohmann's dump threw on it, which stopped the launcher and killed its jobs.
  const std::string bad = "\xff\xfe";
  EXPECT_EQ(run({"--log", "log-" + bad + ".log", "--name", "u", "--", "sh", "-c", "echo hi",
                 "arg-" + bad}),
            0)
      << stderr_text();
  const auto queued = events("queued", "u");
  ASSERT_EQ(queued.size(), 1u);
  EXPECT_EQ(queued[0]["command"][3], "arg-\xef\xbf\xbd\xef\xbf\xbd");  // U+FFFD twice
  EXPECT_EQ(summary_of("u")["log"], "log-\xef\xbf\xbd\xef\xbf\xbd.log");
  EXPECT_NE(read_text(dir_ / ("log-" + bad + ".log")).find("[out] hi"), std::string::npos);
  // A path in a message: the working directory a job cannot enter.
  EXPECT_EQ(run({"--workdir", "missing-" + bad, "--name", "w", "--", "true"}), 1);
  const auto failed = events("failed_to_start", "w");
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_NE(failed[0]["message"].get<std::string>().find("missing-\xef\xbf\xbd"),
            std::string::npos);
  EXPECT_EQ(summary_of("w")["status"], "failed_to_start");
}

// A job file of `count` jobs named j1, j2, ... running `command`.
std::string many_jobs(int count, const std::string& command) {
  std::string text;
  for (int i = 1; i <= count; ++i)
    text += "[[job]]\nname = \"j" + std::to_string(i) + "\"\ncommand = \"" + command + "\"\n";
  return text;
}

TEST_F(LaunchTest, MoreJobsThanOpenFilesRunWhenFewRunAtOnce) {
  // Every log was opened at the start: 100 jobs did not fit 64 open files.
  open_files_ = rlimit{64, 64};
  write_text(dir_ / "jobs.toml", many_jobs(100, "echo ok"));
  EXPECT_EQ(run({"--max-parallel", "4", "jobs.toml"}, {}, {}), 0) << stderr_text();
  EXPECT_EQ(events("finished").size(), 100u);
  const Json s = summary();
  for (const auto& j : s["jobs"]) EXPECT_EQ(j["status"], "succeeded") << j.dump();
  EXPECT_NE(job_log("j100").find("[out] ok"), std::string::npos);
}

TEST_F(LaunchTest, JobsPastWhatTheOpenFileLimitHoldsWaitInsteadOfFailing) {
  // 60 jobs and no --max-parallel under a hard limit of 64: all at once would need 180
  // descriptors. The launcher runs as many as the limit holds, says so, and the rest wait.
  open_files_ = rlimit{64, 64};
  write_text(dir_ / "jobs.toml", many_jobs(60, "sleep 0.2; echo ok"));
  EXPECT_EQ(run({"jobs.toml"}, {}, {}, 60s), 0) << stderr_text();
  EXPECT_TRUE(events("failed_to_start").empty());
  EXPECT_EQ(events("finished").size(), 60u);
  const Json s = summary();  // (a temporary's ["jobs"] would not outlive the loop's start)
  for (const auto& j : s["jobs"]) EXPECT_EQ(j["status"], "succeeded") << j.dump();
  const auto allocation = events("allocation");
  ASSERT_EQ(allocation.size(), 1u);
  EXPECT_NE(allocation[0].dump().find("hard limit on open files (64)"), std::string::npos)
      << allocation[0].dump();
}

TEST_F(LaunchTest, JobsRunningAtOnceMayHoldMoreFilesThanTheSoftLimitAndKeepItThemselves) {
  // 20 jobs that each wait until all 20 have started hold 60 descriptors in the launcher (two
  // pipes and a log each), past a soft limit of 32; the launcher raises its own to the hard
  // limit, and the jobs get 32.
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_max < 256) GTEST_SKIP() << "the hard limit on open files is " << limit.rlim_max;
  open_files_ = rlimit{32, limit.rlim_max};
  write_text(dir_ / "jobs.toml",
             many_jobs(20,
                       "touch up.$GALLEY_LAUNCH_JOB; ulimit -n; i=0; while [ $i -lt 400 ]; do "
                       "set -- up.*; [ $# -ge 20 ] && exit 0; sleep 0.05; i=$((i+1)); done; "
                       "exit 1"));
  EXPECT_EQ(run({"jobs.toml"}, {}, {}, 40s), 0) << stderr_text();
  EXPECT_EQ(events("finished").size(), 20u);
  EXPECT_TRUE(events("failed_to_start").empty());
  EXPECT_NE(job_log("j7").find("[out] 32\n"), std::string::npos) << job_log("j7");
}

}  // namespace

// A share a job gives back goes to the next queued job in the same turn of the loop: four short
// jobs one at a time start each as the one before finishes, not a poll timeout (a second) later.
TEST_F(LaunchTest, TheNextQueuedJobStartsAsTheSharesComeBack) {
  write_text(dir_ / "jobs.toml", R"(
[launcher]
max_parallel = 1

[[job]]
name = "a"
command = "sleep 0.1"
[[job]]
name = "b"
command = "sleep 0.1"
[[job]]
name = "c"
command = "sleep 0.1"
)");
  EXPECT_EQ(run({"jobs.toml"}), 0);
  for (const auto& [before, after] : {std::pair("a", "b"), std::pair("b", "c")}) {
    const auto ended = events("finished", before), started = events("started", after);
    ASSERT_EQ(ended.size(), 1u);
    ASSERT_EQ(started.size(), 1u);
    // The loop took a second to notice before; the bound leaves room for a loaded machine.
    EXPECT_LT(started[0]["elapsed_s"].get<double>() - ended[0]["elapsed_s"].get<double>(), 0.75)
        << before << " -> " << after;
  }
}

// A job's output reaches its log byte for byte, NUL bytes included (%s stopped at the first).
TEST_F(LaunchTest, OutputWithNulBytesIsLoggedWhole) {
  EXPECT_EQ(run({"--name", "nul", "--", "sh", "-c", "printf 'abc\\000def\\n'"}), 0);
  const std::string log = job_log("nul");
  EXPECT_NE(log.find(std::string("[out] abc\0def\n", 14)), std::string::npos) << log;
}

// Outputs that cannot be opened are found by --check, before any file is emptied: a name too
// long for the file system, a named pipe no process reads (opening it waited for ever), the job
// file itself; and an empty job name or a NUL byte in the environment is refused.
TEST_F(LaunchTest, OutputsThatCannotBeOpenedAreRefusedBeforeAnythingIsTruncated) {
  fs::create_directories(dir_ / "galley-launch-logs");
  write_text(dir_ / "galley-launch-logs/events.jsonl", "an earlier run\n");
  const std::string long_name(300, 'x');
  EXPECT_EQ(run({"--check", "--log", long_name + ".log", "--", "true"}), 2);
  EXPECT_NE(stderr_text().find("File name too long"), std::string::npos) << stderr_text();
  EXPECT_EQ(run({"--log", long_name + ".log", "--", "true"}), 2);
  EXPECT_EQ(read_text(dir_ / "galley-launch-logs/events.jsonl"), "an earlier run\n");
  ASSERT_EQ(mkfifo((dir_ / "pipe").c_str(), 0644), 0);
  EXPECT_EQ(run({"--log", "pipe", "--", "touch", "ran"}, {}, {}, 10s), 2);
  EXPECT_NE(stderr_text().find("named pipe that no process reads"), std::string::npos)
      << stderr_text();
  EXPECT_FALSE(fs::exists(dir_ / "ran"));
  write_text(dir_ / "jobs.toml", R"(
[[job]]
name = "self"
command = "touch ran"
log = "jobs.toml"
)");
  EXPECT_EQ(run({"jobs.toml"}), 2);
  EXPECT_NE(stderr_text().find("is the job file"), std::string::npos) << stderr_text();
  EXPECT_NE(read_text(dir_ / "jobs.toml").find("[[job]]"), std::string::npos);
  write_text(dir_ / "jobs.toml", "[[job]]\nname = \"\"\ncommand = \"true\"\n");
  EXPECT_EQ(run({"--check", "jobs.toml"}), 2);
  EXPECT_NE(stderr_text().find("'name' is empty"), std::string::npos) << stderr_text();
  write_text(dir_ / "jobs.toml", "[[job]]\ncommand = \"true\"\nenv = {V = \"keep\\u0000lost\"}\n");
  EXPECT_EQ(run({"--check", "jobs.toml"}), 2);
  EXPECT_NE(stderr_text().find("environment variable 'V'"), std::string::npos) << stderr_text();
  EXPECT_FALSE(fs::exists(dir_ / "ran"));
}

// A file that cannot be written as the run goes on (a full disk: /dev/full) is said once and
// written no more, and the jobs go on; a summary that cannot be written is an error (its write
// went unchecked: a full disk left no summary and exit status 0).
TEST_F(LaunchTest, OutputsThatFailToBeWrittenAreReported) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this system";
  write_text(dir_ / "jobs.toml", R"(
[launcher]
summary = "/dev/full"

[[job]]
name = "a"
command = ["sh", "-c", "echo hello; echo world; exit 1"]
log = "/dev/full"
max_restarts = 2

[[job]]
name = "b"
command = "exit 0"
)");
  EXPECT_EQ(run({"--backoff-initial", "0.01", "jobs.toml"}), 2);
  const std::string err = stderr_text();
  // Said once, with the write's own reason, though the job ran three times.
  const std::string said =
      "writing the log of job 'a' '/dev/full' failed (No space left on device)";
  EXPECT_NE(err.find(said), std::string::npos) << err;
  EXPECT_EQ(err.find(said, err.find(said) + 1), std::string::npos) << err;
  EXPECT_EQ(events("started", "a").size(), 3u);
  EXPECT_NE(err.find("writing the summary '/dev/full' failed"), std::string::npos) << err;
  EXPECT_EQ(events("finished", "b").size(), 1u);
  EXPECT_EQ(events("finished", "b")[0]["status"], "succeeded");
}
