// Training checkpoints on top of safetensors.
#include "galley/io/checkpointer.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include "galley/distributed.h"
#include "galley/io/checkpoint.h"

namespace galley::io {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "galley-checkpoint-1";

// Prefixes `part`'s entries with `scope.` into the file's tensors and metadata.
void put(const std::string& scope, const StateDict& part, std::map<std::string, Tensor>& tensors,
         std::map<std::string, std::string>& meta) {
  for (auto& [k, t] : part.tensors) tensors[scope + "." + k] = t;
  for (auto& [k, v] : part.values) meta[scope + "." + k] = v;
}

// The entries under `scope.`, prefix removed.
StateDict take(const std::string& scope, const SafetensorsFile& f) {
  StateDict st;
  const std::string p = scope + ".";
  for (auto& [k, t] : f.tensors)
    if (k.compare(0, p.size(), p) == 0) st.tensors[k.substr(p.size())] = t;
  for (auto& [k, v] : f.metadata)
    if (k.compare(0, p.size(), p) == 0) st.values[k.substr(p.size())] = v;
  return st;
}

// With a data-parallel model the optimizer holds every replica's parameters; their states are
// identical, so only replica 0's share is saved and it is given to every replica on load.
size_t replica_share(const TrainingState& s) {
  if (!s.parallel_model || !s.optimizer) return 0;
  const size_t per = s.parallel_model->named_parameters().size();
  const size_t all = s.optimizer->parameters().size();
  return all == per * s.parallel_model->num_replicas() ? per : 0;
}

// Splits an optimizer key "state.<index>.<rest>"; false for keys of the optimizer as a whole.
bool split_key(const std::string& key, size_t* index, std::string* rest) {
  if (key.compare(0, 6, "state.") != 0) return false;
  const size_t dot = key.find('.', 6);
  if (dot == std::string::npos || dot == 6) return false;
  const std::string num = key.substr(6, dot - 6);
  if (num.find_first_not_of("0123456789") != std::string::npos) return false;
  const auto parsed = std::from_chars(num.data(), num.data() + num.size(), *index);
  GALLEY_CHECK(parsed.ec == std::errc(), "optimizer state key '", key,
               "' names a parameter index past any there can be");
  *rest = key.substr(dot + 1);
  return true;
}

// Keeps the per-parameter entries of parameters [0, per) and hands them to `copies` replicas:
// parameter i's state also becomes parameter i + r * per's.
template <typename V>
std::map<std::string, V> spread(const std::map<std::string, V>& in, size_t per, size_t copies) {
  std::map<std::string, V> out;
  for (auto& [k, v] : in) {
    size_t i;
    std::string rest;
    if (!split_key(k, &i, &rest)) {
      out[k] = v;
      continue;
    }
    if (i >= per) continue;
    for (size_t r = 0; r < copies; ++r) out[detail::str_cat("state.", i + r * per, ".", rest)] = v;
  }
  return out;
}

// The metadata key of generator `name` of process `rank`: "rng.<name>" for process 0,
// "rng.rank<q>.<name>" for the others.
std::string generator_key(int rank, const std::string& name) {
  return rank == 0 ? "rng." + name : detail::str_cat("rng.rank", rank, ".", name);
}

// The model's generators ("model.<name>", or a data-parallel model's "replica<i>[.<name>]").
std::vector<std::pair<std::string, Generator*>> model_generators(const TrainingState& s) {
  std::vector<std::pair<std::string, Generator*>> out;
  if (s.model)
    for (auto& [name, gen] : s.model->named_generators()) out.emplace_back("model." + name, gen);
  if (s.parallel_model) out = s.parallel_model->named_generators();
  return out;
}

// This process's generator states under their metadata keys.
std::map<std::string, std::string> own_generator_states(const TrainingState& s) {
  const int rank = distributed::parallel_env().rank;
  std::map<std::string, std::string> out;
  for (auto& [name, gen] : model_generators(s)) out[generator_key(rank, name)] = gen->state();
  return out;
}

// Every process's generator states, in every process: each one's lines "key\tstate\n",
// gathered as bytes padded to the longest.
std::map<std::string, std::string> all_generator_states(const TrainingState& s) {
  std::map<std::string, std::string> mine = own_generator_states(s);
  const auto world = distributed::world();
  if (!world) return mine;
  std::string text;
  for (auto& [k, v] : mine) text += k + "\t" + v + "\n";
  const std::vector<int64_t> sizes =
      world->all_gather(Tensor::from_vector(std::vector<int64_t>{int64_t(text.size())}, {1}))
          .to_vector<int64_t>();
  const int64_t longest = *std::max_element(sizes.begin(), sizes.end());
  text.resize(size_t(longest), '\0');
  const Tensor all = world->all_gather(Tensor::from_host(text.data(), {longest}, DType::UInt8));
  const std::vector<uint8_t> bytes = all.to_vector<uint8_t>();
  std::map<std::string, std::string> out;
  for (size_t q = 0; q < sizes.size(); ++q) {
    const std::string theirs(reinterpret_cast<const char*>(bytes.data()) + q * size_t(longest),
                             size_t(sizes[q]));
    size_t at = 0;
    while (at < theirs.size()) {
      const size_t tab = theirs.find('\t', at), end = theirs.find('\n', at);
      GALLEY_CHECK(tab < end && end != std::string::npos, "save_checkpoint: process ", q,
                   " sent a malformed generator state");
      out[theirs.substr(at, tab - at)] = theirs.substr(tab + 1, end - tab - 1);
      at = end + 1;
    }
  }
  return out;
}

// save_checkpoint with the generator states to keep (this process's, or every process's).
void save_with_generators(const std::string& path, const TrainingState& s,
                          const std::map<std::string, std::string>& generators) {
  GALLEY_CHECK(!(s.model && s.parallel_model),
               "save_checkpoint: give model or parallel_model, not both");
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> meta{{"format", kFormat},
                                          {"epoch", std::to_string(s.epoch)},
                                          {"step", std::to_string(s.step)},
                                          {"batch", std::to_string(s.batch)},
                                          {"rng.default", default_generator_state()}};
  if (s.model || s.parallel_model) {
    auto model = s.model ? s.model->state_dict() : s.parallel_model->state_dict();
    for (auto& [k, t] : model) tensors["model." + k] = t;
  }
  if (s.optimizer) {
    StateDict opt = s.optimizer->state_dict();
    if (size_t per = replica_share(s)) {
      opt.tensors = spread(opt.tensors, per, 1);
      opt.values = spread(opt.values, per, 1);
      opt.set("num_params", static_cast<int64_t>(per));
    }
    put("optimizer", opt, tensors, meta);
  }
  if (s.scheduler) put("scheduler", s.scheduler->state_dict(), tensors, meta);
  if (s.grad_scaler && s.grad_scaler->is_enabled())
    put("grad_scaler", s.grad_scaler->state_dict(), tensors, meta);
  for (auto& [k, v] : s.extra) meta["extra." + k] = v;
  for (auto& [k, v] : generators) meta[k] = v;
  save_safetensors(path, tensors, meta);
}

}  // namespace

