// DataParallel: persistent replica threads, bucketed all-reduce started from gradient hooks.
#include "galley/parallel/data_parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "galley/amp/autocast.h"
#include "galley/autograd.h"
#include "galley/distributed.h"
#include "galley/half.h"
#include "galley/ops.h"
#include "galley/profiler.h"
#include "kernels/convert.h"
#include "src/parallel/peer_failed.h"
#include "src/runtime/device_memory.h"
#include "src/thread_budget.h"

namespace galley {

namespace {

using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// The outcome of a posted task. A failure travels back as the exception the task threw, handed
// over under the mutex (the worker lets go of it before the caller looks), so its type and the
// causes nested in it reach the caller; catching it allocates nothing on the worker's thread.
class Pending {
 public:
  bool valid() const { return state_ != nullptr; }
  void wait() const {
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->cv.wait(lock, [&] { return state_->done; });
  }
  // Waits; the task's failure, null when it succeeded.
  std::exception_ptr error() const {
    wait();
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->error;
  }

 private:
  friend class Worker;
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
  };
  std::shared_ptr<State> state_;
};

// A thread that runs posted tasks in order.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Pending post(std::function<void()> fn) {
    Pending p;
    p.state_ = std::make_shared<Pending::State>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back({std::move(fn), p.state_});
    }
    cv_.notify_one();
    return p;
  }

 private:
  struct Task {
    std::function<void()> fn;
    std::shared_ptr<Pending::State> state;
  };
  void loop() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      std::exception_ptr error;
      try {
        task.fn();
      } catch (...) {
        error = std::current_exception();
      }
      // Refused launches are this thread's to report, after the task whatever its end (a stale
      // one would fail the next task): the task's own error first.
      try {
        detail::check_launch_errors();
      } catch (...) {
        if (!error) error = std::current_exception();
      }
      task.fn = nullptr;  // what the task captured is released here, before the caller resumes
      {
        std::lock_guard<std::mutex> lock(task.state->mu);
        task.state->done = true;
        task.state->error = std::move(error);
      }
      task.state->cv.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stop_ = false;
  std::thread thread_;
};

// Runs `work`, keeping its failure in `first` unless an earlier one is there: how a loop that
// must go on (every bucket completed, every collective run) notes what failed on the way.
template <typename F>
void keeping_first_failure(std::exception_ptr& first, F&& work) {
  try {
    work();
  } catch (...) {
    if (!first) first = std::current_exception();
  }
}

// Whether `error` is a collective's echo of another participant's failure.
bool is_echo(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const detail::PeerFailedError&) {
    return true;
  } catch (...) {
    return false;
  }
}

// Waits for every task; rethrows the first replica's own failure (an echo of another replica's
// only where there is nothing else) with the replica's device before its message, through
// rethrow_with_prefix: a galley error keeps its type and nested cause, a std::bad_alloc is an
// OutOfMemoryError.
void wait_all(const std::vector<Pending>& tasks, const std::vector<Device>& devices,
              const char* what) {
  std::exception_ptr first;
  size_t at = 0;
  bool first_is_echo = false;
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (!tasks[i].valid()) continue;
    std::exception_ptr error = tasks[i].error();
    if (!error || (first && !first_is_echo)) continue;
    const bool echo = is_echo(error);
    if (!first || !echo) {
      first = std::move(error);
      at = i;
      first_is_echo = echo;
    }
  }
  if (!first) return;
  try {
    std::rethrow_exception(first);
  } catch (...) {
    detail::rethrow_with_prefix(
        detail::str_cat("DataParallel ", what, " on replica ", at, " (", devices[at].str(), "): "));
  }
}

// The address of element `offset` of a flat buffer of any dtype.
char* element_at(const Tensor& buf, int64_t offset) {
  return static_cast<char*>(buf.raw_data()) + offset * int64_t(dtype_size(buf.dtype()));
}

// Writes `count` copies of `value` (0 or 1: exact in every floating dtype) from element `offset`
// of a flat buffer of buf's dtype, on its device (on a GPU: queued on the compute stream, in
// order with the gradients copied in).
void set_elements(const Tensor& buf, int64_t offset, int64_t count, float value) {
  if (count <= 0) return;
  dispatch_floating(buf.dtype(), "DataParallel bucket", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = reinterpret_cast<T*>(element_at(buf, offset));
    const T v(value);
    if (buf.device().is_cpu()) {
      std::fill_n(p, count, v);
      return;
    }
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    detail::fill_elements(buf.device(), p, size_t(count), bits, int(sizeof(T)));
  });
}

// `count` elements from src (dtype `from`) into dst (dtype `to`), both on `device` (on a GPU
// queued on its compute stream, as copy_bytes is); a plain copy when the dtypes agree.
void convert_on(Device device, const void* src, DType from, void* dst, DType to, int64_t count) {
  if (from == to)
    return detail::copy_bytes(dst, device, src, device, size_t(count) * dtype_size(from));
  if (device.is_cpu()) return kernels::cpu::convert(src, from, dst, to, count);
  detail::convert_elements(device, src, from, dst, to, size_t(count));
}

// A group of parameters of one dtype reduced together. Its flat buffer, of the wire dtype (the
// gradients' own, or DataParallelOptions::reduce_dtype for float32 ones), holds their gradients
// back to back, then one flag per parameter (1 where this replica produced a gradient), so that
// after the reduction every replica knows whether any replica had a gradient for it.
struct Bucket {
  DType dtype = DType::Float32;  // the gradients'
  DType wire = DType::Float32;   // the flat buffer's and the collectives'
  std::vector<size_t> params;    // indices into a replica's parameter list
  std::vector<int64_t> offsets;  // element offset of each in the flat buffer
  int64_t numel = 0;             // gradient elements; the flags follow them
  int64_t total() const { return numel + static_cast<int64_t>(params.size()); }
  int64_t bytes(int64_t elements) const { return elements * int64_t(dtype_size(wire)); }
};

}  // namespace

struct DataParallelBase::Impl {
  struct Replica {
    std::unique_ptr<nn::Layer> layer;
    Device device;
    std::vector<Tensor> params;
    std::vector<Tensor> buffers;  // the layer's named_buffers(), in order
    std::vector<Tensor> flat;     // one buffer per bucket, on the replica's device
    std::shared_ptr<parallel::Communicator> comm;
    std::unique_ptr<Worker> compute, comms;
    // The default generator of the replica's forwards (GeneratorScope): its own stream.
    Generator gen;
    // GPU replicas: a stream and an event to read the reduced presence flags back without
    // waiting for the compute stream (which runs the rest of backward meanwhile).
    void* side = nullptr;
    detail::Event side_done;
    // GPU replicas: per bucket, recorded on the compute stream once the bucket is filled; the
    // bucket's collective waits for it alone.
    std::vector<detail::Event> bucket_filled;
    ~Replica() { detail::destroy_stream(device, side); }
    // Per parameter, across backwards: whether its gradient holds a part not yet reduced (from
    // no_sync backwards, or the reduced sum replica 0 keeps for the next reduction), and the
    // gradient the last reduction wrote (expired once it is cleared).
    std::vector<char> unreduced;
    std::vector<std::weak_ptr<detail::TensorImpl>> reduced;
    // Per backward: which parameters have handed over their gradient, and bucket readiness.
    std::mutex mu;
    std::condition_variable cv;
    std::vector<char> param_ready;
    std::vector<int> pending;
    std::vector<char> bucket_ready;
    Clock::time_point bwd_begin, bwd_end;
    double allreduce_ms = 0, hidden_ms = 0;
  };

  std::vector<Device> devices;
  DataParallelOptions opt;
  std::shared_ptr<parallel::Communicator> procs;  // null for a single process
  std::vector<std::unique_ptr<Replica>> replicas;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;  // parameter index -> bucket
  std::atomic<bool> in_backward{false};
  bool sync = true;
  int threads_per_replica = 1;
  DataParallelStats stats;

  size_t n() const { return replicas.size(); }

  // Replica 0's buffers into every other replica (after process 0's into replica 0).
  void broadcast_buffers() {
    const std::vector<Tensor>& source = replicas[0]->buffers;
    if (source.empty()) return;
    NoGradGuard no_grad;
    if (procs)
      for (const Tensor& b : source) {
        Tensor h = b;
        procs->broadcast(h, 0);
      }
    for (size_t r = 1; r < n(); ++r)
      for (size_t k = 0; k < source.size(); ++k) replicas[r]->buffers[k].copy_(source[k]);
  }

  void build_buckets() {
    const auto& params = replicas[0]->params;
    bucket_of.assign(params.size(), 0);
    // A model smaller than a few buckets would otherwise fit in one, reduced only after the
    // whole backward: cap buckets at a quarter of the model (not below 64 KB) so the first
    // gradients are on the wire while the rest of backward runs.
    int64_t total = 0;
    for (auto& p : params) total += p.numel() * int64_t(dtype_size(p.dtype()));
    const int64_t cap = std::min<int64_t>(opt.bucket_bytes, std::max<int64_t>(total / 4, 64 << 10));
    // One open bucket per dtype: a parameter joins the open bucket of its dtype, which is closed
    // (and a new one opened) when it would pass the cap. Buckets are numbered as they open, so
    // the earliest gradients are still reduced first.
    std::vector<std::pair<DType, size_t>> open;  // dtype -> index of its open bucket
    for (size_t k = params.size(); k-- > 0;) {   // reverse registration order
      const DType dtype = params[k].dtype();
      GALLEY_CHECK(is_floating_point(dtype), "DataParallel: parameter ", k, " is ",
                   dtype_name(dtype), "; parameters must be float32, bfloat16 or float16");
      const int64_t numel = params[k].numel();
      auto it = std::find_if(open.begin(), open.end(), [&](auto& o) { return o.first == dtype; });
      if (it != open.end() && buckets[it->second].bytes(buckets[it->second].numel + numel) > cap) {
        open.erase(it);
        it = open.end();
      }
      if (it == open.end()) {
        buckets.push_back(Bucket{});
        buckets.back().dtype = dtype;
        buckets.back().wire = dtype == DType::Float32 ? opt.reduce_dtype : dtype;
        open.emplace_back(dtype, buckets.size() - 1);
        it = open.end() - 1;
      }
      Bucket& cur = buckets[it->second];
      cur.params.push_back(k);
      cur.offsets.push_back(cur.numel);
      cur.numel += numel;
      bucket_of[k] = it->second;
    }
    for (auto& r : replicas) {
      if (r->device.is_cuda()) detail::make_current(r->device);
      for (auto& b : buckets) {
        r->flat.push_back(zeros({b.total()}, b.wire, r->device));
        if (r->device.is_cuda()) r->bucket_filled.emplace_back(r->device);
      }
    }
  }