void save_checkpoint(const std::string& path, const TrainingState& s) {
  save_with_generators(path, s, own_generator_states(s));
}

void load_checkpoint(const std::string& path, TrainingState& s) {
  GALLEY_CHECK(!(s.model && s.parallel_model),
               "load_checkpoint: give model or parallel_model, not both");
  SafetensorsFile f = read_safetensors(path);
  auto meta = [&](const std::string& k) -> const std::string& {
    auto it = f.metadata.find(k);
    GALLEY_CHECK(it != f.metadata.end(), "checkpoint '", path, "' lacks '", k, "'");
    return it->second;
  };
  GALLEY_CHECK(meta("format") == kFormat, "checkpoint '", path, "' has format '", meta("format"),
               "', expected '", kFormat, "'");
  try {
    StateDict counters;
    counters.values = f.metadata;
    const int64_t epoch = counters.get_int("epoch", path), step = counters.get_int("step", path),
                  batch = counters.get_int("batch", path);
    std::map<std::string, Tensor> model;
    for (auto& [k, t] : f.tensors)
      if (k.compare(0, 6, "model.") == 0) model[k.substr(6)] = t;
    // Each component checks its own entries before changing anything; the scaler, whose state
    // is checked as a whole, first, into a copy.
    // A file saved without a scaler (or with a disabled one) leaves an enabled scaler as it is,
    // as a scaler newly turned on starts: its state is relearnt in a few steps, and refusing the
    // file would have resume() fall back to an older checkpoint, losing the steps since.
    std::optional<amp::GradScaler> scaler;
    const StateDict scaler_state = take("grad_scaler", f);
    if (s.grad_scaler && s.grad_scaler->is_enabled() &&
        !(scaler_state.values.empty() && scaler_state.tensors.empty())) {
      scaler = *s.grad_scaler;
      scaler->load_state_dict(scaler_state);
    }
    // The generators' states, parsed into copies: this process's, where the file has them.
    Generator default_state;
    default_state.set_state(meta("rng.default"));
    const int rank = distributed::parallel_env().rank;
    std::vector<std::pair<Generator*, Generator>> generators;
    for (auto& [name, gen] : model_generators(s)) {
      auto it = f.metadata.find(generator_key(rank, name));
      if (it == f.metadata.end()) continue;
      Generator restored;
      restored.set_state(it->second);
      generators.emplace_back(gen, restored);
    }
    // The model, the optimizer and the scheduler each check their entries, one after the
    // other: what they held is kept (copied) first and put back when a later one refuses its
    // state, so that a file that does not fit changes none of them.
    auto copied = [](std::map<std::string, Tensor> m) {
      for (auto& [k, t] : m) t = t.clone();
      return m;
    };
    std::map<std::string, Tensor> model_before, parallel_before;
    StateDict optimizer_before, scheduler_before;
    if (s.model) model_before = copied(s.model->state_dict());
    if (s.parallel_model) parallel_before = copied(s.parallel_model->state_dict());
    if (s.optimizer) {
      optimizer_before = s.optimizer->state_dict();
      optimizer_before.tensors = copied(optimizer_before.tensors);
    }
    if (s.scheduler) scheduler_before = s.scheduler->state_dict();
    try {
      if (s.model) s.model->load_state_dict(model);
      if (s.parallel_model) s.parallel_model->load_state_dict(model);
      if (s.optimizer) {
        StateDict opt = take("optimizer", f);
        GALLEY_CHECK(!opt.values.empty() || !opt.tensors.empty(),
                     "it holds no optimizer state (saved without an optimizer)");
        if (size_t per = replica_share(s)) {
          // Saved for replica 0's parameters: a state for another count would land on other
          // parameters once spread.
          const int64_t saved = opt.get_int("num_params", s.optimizer->name());
          GALLEY_CHECK(saved == int64_t(per), s.optimizer->name(), ": saved state is for ", saved,
                       " parameters, a replica of the data-parallel model has ", per);
          opt.tensors = spread(opt.tensors, per, s.parallel_model->num_replicas());
          opt.values = spread(opt.values, per, s.parallel_model->num_replicas());
          opt.set("num_params", static_cast<int64_t>(s.optimizer->parameters().size()));
        }
        s.optimizer->load_state_dict(opt);
      }
      if (s.scheduler) {
        StateDict sched = take("scheduler", f);
        GALLEY_CHECK(!sched.values.empty(), "it holds no scheduler state (saved without one)");
        // The schedule sets the rate it last set; the optimizer's saved rate is the one to go on
        // from (a rate moved after the schedule's last step, which its next step follows).
        const double lr = s.optimizer ? s.optimizer->learning_rate() : 0.0;
        s.scheduler->load_state_dict(sched);
        if (s.optimizer) s.optimizer->set_learning_rate(lr);
      }
    } catch (...) {
      if (s.model) s.model->load_state_dict(model_before);
      if (s.parallel_model) s.parallel_model->load_state_dict(parallel_before);
      if (s.optimizer) s.optimizer->load_state_dict(optimizer_before);
      if (s.scheduler) s.scheduler->load_state_dict(scheduler_before);
      throw;
    }
    if (scaler) *s.grad_scaler = *scaler;
    set_default_generator_state(default_state);
    for (auto& [gen, restored] : generators) *gen = restored;
    s.epoch = epoch;
    s.step = step;
    s.batch = batch;
    s.extra.clear();
    for (auto& [k, v] : f.metadata)
      if (k.compare(0, 6, "extra.") == 0) s.extra[k.substr(6)] = v;
  } catch (...) {
    detail::rethrow_with_prefix(detail::str_cat("checkpoint '", path, "': "));
  }
}