  // Buckets follow the parameters' dtypes: once the parameters have changed dtype (Layer::to on
  // every replica), the buckets are built again. Every replica must have made the same change.
  void refresh_buckets() {
    const auto& params = replicas[0]->params;
    bool stale = false;
    for (size_t k = 0; k < params.size() && !stale; ++k)
      stale = params[k].dtype() != buckets[bucket_of[k]].dtype;
    if (!stale) return;
    for (size_t r = 1; r < n(); ++r)
      for (size_t k = 0; k < params.size(); ++k)
        GALLEY_CHECK(replicas[r]->params[k].dtype() == params[k].dtype(),
                     "DataParallel: parameter ", k, " of replica ", r, " is ",
                     dtype_name(replicas[r]->params[k].dtype()), " but replica 0's is ",
                     dtype_name(params[k].dtype()),
                     "; convert every replica alike (DataParallel::to)");
    buckets.clear();
    bucket_of.clear();
    for (auto& r : replicas) {
      r->flat.clear();
      r->bucket_filled.clear();
    }
    build_buckets();
  }

  // Marks bucket b of a replica filled (the caller holds rep.mu and notifies). On a GPU it first
  // records the event that the bucket's collective waits for.
  static void mark_filled(Replica& rep, size_t b) {
    if (rep.device.is_cuda()) rep.bucket_filled[b].record(detail::compute_stream(rep.device));
    rep.bucket_ready[b] = 1;
  }

  // Copies replica r's gradient `grad` of parameter k into its slot of the bucket and sets its
  // presence flag. On a GPU both are queued on the compute stream; the communicator orders its
  // collective after that stream's work.
  void write_gradient(Replica& rep, size_t k, const Tensor& grad) {
    const size_t b = bucket_of[k];
    const Bucket& bucket = buckets[b];
    size_t slot = 0;
    while (bucket.params[slot] != k) ++slot;
    Tensor g = grad.contiguous();
    GALLEY_CHECK(g.dtype() == bucket.dtype, "DataParallel: the gradient of parameter ", k, " is ",
                 dtype_name(g.dtype()), " but the parameter is ", dtype_name(bucket.dtype));
    char* dst = element_at(rep.flat[b], bucket.offsets[slot]);
    if (bucket.wire == bucket.dtype) {
      detail::copy_bytes(dst, rep.device, g.raw_data(), g.device(),
                         size_t(bucket.bytes(g.numel())));
    } else {  // rounded into the 16-bit wire dtype on the replica's device
      if (g.device() != rep.device) g = g.to(rep.device);
      convert_on(rep.device, g.raw_data(), g.dtype(), dst, bucket.wire, g.numel());
    }
    set_elements(rep.flat[b], bucket.numel + slot, 1, 1.f);
  }

  // Called on replica r's compute thread when parameter k's gradient is final for this backward.
  // Outside a synced backward it only notes that the gradient now holds a part of this replica's
  // own that the next synced backward must reduce (no_sync accumulation).
  void on_gradient(size_t r, size_t k, const Tensor& grad) {
    if (!in_backward.load() || (n() == 1 && !procs)) return;
    Replica& rep = *replicas[r];
    if (!sync) {
      std::lock_guard<std::mutex> lock(rep.mu);
      rep.unreduced[k] = 1;
      return;
    }
    write_gradient(rep, k, grad);
    const size_t b = bucket_of[k];
    std::lock_guard<std::mutex> lock(rep.mu);
    if (rep.param_ready[k]) return;
    rep.param_ready[k] = 1;
    if (--rep.pending[b] == 0) {
      mark_filled(rep, b);
      rep.cv.notify_all();
    }
  }

  // After replica r's backward (or its failure): a parameter that got no gradient in it
  // contributes what its gradient holds unreduced (earlier no_sync backwards' parts, or on
  // replica 0 the already reduced part: see split_reduced), else zeros, so every bucket
  // completes and the collectives stay matched across replicas. It completes every bucket
  // whatever happens: a held gradient it cannot write contributes zeros, a bucket whose zeros or
  // event fail is still marked ready, and the first failure is returned (the other replicas'
  // collectives wait for this one's buckets, and its communication thread for the flags).
  std::exception_ptr finish_buckets(size_t r) {
    Replica& rep = *replicas[r];
    std::exception_ptr error;
    auto noting = [&](auto&& work) { keeping_first_failure(error, work); };
    std::lock_guard<std::mutex> lock(rep.mu);
    for (size_t b = 0; b < buckets.size(); ++b) {
      if (rep.bucket_ready[b]) continue;
      for (size_t s = 0; s < buckets[b].params.size(); ++s) {
        const size_t k = buckets[b].params[s];
        if (rep.param_ready[k]) continue;
        bool written = false;
        if (rep.unreduced[k] && rep.params[k].grad().defined())
          noting([&] {
            write_gradient(rep, k, rep.params[k].grad());
            written = true;
          });
        if (!written)  // (a GPU's fill is a launch, which can fail too)
          noting([&] {
            set_elements(rep.flat[b], buckets[b].offsets[s], rep.params[k].numel(), 0.f);
            set_elements(rep.flat[b], buckets[b].numel + s, 1, 0.f);
          });
        rep.param_ready[k] = 1;
      }
      rep.pending[b] = 0;
      // Whatever failed, the communication thread waits for this flag. (On a GPU whose event
      // record failed, its collective may then read the bucket before the fill lands: the
      // failure is reported, and the step's gradients are not used.)
      noting([&] { mark_filled(rep, b); });
      rep.bucket_ready[b] = 1;
    }
    rep.cv.notify_all();
    return error;
  }