// ---------------------------------------------------------------------------------------------
// Preemption

namespace {

// The signal handler's only state. A signal handler can reach nothing but globals; a lock-free
// atomic is the one kind of object it may write (besides volatile sig_atomic_t).
std::atomic<int> g_preempt_signal{0};
// Whether some Checkpointer watches signals (one at a time: the handler has one flag).
std::atomic<bool> g_watching{false};
static_assert(std::atomic<int>::is_always_lock_free, "the signal flag must be lock-free");

extern "C" void on_preempt_signal(int signal) {
  g_preempt_signal.store(signal, std::memory_order_relaxed);
}

std::string signal_name(int signal) {
  // glibc's abbreviation ("TERM"); any other number is named as such.
  const char* abbrev = sigabbrev_np(signal);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signal);
}

}  // namespace

Preempted::Preempted(int signal, std::string path)
    : std::runtime_error(detail::str_cat("preempted by ", signal_name(signal),
                                         ": checkpoint saved to '", path, "'")),
      signal_(signal),
      path_(std::move(path)) {}

struct Checkpointer::Watch {
  int signal;
  struct sigaction previous;
};

bool Checkpointer::preempted() const {
  return preempt_signal() != 0;
}

int Checkpointer::preempt_signal() const {
  return watches_.empty() ? 0 : g_preempt_signal.load(std::memory_order_relaxed);
}