  // Before a backward: a gradient that every replica still holds as the last reduction wrote it
  // (not cleared since: a second backward without clear_grad, or a second forward summed into
  // the same loss) is the same reduced sum on every replica and must count once, not once per
  // replica. Replica 0 keeps it, as a part of its own to reduce; the others start from nothing,
  // so the next reduction gives that sum plus the new parts, as one model would. (Averaging over
  // processes keeps such a part whole, so a single replica per process needs nothing.)
  void split_reduced() {
    if (n() == 1) return;
    const size_t count = replicas[0]->params.size();
    for (size_t k = 0; k < count; ++k) {
      bool shared = true;
      for (size_t r = 0; r < n() && shared; ++r) {
        const Tensor g = replicas[r]->params[k].grad();
        shared = g.defined() && g.impl_ptr() == replicas[r]->reduced[k].lock();
      }
      if (!shared) continue;
      replicas[0]->unreduced[k] = 1;
      for (size_t r = 1; r < n(); ++r) replicas[r]->params[k].set_grad(Tensor());
      for (auto& rep : replicas) rep->reduced[k].reset();
    }
  }

  // Replica r's communication thread: all-reduce buckets in index order (the same order on
  // every replica) as they become ready, and write the sums back into the gradients.
  //
  // Every bucket's collectives run whatever fails on this replica around them: the peers'
  // collectives wait for this replica's, so a failure of its own work (a host or device
  // allocation, the flags' copy, the profiler's record) is kept, its remaining buckets still
  // reduced, and the failure thrown at the end. A collective's own failure ends the loop at once
  // (the group is unusable then, and the communicator tells every member), with this replica's
  // earlier failure, where there was one, as the error: the cause of what followed.
  void reduce_buckets(size_t r) {
    Replica& rep = *replicas[r];
    const Device dev = rep.device;
    std::exception_ptr failed;  // this replica's first failure outside the collectives
    auto local = [&](auto&& work) {
      if (!failed) keeping_first_failure(failed, work);  // (no write-back after a failure)
    };
    local([&] {
      if (dev.is_cuda()) detail::make_current(dev);
    });
    std::vector<char> flag_bytes;
    std::vector<float> flags;
    for (size_t b = 0; b < buckets.size(); ++b) {
      {
        std::unique_lock<std::mutex> lock(rep.mu);
        rep.cv.wait(lock, [&] { return rep.bucket_ready[b] != 0; });
      }
      const auto t0 = Clock::now();
      const Bucket& bucket = buckets[b];
      const DType wire = bucket.wire;
      void* data = rep.flat[b].raw_data();
      const int64_t count = bucket.total();
      std::optional<profiler::RecordScope> prof;
      local([&] {
        prof.emplace("all_reduce_bucket", std::initializer_list<const Tensor*>{},
                     profiler::EventKind::AllReduce, nullptr, bucket.bytes(count));
      });
      // Sum over this process's replicas, average over processes (replica 0 speaks for the
      // process), then hand the result back to the local replicas.
      // The first collective on the bucket waits for the bucket's own event (one replica per
      // process: the process-level one).
      try {
        if (dev.is_cuda())
          (n() > 1 ? rep.comm : procs)->wait_for_event(rep.bucket_filled[b].handle());
        rep.comm->all_reduce(data, count, wire, parallel::ReduceOp::Sum);
        if (procs) {
          if (r == 0) procs->all_reduce(data, count, wire, parallel::ReduceOp::Avg);
          rep.comm->broadcast(data, count, wire, 0);
        }
      } catch (...) {
        if (failed) std::rethrow_exception(failed);  // the cause, before what followed from it
        throw;
      }
      local([&] { read_flags(rep, bucket, b, flag_bytes, flags); });
      const auto t1 = Clock::now();
      local([&] { write_back(rep, bucket, b, flags); });
      rep.allreduce_ms += ms_between(t0, t1);
      std::lock_guard<std::mutex> lock(rep.mu);
      // The part of [t0, t1] before backward ended ran in its shadow. bwd_end is set when
      // backward finishes, which happens-before the wait above returns for later buckets.
      if (rep.bwd_end > t0) rep.hidden_ms += ms_between(t0, std::min(t1, rep.bwd_end));
    }
    if (failed) std::rethrow_exception(failed);
  }

  // Bucket b's presence flags (which parameters some replica had a gradient for), read back from
  // replica rep's reduced bucket as floats.
  void read_flags(Replica& rep, const Bucket& bucket, size_t b, std::vector<char>& flag_bytes,
                  std::vector<float>& flags) {
    const Device dev = rep.device;
    const size_t nflags = bucket.params.size();
    const char* flag_data = element_at(rep.flat[b], bucket.numel);
    flag_bytes.resize(size_t(bucket.bytes(int64_t(nflags))));
    if (dev.is_cpu()) {
      std::memcpy(flag_bytes.data(), flag_data, flag_bytes.size());
    } else {
      if (!rep.side) {
        rep.side = detail::create_stream(dev);
        rep.side_done = detail::Event(dev);
      }
      detail::copy_bytes_async(flag_bytes.data(), Device::cpu(), flag_data, dev, flag_bytes.size(),
                               rep.side);
      rep.side_done.record(rep.side);
      rep.side_done.synchronize();
    }
    flags.resize(nflags);
    dispatch_floating(bucket.wire, "DataParallel bucket", [&](auto tag) {
      using T = typename decltype(tag)::type;
      for (size_t s = 0; s < nflags; ++s) {
        T v;
        std::memcpy(&v, flag_bytes.data() + s * sizeof(T), sizeof(T));
        flags[s] = float(v);
      }
    });
  }

  // Bucket b's reduced sums written into replica rep's gradients, where `flags` (read_flags) say
  // some replica had one.
  void write_back(Replica& rep, const Bucket& bucket, size_t b, const std::vector<float>& flags) {
    const Device dev = rep.device;
    const DType dtype = bucket.dtype, wire = bucket.wire;
    const size_t nflags = bucket.params.size();
    for (size_t s = 0; s < nflags; ++s) {
      if (flags[s] == 0.f) continue;  // no replica had a gradient
      Tensor& p = rep.params[bucket.params[s]];
      Tensor g = p.grad();
      if (!g.defined()) {  // this replica had no samples: it takes the others' gradient
        if (dev.is_cuda()) detail::make_current(dev);
        g = Tensor::empty(p.shape(), dtype, dev);
        p.set_grad(g);
      }
      g.bump_version();  // the all-reduced sum written over it
      convert_on(dev, element_at(rep.flat[b], bucket.offsets[s]), wire, g.raw_data(), dtype,
                 g.numel());
      rep.reduced[bucket.params[s]] = g.impl_ptr();
    }
  }

  void backward(const std::vector<Tensor>& outs, const std::vector<int64_t>& starts,
                const Tensor& grad) {
    const bool reduce = sync && (n() > 1 || procs);
    if (reduce) refresh_buckets();
    split_reduced();
    for (auto& rep : replicas) {
      std::lock_guard<std::mutex> lock(rep->mu);
      rep->param_ready.assign(rep->params.size(), 0);
      rep->bucket_ready.assign(buckets.size(), 0);
      rep->pending.clear();
      for (auto& b : buckets) rep->pending.push_back(static_cast<int>(b.params.size()));
      rep->bwd_end = Clock::time_point::max();
      rep->allreduce_ms = rep->hidden_ms = 0;
    }
    // Each replica's rows of the output gradient, made before any task is posted: a failure
    // here leaves no collective waiting.
    Tensor cg = grad.contiguous();
    std::vector<Tensor> grads(n());
    for (size_t r = 0; r < n(); ++r) {
      const int64_t rows = starts[r + 1] - starts[r];
      if (rows == 0) continue;
      Shape s = cg.shape();
      s[0] = rows;
      const int64_t row = cg.numel() / std::max<int64_t>(cg.size(0), 1);
      if (replicas[r]->device.is_cuda()) detail::make_current(replicas[r]->device);
      const int64_t elem = int64_t(dtype_size(cg.dtype()));
      grads[r] = Tensor::empty(s, cg.dtype(), replicas[r]->device);
      detail::copy_bytes(grads[r].raw_data(), grads[r].device(),
                         static_cast<const char*>(cg.raw_data()) + starts[r] * row * elem,
                         cg.device(), size_t(grads[r].numel() * elem));
    }
    in_backward = true;
    std::vector<Pending> comm_tasks(n()), compute_tasks(n());
    if (reduce)
      for (size_t r = 0; r < n(); ++r)
        comm_tasks[r] = replicas[r]->comms->post([this, r] { reduce_buckets(r); });
    for (size_t r = 0; r < n(); ++r)
      compute_tasks[r] =
          replicas[r]->compute->post([this, r, reduce, out = outs[r], g_r = grads[r]] {
            Replica& rep = *replicas[r];
            try {
              detail::ThreadBudget budget(threads_per_replica);
              if (rep.device.is_cuda()) detail::make_current(rep.device);
              {
                std::lock_guard<std::mutex> lock(rep.mu);
                rep.bwd_begin = Clock::now();
              }
              if (out.defined() && out.requires_grad()) out.backward(g_r);
            } catch (...) {
              if (reduce) finish_buckets(r);  // the backward's own error is the one to report
              throw;
            }
            {
              std::lock_guard<std::mutex> lock(rep.mu);
              rep.bwd_end = Clock::now();
            }
            if (reduce)
              if (std::exception_ptr error = finish_buckets(r)) std::rethrow_exception(error);
          });
    const auto t0 = Clock::now();
    try {
      wait_all(compute_tasks, devices, "backward");
    } catch (...) {
      for (auto& f : comm_tasks)
        if (f.valid()) f.wait();
      in_backward = false;
      throw;
    }
    try {
      wait_all(comm_tasks, devices, "all-reduce");
    } catch (...) {
      in_backward = false;
      throw;
    }
    in_backward = false;
    if (reduce)  // every part held so far is in the reduced gradients now
      for (auto& rep : replicas) std::fill(rep->unreduced.begin(), rep->unreduced.end(), 0);
    stats.backward_ms = ms_between(t0, Clock::now());
    stats.allreduce_ms = stats.hidden_ms = 0;
    for (auto& rep : replicas) {
      stats.allreduce_ms += rep->allreduce_ms;
      stats.hidden_ms += rep->hidden_ms;
    }
    stats.buckets = reduce ? static_cast<int64_t>(buckets.size()) : 0;
  }
};