void Checkpointer::stop_if_preempted(const TrainingState& state) {
  const int signal = preempt_signal();
  if (signal == 0) return;
  throw Preempted(signal, write(state, own_generator_states(state)));
}

Checkpointer::~Checkpointer() {
  if (watches_.empty()) return;
  // Newest first, so that a signal listed twice gets its original handler back.
  for (auto it = watches_.rbegin(); it != watches_.rend(); ++it)
    sigaction(it->signal, &it->previous, nullptr);
  g_preempt_signal.store(0);
  g_watching.store(false);
}

// ---------------------------------------------------------------------------------------------
// Checkpointer

namespace {

constexpr size_t kMaxPrefix = 255 - 32 - 33;

// The entries of directory `dir`; a directory that cannot be read (removed, unmounted, not
// permitted) is a galley error naming it.
std::vector<fs::path> entries_of(const std::string& dir) {
  std::error_code ec;
  std::vector<fs::path> out;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) out.push_back(it->path());
  GALLEY_CHECK(!ec, "Checkpointer: cannot read directory '", dir, "': ", ec.message());
  return out;
}

// Whether the temporary file p of a save is abandoned: no process holds the lock a save takes
// on it before writing its first byte (save_safetensors), and it has bytes, or it is a few
// seconds old (an empty one may be a save between creating the file and locking it). Where the
// file system has no locks: the save's process (the <pid> of ".tmp.<pid>.<n>") no longer exists
// on this machine, and the same (a check that holds for saves of this machine alone: without
// locks, two machines sharing a directory must not open Checkpointers on it at once).
bool abandoned(const fs::path& p) {
  std::error_code ec;
  const auto size = fs::file_size(p, ec);
  if (ec) return false;
  if (size == 0) {
    const auto written = fs::last_write_time(p, ec);
    if (ec || fs::file_time_type::clock::now() - written < std::chrono::seconds(5)) return false;
  }
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  // A shared lock: it conflicts with the save's exclusive one, and needs no write access (on NFS
  // an exclusive lock would).
  const int locked = ::flock(fd, LOCK_SH | LOCK_NB);
  const int err = errno;
  ::close(fd);
  if (locked == 0) return true;
  if (err != ENOLCK && err != EOPNOTSUPP && err != EINVAL) return false;  // held: a save runs
  const std::string name = p.filename().string();
  const size_t at = name.rfind(".tmp.");
  long pid = 0;
  if (at == std::string::npos ||
      std::from_chars(name.data() + at + 5, name.data() + name.size(), pid).ec != std::errc())
    return false;
  return pid > 0 && ::kill(pid_t(pid), 0) != 0 && errno == ESRCH;
}

}  // namespace