namespace {
// The replicas' parts as one tensor on `device`: part r (of rows [starts[r], starts[r + 1]), the
// rest of its shape the first defined part's) in its rows, in the first defined part's dtype;
// zeros where a part with rows is undefined (an input gradient a replica's graph did not reach);
// undefined where every part is.
Tensor gather_rows(const std::vector<Tensor>& parts, const std::vector<int64_t>& starts,
                   Device device) {
  const Tensor* first = nullptr;
  bool gaps = false;
  for (size_t r = 0; r < parts.size(); ++r) {
    if (parts[r].defined())
      first = first ? first : &parts[r];
    else
      gaps = gaps || starts[r + 1] > starts[r];
  }
  if (!first) return Tensor();
  Shape shape = first->shape();
  shape[0] = starts.back();
  const DType dtype = first->dtype();
  Tensor out = gaps ? zeros(shape, dtype, device) : Tensor::empty(shape, dtype, device);
  const int64_t row = shape_numel(Shape(shape.begin() + 1, shape.end()));
  const int64_t elem = int64_t(dtype_size(dtype));
  for (size_t r = 0; r < parts.size(); ++r) {
    if (!parts[r].defined()) continue;
    const Tensor part = parts[r].to(dtype).contiguous();
    detail::copy_bytes(static_cast<char*>(out.raw_data()) + starts[r] * row * elem, device,
                       part.raw_data(), part.device(), size_t(part.numel() * elem));
  }
  return out;
}
}  // namespace

DataParallelBase::DataParallelBase(std::vector<std::unique_ptr<nn::Layer>> layers,
                                   std::vector<Device> devices, DataParallelOptions options)
    : impl_(std::make_shared<Impl>()) {
  GALLEY_CHECK(!devices.empty(), "DataParallel: the device list is empty");
  GALLEY_CHECK(options.bucket_bytes > 0, "DataParallel: bucket_bytes ", options.bucket_bytes,
               " must be positive");
  GALLEY_CHECK(is_floating_point(options.reduce_dtype), "DataParallel: reduce_dtype ",
               dtype_name(options.reduce_dtype), " must be float32, bfloat16 or float16");
  const bool gpus = devices[0].is_cuda();
  for (const Device& d : devices)
    GALLEY_CHECK(d.is_cuda() == gpus, "DataParallel: ", d.str(), " and ", devices[0].str(),
                 " are different kinds of device; replicas go either on GPUs or on the CPU");
  for (size_t i = 0; i < devices.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      GALLEY_CHECK(devices[i] != devices[j], "DataParallel: device ", devices[i].str(),
                   " is listed twice");
  Impl& m = *impl_;
  m.devices = devices;
  m.opt = options;
  m.procs = options.process_group ? options.process_group : distributed::world();
  if (m.procs && m.procs->size() == 1) m.procs = nullptr;
  // Between processes, GPU replicas 0 talk over NCCL; its id travels over the process group.
  if (m.procs && gpus && m.procs->kind() != "nccl")
    m.procs = parallel::make_nccl_communicator(devices[0], *m.procs,
                                               {.timeout_seconds = options.timeout_seconds});
  int cpu_replicas = 0;
  for (auto& d : devices) cpu_replicas += d.is_cpu();
  m.threads_per_replica = std::max(1, num_threads() / std::max(1, cpu_replicas));
  const parallel::CommOptions comm_options{.timeout_seconds = options.timeout_seconds};
  // Replicas on several GPUs reduce over NCCL; CPU replicas (and a single GPU, which has nothing
  // to reduce with) use the shared-memory communicator.
  auto comms = gpus && devices.size() > 1 ? parallel::make_nccl_communicators(devices, comm_options)
                                          : parallel::make_thread_communicators(
                                                static_cast<int>(devices.size()), comm_options);
  for (size_t i = 0; i < devices.size(); ++i) {
    auto rep = std::make_unique<Impl::Replica>();
    rep->layer = std::move(layers[i]);
    rep->device = devices[i];
    rep->layer->to(devices[i]);
    rep->params = rep->layer->parameters();
    rep->unreduced.assign(rep->params.size(), 0);
    rep->reduced.resize(rep->params.size());
    for (auto& [name, b] : rep->layer->named_buffers()) rep->buffers.push_back(b);
    rep->comm = comms[i];
    rep->compute = std::make_unique<Worker>();
    rep->comms = std::make_unique<Worker>();
    m.replicas.push_back(std::move(rep));
  }
  // Replicas start identical: every one takes replica 0's parameters and buffers, and
  // replica 0 takes process 0's. Between GPUs copy_ runs on the destination's compute stream
  // after the source's queued work, so each copy follows both replicas' own uploads above.
  const auto state = m.replicas[0]->layer->named_state();
  if (m.procs)
    for (auto& [name, t] : state) {
      Tensor h = t;
      m.procs->broadcast(h, 0);
    }
  for (size_t i = 1; i < m.n(); ++i) {
    auto mine = m.replicas[i]->layer->named_state();
    GALLEY_CHECK(mine.size() == state.size(), "DataParallel: replica ", i,
                 " has a different parameter list from replica 0");
    NoGradGuard no_grad;
    for (size_t k = 0; k < state.size(); ++k) {
      GALLEY_CHECK(
          mine[k].first == state[k].first && mine[k].second.shape() == state[k].second.shape(),
          "DataParallel: replica ", i, " parameter '", mine[k].first,
          "' does not match replica 0's '", state[k].first, "'");
      mine[k].second.copy_(state[k].second);
    }
  }
  // Every replica of every process draws its own random numbers (dropout masks): its layers'
  // generators, and the default generator of its forwards, which starts from one draw of the
  // caller's (so manual_seed before the construction fixes every replica's stream).
  const uint64_t rank = m.procs ? static_cast<uint64_t>(m.procs->rank()) : 0;
  const uint64_t base = next_seed(default_generator());
  for (size_t i = 0; i < m.n(); ++i) {
    m.replicas[i]->layer->set_random_stream((rank << 32) + i);
    m.replicas[i]->gen.manual_seed(stream_seed(base, (rank << 32) + i + 1));
  }
  m.build_buckets();
  for (size_t r = 0; r < m.n(); ++r)
    for (size_t k = 0; k < m.replicas[r]->params.size(); ++k)
      m.replicas[r]->params[k].register_grad_hook(
          [impl = std::weak_ptr<Impl>(impl_), r, k](const Tensor& g) {
            if (auto m = impl.lock()) m->on_gradient(r, k, g);
          });
}

DataParallelBase::~DataParallelBase() = default;

std::vector<std::pair<std::string, Generator*>> DataParallelBase::named_generators() const {
  std::vector<std::pair<std::string, Generator*>> out;
  for (size_t i = 0; i < impl_->n(); ++i) {
    const std::string replica = detail::str_cat("replica", i);
    out.emplace_back(replica, &impl_->replicas[i]->gen);
    for (auto& [name, gen] : impl_->replicas[i]->layer->named_generators())
      out.emplace_back(replica + "." + name, gen);
  }
  return out;
}

nn::Layer& DataParallelBase::replica_layer(size_t i) const {
  GALLEY_CHECK(i < impl_->n(), "DataParallel: replica ", i, " out of range for ", impl_->n());
  return *impl_->replicas[i]->layer;
}

const std::vector<Device>& DataParallelBase::devices() const {
  return impl_->devices;
}

Tensor DataParallelBase::forward(const Tensor& x) {
  Impl& m = *impl_;
  GALLEY_CHECK(x.defined() && x.dim() >= 1, "DataParallel: input must have a batch dimension");
  const auto t0 = Clock::now();
  const int64_t batch = x.size(0), n = static_cast<int64_t>(m.n());
  std::vector<int64_t> starts{0};
  for (int64_t r = 0; r < n; ++r) starts.push_back(starts.back() + batch / n + (r < batch % n));
  const bool grad_mode = grad_enabled();
  // The replicas' forwards run under the caller's autocast setting (their threads have their own).
  const bool autocast = amp::is_autocast_enabled();
  const DType autocast_dtype = amp::autocast_dtype();
  if (m.opt.broadcast_buffers) m.broadcast_buffers();
  Tensor cx = x.detach().contiguous();
  const int64_t row = batch > 0 ? cx.numel() / batch : 0;
  // An input that takes a gradient gets it, as PyTorch's scatter passes it back: each replica's
  // rows are a leaf of its graph, whose gradients the backward gathers into x's.
  const bool input_grad = grad_mode && x.requires_grad();
  std::vector<Tensor> outs(m.n()), xs(m.n());
  std::vector<Pending> tasks(m.n());
  for (size_t r = 0; r < m.n(); ++r) {
    const int64_t rows = starts[r + 1] - starts[r];
    if (rows == 0) continue;
    Shape s = cx.shape();
    s[0] = rows;
    Tensor x_r = Tensor::empty(s, cx.dtype(), m.replicas[r]->device);
    detail::copy_bytes(
        x_r.raw_data(), x_r.device(),
        static_cast<const char*>(cx.raw_data()) + starts[r] * row * dtype_size(cx.dtype()),
        cx.device(), x_r.numel() * dtype_size(cx.dtype()));
    if (input_grad) x_r.set_requires_grad(true);
    xs[r] = x_r;
    tasks[r] =
        m.replicas[r]->compute->post([&m, &outs, r, x_r, grad_mode, autocast, autocast_dtype] {
          detail::ThreadBudget budget(m.threads_per_replica);
          amp::Autocast autocast_scope(autocast_dtype, autocast);
          GeneratorScope generator_scope(m.replicas[r]->gen);
          if (m.replicas[r]->device.is_cuda()) detail::make_current(m.replicas[r]->device);
          std::unique_ptr<NoGradGuard> no_grad;
          if (!grad_mode) no_grad = std::make_unique<NoGradGuard>();
          outs[r] = m.replicas[r]->layer->forward(x_r);
        });
  }
  wait_all(tasks, m.devices, "forward");
  // Gather the outputs (not gradients) on the first device: the loss sees the whole batch.
  Tensor first;
  for (auto& o : outs)
    if (o.defined()) {
      first = o;
      break;
    }
  GALLEY_CHECK(first.defined(), "DataParallel: the batch is empty");
  // Every output keeps its replica's rows as its first dimension, and the rest of its shape is
  // the first output's (checked before any size is divided by).
  const Shape row_shape =
      first.dim() >= 1 ? Shape(first.shape().begin() + 1, first.shape().end()) : Shape();
  for (size_t r = 0; r < m.n(); ++r)
    GALLEY_CHECK(!outs[r].defined() ||
                     (outs[r].dim() >= 1 && outs[r].size(0) == starts[r + 1] - starts[r] &&
                      Shape(outs[r].shape().begin() + 1, outs[r].shape().end()) == row_shape),
                 "DataParallel: replica ", r, " returned ",
                 outs[r].defined() ? shape_str(outs[r].shape()) : "nothing", " for ",
                 starts[r + 1] - starts[r], " rows",
                 "; outputs must keep the batch dimension and agree in shape");
  Tensor out = gather_rows(outs, starts, m.devices[0]);
  m.stats.forward_ms = ms_between(t0, Clock::now());
  bool any_grad = false;
  for (auto& o : outs) any_grad = any_grad || (o.defined() && o.requires_grad());
  if (!grad_mode || !any_grad) return out;
  // The gathered output's node owns the replica graphs; its backward drives them all, and gathers
  // the input's gradient from the replicas' rows where the input takes one.
  auto node = std::make_shared<autograd::Node>();
  node->name = "data_parallel";
  if (input_grad) node->inputs = {x};
  node->nested = outs;  // the replica graphs: their saved tensors are checked with the caller's
  node->backward = [impl = std::weak_ptr<Impl>(impl_), outs, starts, xs, input_grad,
                    x_device = x.device()](const Tensor& g, std::vector<Tensor>& gi) {
    std::shared_ptr<Impl> m = impl.lock();
    GALLEY_CHECK(m,
                 "DataParallel: backward through a forward of a DataParallel that has been "
                 "destroyed; keep it alive until the backward has run");
    m->backward(outs, starts, g);
    if (!input_grad) return;
    std::vector<Tensor> grads(xs.size());
    for (size_t r = 0; r < xs.size(); ++r)
      if (xs[r].defined()) grads[r] = xs[r].grad();
    gi[0] = gather_rows(grads, starts, x_device);
  };
  out.impl()->grad_fn = std::move(node);
  return out;
}

std::vector<Tensor> DataParallelBase::parameters() const {
  std::vector<Tensor> out;
  for (auto& rep : impl_->replicas) out.insert(out.end(), rep->params.begin(), rep->params.end());
  return out;
}

std::vector<nn::NamedTensor> DataParallelBase::named_parameters() const {
  return impl_->replicas[0]->layer->named_parameters();
}

std::map<std::string, Tensor> DataParallelBase::state_dict() const {
  return impl_->replicas[0]->layer->state_dict();
}

nn::Layer::LoadResult DataParallelBase::load_state_dict(const std::map<std::string, Tensor>& state,
                                                        bool strict) {
  nn::Layer::LoadResult result;
  for (auto& rep : impl_->replicas) result = rep->layer->load_state_dict(state, strict);
  return result;
}

void DataParallelBase::to(DType dtype) {
  for (auto& rep : impl_->replicas) {
    if (rep->device.is_cuda()) detail::make_current(rep->device);
    // A reduced gradient converted with its parameter (a new tensor) stays the reduced one.
    std::vector<char> reduced(rep->params.size());
    for (size_t k = 0; k < rep->params.size(); ++k) {
      const Tensor g = rep->params[k].grad();
      reduced[k] = g.defined() && g.impl_ptr() == rep->reduced[k].lock();
    }
    rep->layer->to(dtype);
    for (size_t k = 0; k < rep->params.size(); ++k)
      if (reduced[k]) rep->reduced[k] = rep->params[k].grad().impl_ptr();
  }
  impl_->refresh_buckets();
}

void DataParallelBase::train(bool on) {
  for (auto& rep : impl_->replicas) rep->layer->train(on);
}

DataParallelStats DataParallelBase::last_stats() const {
  return impl_->stats;
}

DataParallelBase::NoSync::NoSync(DataParallelBase& owner)
    : owner_(owner), prev_(owner.impl_->sync) {
  owner.impl_->sync = false;
}
DataParallelBase::NoSync::~NoSync() {
  owner_.impl_->sync = prev_;
}

}  // namespace galley