Checkpointer::Checkpointer(std::string directory, CheckpointOptions options)
    : dir_(std::move(directory)), opt_(std::move(options)) {
  GALLEY_CHECK(opt_.keep_last >= 1, "Checkpointer: keep_last ", opt_.keep_last, " must be >= 1");
  for (int sig : opt_.preempt_signals)
    GALLEY_CHECK(sig > 0 && sig < NSIG && sig != SIGKILL && sig != SIGSTOP,
                 "Checkpointer: cannot watch signal ", sig);
  GALLEY_CHECK(!opt_.prefix.empty() && opt_.prefix.find('/') == std::string::npos,
               "Checkpointer: prefix '", opt_.prefix, "' must be a plain file name");
  // A file name holds 255 bytes: the prefix, "-<step, 12 to 19 digits>.safetensors" (up to 32)
  // and a save's ".tmp.<pid>.<n>" (up to 33). Past that the temporary's name would be cut short
  // and no longer be recognised below as one to clear.
  GALLEY_CHECK(opt_.prefix.size() <= kMaxPrefix, "Checkpointer: prefix of ", opt_.prefix.size(),
               " bytes is too long; at most ", kMaxPrefix,
               ", so that its files' temporary names fit in a file name's 255 bytes");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  GALLEY_CHECK(!ec && fs::is_directory(dir_), "Checkpointer: cannot create directory '", dir_,
               "': ", ec.message());
  // Temporary files of saves that were killed: never complete, never to be loaded. Another
  // process's save in progress (a trainer's, seen by an evaluator opening the same directory)
  // holds its temporary's lock and is left alone.
  for (const fs::path& p : entries_of(dir_)) {
    const std::string name = p.filename().string();
    if (name.compare(0, opt_.prefix.size() + 1, opt_.prefix + "-") == 0 &&
        name.find(".safetensors.tmp.") != std::string::npos && abandoned(p))
      fs::remove(p, ec);
  }
  if (opt_.preempt_signals.empty()) return;
  GALLEY_CHECK(!g_watching.exchange(true),
               "Checkpointer: another Checkpointer already watches preemption signals");
  g_preempt_signal.store(0);
  struct sigaction action;
  std::memset(&action, 0, sizeof action);
  action.sa_handler = on_preempt_signal;
  sigemptyset(&action.sa_mask);
  // Interrupted reads and waits carry on: the loop notices the signal at its next boundary.
  action.sa_flags = SA_RESTART;
  for (int sig : opt_.preempt_signals) {
    Watch w{sig, {}};
    if (sigaction(sig, &action, &w.previous) != 0) {
      const int err = errno;
      for (auto it = watches_.rbegin(); it != watches_.rend(); ++it)
        sigaction(it->signal, &it->previous, nullptr);
      watches_.clear();
      g_watching.store(false);
      GALLEY_CHECK(false, "Checkpointer: cannot watch ", signal_name(sig), ": ",
                   std::strerror(err));
    }
    watches_.push_back(w);
  }
}

std::vector<std::string> Checkpointer::list() const {
  std::vector<std::pair<int64_t, std::string>> found;
  const std::string head = opt_.prefix + "-", tail = ".safetensors";
  for (const fs::path& p : entries_of(dir_)) {
    const std::string name = p.filename().string();
    if (name.size() <= head.size() + tail.size() || name.compare(0, head.size(), head) != 0 ||
        name.compare(name.size() - tail.size(), tail.size(), tail) != 0)
      continue;
    const std::string num = name.substr(head.size(), name.size() - head.size() - tail.size());
    if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos) continue;
    int64_t step = 0;  // a number past int64 is no step this class wrote: not a checkpoint
    if (std::from_chars(num.data(), num.data() + num.size(), step).ec != std::errc()) continue;
    found.emplace_back(step, p.string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [step, path] : found) out.push_back(path);
  return out;
}

std::string Checkpointer::save(const TrainingState& state) {
  return write(state, all_generator_states(state));
}

std::string Checkpointer::write(const TrainingState& state,
                                const std::map<std::string, std::string>& generators) {
  // The step names the file and orders the checkpoints: a negative one would name a file that
  // list() and resume() never find.
  GALLEY_CHECK(state.step >= 0, "Checkpointer: step ", state.step,
               " is negative; a checkpoint's step counts the optimizer steps taken so far");
  char name[64];
  std::snprintf(name, sizeof name, "-%012lld.safetensors", static_cast<long long>(state.step));
  const std::string path = (fs::path(dir_) / (opt_.prefix + name)).string();
  // Every process holds the same model state: process 0 writes it, the others would only race
  // it.
  if (distributed::parallel_env().rank != 0) return path;
  save_with_generators(path, state, generators);
  // The oldest beyond keep_last go, but never the file just written (a directory holding a later
  // run's higher steps would otherwise lose each new checkpoint as it is made).
  auto all = list();
  size_t left = all.size();
  for (size_t i = 0; i < all.size() && left > size_t(opt_.keep_last); ++i)
    if (all[i] != path) std::remove(all[i].c_str()), --left;
  return path;
}

bool Checkpointer::resume(TrainingState& state) {
  auto all = list();
  std::string errors;
  std::vector<std::string> skipped;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    // Running out of memory is not a damaged file: falling back to an older one would lose the
    // steps since it. The caller gets the error as an OutOfMemoryError naming the file.
    const auto out_of_memory = [&] {
      detail::raise_nested(
          detail::str_cat("Checkpointer: resuming from '", *it, "' ran out of memory"));
    };
    // An unreadable newest file (a damaged disk, a foreign file) falls back to the one before.
    const auto fall_back = [&](const std::exception& e) {
      errors += std::string("\n  ") + e.what();
      skipped.push_back(*it + ": " + e.what());
    };
    try {
      load_checkpoint(*it, state);
      resumed_from_ = *it;
      skipped_ = std::move(skipped);
      return true;
    } catch (const OutOfMemoryError&) {
      out_of_memory();
    } catch (const Error& e) {
      fall_back(e);
    } catch (const std::bad_alloc& e) {  // one of no galley error yet (a size out of range is not)
      if (detail::host_out_of_memory()) out_of_memory();
      fall_back(e);
    }
  }
  GALLEY_CHECK(errors.empty(), "Checkpointer: no checkpoint in '", dir_,
               "' could be loaded:", errors);
  return false;
}

}  // namespace galley::io
