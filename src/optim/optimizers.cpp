// Optimizer base, Adam/AdamW, SGD and the learning-rate schedulers.
#include <algorithm>
#include <cmath>
#include <string>

#include "galley/half.h"
#include "galley/optim/adam.h"
#include "galley/optim/lr_scheduler.h"
#include "galley/optim/sgd.h"
#include "kernels/optimizer_update.h"
#include "src/ops/dispatch.h"
#include "src/runtime/device_memory.h"

namespace galley::optim {

namespace cpu = kernels::cpu;

// ---------------------------------------------------------------------------------------------
// Optimizer

namespace {
// `owner`'s option `option` must be finite and not negative (finite and positive): a NaN or an
// infinity in an option would reach every parameter at the first step.
void check_non_negative(const std::string& owner, const char* option, double value) {
  GALLEY_CHECK(std::isfinite(value) && value >= 0, owner, ": ", option, " ", value,
               " must be finite and not negative");
}
void check_positive(const std::string& owner, const char* option, double value) {
  GALLEY_CHECK(std::isfinite(value) && value > 0, owner, ": ", option, " ", value,
               " must be finite and positive");
}
}  // namespace

Optimizer::Optimizer(std::vector<Tensor> params, double learning_rate)
    : params_(std::move(params)), lr_(learning_rate) {
  GALLEY_CHECK(!params_.empty(), "optimizer: got an empty parameter list");
  check_non_negative("optimizer", "learning_rate", learning_rate);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    GALLEY_CHECK(p.defined() && p.is_leaf() && is_floating_point(p.dtype()),
                 "optimizer: parameter ", i,
                 " must be a defined float32, bfloat16 or float16 leaf tensor",
                 p.defined() ? detail::str_cat(" (it is ", dtype_name(p.dtype()),
                                               p.is_leaf() ? ")" : ", not a leaf)")
                             : std::string());
    for (size_t j = 0; j < i; ++j)
      GALLEY_CHECK(!params_[j].is_same(p), "optimizer: parameter ", i, " appears twice (also at ",
                   j, ")");
  }
}

void Optimizer::clear_grad() {
  for (auto& p : params_) p.set_grad(Tensor());
}

void Optimizer::set_learning_rate(double lr) {
  check_non_negative(name(), "learning rate", lr);
  lr_ = lr;
}

void Optimizer::for_each_gradient(const std::function<void(size_t, Tensor&)>& prepare,
                                  const std::function<void(size_t, Tensor&, const Tensor&)>& update,
                                  const std::function<void()>& launch) {
  NoGradGuard no_grad;
  // Everything that can fail comes first (checks, contiguous copies, new state): a bad gradient
  // or a failed allocation fails the step before any parameter or step count has changed.
  std::vector<Tensor> grads(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    GALLEY_CHECK(g.shape() == p.shape(), "optimizer: gradient of parameter ", i, " has shape ",
                 shape_str(g.shape()), ", the parameter ", shape_str(p.shape()));
    GALLEY_CHECK(g.dtype() == p.dtype(), "optimizer: gradient of parameter ", i, " is ",
                 dtype_name(g.dtype()), ", the parameter ", dtype_name(p.dtype()),
                 "; they must have the same dtype");
    GALLEY_CHECK(g.device().same_memory(p.device()), "optimizer: gradient of parameter ", i,
                 " is on ", g.device().str(), ", the parameter on ", p.device().str(),
                 "; they must be on the same device");
    grads[i] = g;
  }
  std::vector<Tensor> dense(params_.size());  // strided parameters' copies, updated in place
  for (size_t i = 0; i < params_.size(); ++i)
    if (grads[i].defined()) {
      grads[i] = grads[i].contiguous();
      if (!params_[i].is_contiguous()) dense[i] = params_[i].contiguous();
      prepare(i, params_[i]);  // state lives on the parameter's device
    }
  for (size_t i = 0; i < params_.size(); ++i)
    if (grads[i].defined()) {
      // A graph that saved the old values refuses its backward, and autocast's converted copy of
      // the parameter is stale.
      params_[i].bump_version();
      update(i, dense[i].defined() ? dense[i] : params_[i], grads[i]);
    }
  if (launch) launch();
  for (size_t i = 0; i < params_.size(); ++i)
    if (dense[i].defined()) params_[i].copy_(dense[i]);
}

size_t Optimizer::index_of(const Tensor& param) const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].is_same(param)) return i;
  GALLEY_CHECK(false, "optimizer: the tensor of shape ", shape_str(param.shape()),
               " is not one of its parameters");
  return 0;
}

namespace {
std::string key(size_t i, const char* what) {
  return detail::str_cat("state.", i, ".", what);
}

// The saved tensor for parameter i, checked against the parameter's shape. The state is
// float32 whatever the parameter's dtype; a saved 16-bit state is widened to it.
Tensor saved(const StateDict& st, size_t i, const char* what, const Tensor& param,
             const std::string& owner) {
  auto it = st.tensors.find(key(i, what));
  GALLEY_CHECK(it != st.tensors.end(), owner, ": saved state lacks '", key(i, what), "'");
  GALLEY_CHECK(it->second.shape() == param.shape() && is_floating_point(it->second.dtype()), owner,
               ": saved '", key(i, what), "' is ", shape_str(it->second.shape()), " ",
               dtype_name(it->second.dtype()), " but parameter ", i, " is ",
               shape_str(param.shape()), " (state is float32, or a 16-bit float widened to it)");
  return it->second.dtype() == DType::Float32 ? it->second : it->second.to(DType::Float32);
}

// State made inside a CUDA graph capture would be made again at every replay (moments reset to
// zero): the step must have run eagerly once before it is captured.
void check_not_capturing(const Tensor& p, const std::string& owner) {
  GALLEY_CHECK(!detail::capturing(p.device()), owner, ": the optimizer state of a parameter on ",
               p.device().str(),
               " would be created inside a CUDA graph capture; run the step eagerly once before "
               "capturing it");
}

// The batch of GPU tensors for `device`, added when new.
using GpuBatches = std::vector<std::pair<Device, std::vector<kernels::OptimizerTensor>>>;
std::vector<kernels::OptimizerTensor>& group_of(GpuBatches& batches, Device device) {
  for (auto& [d, tensors] : batches)
    if (d == device) return tensors;
  batches.emplace_back(device, std::vector<kernels::OptimizerTensor>{});
  return batches.back().second;
}

Tensor copy_on(const Tensor& src, const Tensor& like) {
  Tensor t = Tensor::empty(like.shape(), DType::Float32, like.device());
  t.copy_(src);
  return t;
}
}  // namespace

StateDict Optimizer::state_dict() const {
  StateDict st;
  st.set("lr", lr_);
  st.set("num_params", static_cast<int64_t>(params_.size()));
  return st;
}

void Optimizer::check_num_params(const StateDict& st) const {
  const int64_t n = st.get_int("num_params", name());
  GALLEY_CHECK(n == static_cast<int64_t>(params_.size()), name(), ": saved state is for ", n,
               " parameters, this optimizer has ", params_.size());
}

void Optimizer::load_state_dict(const StateDict& st) {
  check_num_params(st);
  set_learning_rate(st.get_double("lr", name()));
}

// ---------------------------------------------------------------------------------------------
// Adam / AdamW

Adam::Adam(std::vector<Tensor> params, AdamOptions options, bool decoupled)
    : Optimizer(std::move(params), options.learning_rate), decoupled_(decoupled), opt_(options) {
  opt_.weight_decay = options.weight_decay.value_or(decoupled ? 1e-2 : 0.0);
  const char* who = decoupled ? "AdamW" : "Adam";
  GALLEY_CHECK(opt_.beta1 >= 0 && opt_.beta1 < 1 && opt_.beta2 >= 0 && opt_.beta2 < 1, who,
               ": betas (", opt_.beta1, ", ", opt_.beta2, ") must be in [0, 1)");
  check_non_negative(who, "eps", opt_.eps);
  check_non_negative(who, "weight_decay", *opt_.weight_decay);
  state_.resize(params_.size());
}

void Adam::step() {
  kernels::AdamStep s{};
  s.lr = static_cast<float>(lr_);
  s.beta1 = static_cast<float>(opt_.beta1);
  s.beta2 = static_cast<float>(opt_.beta2);
  s.one_minus_beta1 = static_cast<float>(1.0 - opt_.beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - opt_.beta2);
  s.shrink = static_cast<float>(1.0 - lr_ * *opt_.weight_decay);
  s.eps = static_cast<float>(opt_.eps);
  s.weight_decay = static_cast<float>(*opt_.weight_decay);
  s.decoupled = decoupled_;
  s.amsgrad = opt_.amsgrad;
  s.maximize = opt_.maximize;
  // GPU parameters are updated together, a few launches per device, once all are gathered.
  GpuBatches gpu;
  std::vector<Tensor> keep;  // gradients made contiguous for the batched launches
  // New state is zeros (and the step count's copy on a GPU the count itself): made and left
  // behind by a step that fails later, it is what the next step would make.
  auto prepare = [&](size_t i, Tensor& p) {
    AdamState& st = state_[i];
    if (st.step == 0 && !st.exp_avg.defined()) {
      check_not_capturing(p, name());
      st.exp_avg = zeros(p.shape(), DType::Float32, p.device());
      st.exp_avg_sq = zeros(p.shape(), DType::Float32, p.device());
      if (opt_.amsgrad) st.max_exp_avg_sq = zeros(p.shape(), DType::Float32, p.device());
    }
    if (p.device().is_cuda() && !st.device_step.defined()) {
      check_not_capturing(p, name());
      st.device_step = Tensor::from_vector(std::vector<int64_t>{st.step}, {1}, p.device());
    }
  };
  auto update = [&](size_t i, Tensor& p, const Tensor& g) {
    AdamState& st = state_[i];
    if (p.device().is_cuda()) {
      ++st.step;
      keep.push_back(g);
      kernels::OptimizerTensor t{};
      t.p = p.raw_data();
      t.g = g.raw_data();
      t.dtype = p.dtype();
      t.m = st.exp_avg.data_ptr<float>();
      t.v = st.exp_avg_sq.data_ptr<float>();
      t.vmax = opt_.amsgrad ? st.max_exp_avg_sq.data_ptr<float>() : nullptr;
      t.step = st.device_step.data_ptr<int64_t>();
      t.n = p.numel();
      group_of(gpu, p.device()).push_back(t);
      return;
    }
    ++st.step;
    kernels::AdamStep h = s;
    h.step_size = static_cast<float>(lr_ / (1.0 - std::pow(opt_.beta1, double(st.step))));
    h.bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(opt_.beta2, double(st.step))));
    kernels::cpu::adam_update(h, p.dtype(), p.numel(), p.raw_data(), g.raw_data(),
                              st.exp_avg.data_ptr<float>(), st.exp_avg_sq.data_ptr<float>(),
                              opt_.amsgrad ? st.max_exp_avg_sq.data_ptr<float>() : nullptr);
  };
  for_each_gradient(prepare, update, [&] {
    for (auto& [device, tensors] : gpu)
      kernels::cuda::adam_update_multi(s, lr_, opt_.beta1, opt_.beta2, tensors.data(),
                                       static_cast<int>(tensors.size()), detail::stream(device));
  });
}

StateDict Adam::state_dict() const {
  StateDict st = Optimizer::state_dict();
  for (size_t i = 0; i < state_.size(); ++i) {
    const AdamState& a = state_[i];
    const int64_t step = a.device_step.defined() ? a.device_step.to_vector<int64_t>()[0] : a.step;
    st.set(key(i, "step"), step);
    if (step == 0) continue;
    st.tensors[key(i, "exp_avg")] = a.exp_avg.clone();
    st.tensors[key(i, "exp_avg_sq")] = a.exp_avg_sq.clone();
    if (a.max_exp_avg_sq.defined()) st.tensors[key(i, "max_exp_avg_sq")] = a.max_exp_avg_sq.clone();
  }
  return st;
}

void Adam::load_state_dict(const StateDict& st) {
  // Read and check everything first: a bad state leaves the optimizer as it was.
  check_num_params(st);  // before the per-parameter keys, whose absence it explains
  std::vector<AdamState> next(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    next[i].step = st.get_int(key(i, "step"), name());
    GALLEY_CHECK(next[i].step >= 0, name(), ": saved step of parameter ", i, " is negative");
    if (next[i].step == 0) continue;
    next[i].exp_avg = copy_on(saved(st, i, "exp_avg", params_[i], name()), params_[i]);
    next[i].exp_avg_sq = copy_on(saved(st, i, "exp_avg_sq", params_[i], name()), params_[i]);
    if (opt_.amsgrad)
      next[i].max_exp_avg_sq =
          copy_on(saved(st, i, "max_exp_avg_sq", params_[i], name()), params_[i]);
  }
  Optimizer::load_state_dict(st);
  state_ = std::move(next);
}

// ---------------------------------------------------------------------------------------------
// SGD

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : Optimizer(std::move(params), options.learning_rate), opt_(options) {
  check_non_negative("SGD", "momentum", opt_.momentum);
  GALLEY_CHECK(std::isfinite(opt_.dampening), "SGD: dampening ", opt_.dampening, " must be finite");
  check_non_negative("SGD", "weight_decay", opt_.weight_decay);
  GALLEY_CHECK(!opt_.nesterov || (opt_.momentum > 0 && opt_.dampening == 0),
               "SGD: Nesterov momentum needs momentum > 0 and zero dampening");
  momentum_.resize(params_.size());
}

void SGD::step() {
  kernels::SGDStep s{};
  s.lr = static_cast<float>(lr_);
  s.momentum = static_cast<float>(opt_.momentum);
  s.dampening = static_cast<float>(opt_.dampening);
  s.one_minus_dampening = static_cast<float>(1.0 - opt_.dampening);
  s.weight_decay = static_cast<float>(opt_.weight_decay);
  s.nesterov = opt_.nesterov;
  s.maximize = opt_.maximize;
  GpuBatches gpu;
  std::vector<Tensor> keep;
  // A first step's momentum buffer (its values set by the update) is kept only by the update:
  // a step that fails later leaves none behind.
  std::vector<Tensor> fresh(params_.size());
  auto prepare = [&](size_t i, Tensor& p) {
    if (opt_.momentum == 0 || momentum_[i].defined()) return;
    check_not_capturing(p, name());
    fresh[i] = Tensor::empty(p.shape(), DType::Float32, p.device());
  };
  auto update = [&](size_t i, Tensor& p, const Tensor& g) {
    kernels::SGDStep h = s;
    h.first = fresh[i].defined();
    if (h.first) momentum_[i] = fresh[i];
    float* buf = opt_.momentum != 0 ? momentum_[i].data_ptr<float>() : nullptr;
    if (p.device().is_cuda()) {
      keep.push_back(g);
      kernels::OptimizerTensor t{};
      t.p = p.raw_data();
      t.g = g.raw_data();
      t.dtype = p.dtype();
      t.buf = buf;
      t.n = p.numel();
      t.first = h.first;
      group_of(gpu, p.device()).push_back(t);
      return;
    }
    kernels::cpu::sgd_update(h, p.dtype(), p.numel(), p.raw_data(), g.raw_data(), buf);
  };
  for_each_gradient(prepare, update, [&] {
    for (auto& [device, tensors] : gpu)
      kernels::cuda::sgd_update_multi(s, tensors.data(), static_cast<int>(tensors.size()),
                                      detail::stream(device));
  });
}

StateDict SGD::state_dict() const {
  StateDict st = Optimizer::state_dict();
  for (size_t i = 0; i < momentum_.size(); ++i)
    if (momentum_[i].defined()) st.tensors[key(i, "momentum_buffer")] = momentum_[i].clone();
  return st;
}

void SGD::load_state_dict(const StateDict& st) {
  check_num_params(st);
  std::vector<Tensor> next(params_.size());
  for (size_t i = 0; i < params_.size(); ++i)
    if (st.tensors.count(key(i, "momentum_buffer")))
      next[i] = copy_on(saved(st, i, "momentum_buffer", params_[i], name()), params_[i]);
  Optimizer::load_state_dict(st);
  momentum_ = std::move(next);
}

// ---------------------------------------------------------------------------------------------
// Schedulers

LRScheduler::LRScheduler(Optimizer& optimizer) : LRScheduler(optimizer, true) {}

LRScheduler::LRScheduler(Optimizer& optimizer, bool record_initial)
    : opt_(optimizer),
      base_lr_(optimizer.initial_lr_.value_or(optimizer.learning_rate())),
      last_set_(optimizer.learning_rate()) {
  if (record_initial && !optimizer.initial_lr_) optimizer.initial_lr_ = base_lr_;
  // An earlier schedule (or the user) moved the rate off the base: this one steps by the
  // recursive form from the start, as PyTorch's does from the current rate.
  chained_ = last_set_ != base_lr_;
}

void LRScheduler::initial_step() {
  set_rate(chained_ ? chained_rate(opt_.learning_rate(), 0) : lr_at(0));
}

void LRScheduler::set_rate(double lr) {
  opt_.set_learning_rate(lr);
  last_set_ = lr;
}

void LRScheduler::step() {
  // The epoch counts only once its rate is set: a step that fails leaves the scheduler as it was.
  const double lr = opt_.learning_rate();
  const bool chained = chained_ || lr != last_set_;
  set_rate(chained ? chained_rate(lr, epoch_ + 1) : lr_at(epoch_ + 1));
  chained_ = chained;
  ++epoch_;
}

StateDict LRScheduler::state_dict() const {
  StateDict st;
  st.set("last_epoch", epoch_);
  st.set("base_lr", base_lr_);
  st.set("chained", int64_t(chained_));
  st.set("last_lr", last_set_);
  return st;
}

void LRScheduler::load_state_dict(const StateDict& st) {
  const int64_t epoch = st.get_int("last_epoch", "LRScheduler");
  const double base = st.get_double("base_lr", "LRScheduler");
  GALLEY_CHECK(epoch >= 0, "LRScheduler: saved last_epoch ", epoch, " is negative");
  // A chained schedule's rate is the one it last set (states saved before chaining existed hold
  // neither key: not chained).
  const bool chained = st.values.count("chained") && st.get_int("chained", "LRScheduler") != 0;
  const double last = chained ? st.get_double("last_lr", "LRScheduler") : 0.0;
  // Taken only if the learning rate they give is one (a schedule past its end refuses it).
  const int64_t old_epoch = epoch_;
  const double old_base = base_lr_;
  epoch_ = epoch;
  base_lr_ = base;
  try {
    set_rate(chained ? last : epoch_ == 0 ? start_lr() : lr_at(epoch_));
  } catch (...) {
    epoch_ = old_epoch;
    base_lr_ = old_base;
    throw;
  }
  chained_ = chained;
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  GALLEY_CHECK(step_size > 0, "StepLR: step_size ", step_size, " must be positive");
  check_positive("StepLR", "gamma", gamma);
}

double StepLR::lr_at(int64_t epoch) const {
  return base_lr_ * std::pow(gamma_, double(epoch / step_size_));
}

double StepLR::chained_rate(double lr, int64_t epoch) const {
  return epoch == 0 || epoch % step_size_ != 0 ? lr : lr * gamma_;
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min)
    : LRScheduler(optimizer), t_max_(t_max), eta_min_(eta_min) {
  GALLEY_CHECK(t_max > 0, "CosineAnnealingLR: t_max ", t_max, " must be positive");
  // (Its rates would reach eta_min, which the optimizer refuses below zero.)
  check_non_negative("CosineAnnealingLR", "eta_min", eta_min);
}

double CosineAnnealingLR::lr_at(int64_t epoch) const {
  return eta_min_ +
         (base_lr_ - eta_min_) * (1 + std::cos(M_PI * double(epoch) / double(t_max_))) / 2;
}

double CosineAnnealingLR::chained_rate(double lr, int64_t epoch) const {
  const double t = double(t_max_);
  if (epoch == 0) return lr;
  if ((epoch - 1 - t_max_) % (2 * t_max_) == 0)  // the restart of the cosine past t_max
    return lr + (base_lr_ - eta_min_) * (1 - std::cos(M_PI / t)) / 2;
  return (1 + std::cos(M_PI * double(epoch) / t)) / (1 + std::cos(M_PI * double(epoch - 1) / t)) *
             (lr - eta_min_) +
         eta_min_;
}

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(optimizer), milestones_(std::move(milestones)), gamma_(gamma) {
  for (int64_t m : milestones_) GALLEY_CHECK(m >= 0, "MultiStepLR: milestone ", m, " is negative");
  check_positive("MultiStepLR", "gamma", gamma);
  std::sort(milestones_.begin(), milestones_.end());
  initial_step();
}

double MultiStepLR::lr_at(int64_t epoch) const {
  const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), epoch);
  return base_lr_ * std::pow(gamma_, double(passed - milestones_.begin()));
}

double MultiStepLR::chained_rate(double lr, int64_t epoch) const {
  const auto at = std::equal_range(milestones_.begin(), milestones_.end(), epoch);
  return at.first == at.second ? lr : lr * std::pow(gamma_, double(at.second - at.first));
}

LambdaLR::LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> factor)
    : LRScheduler(optimizer), factor_(std::move(factor)) {
  GALLEY_CHECK(factor_, "LambdaLR: the factor function is empty");
  initial_step();
}

double LambdaLR::lr_at(int64_t epoch) const {
  const double f = factor_(epoch);
  GALLEY_CHECK(std::isfinite(f) && f >= 0, "LambdaLR: the factor for period ", epoch, " is ", f,
               "; it must be finite and 0 or more");
  return base_lr_ * f;
}

ExponentialLR::ExponentialLR(Optimizer& optimizer, double gamma)
    : LRScheduler(optimizer), gamma_(gamma) {
  check_positive("ExponentialLR", "gamma", gamma);
}

double ExponentialLR::lr_at(int64_t epoch) const {
  return base_lr_ * std::pow(gamma_, double(epoch));
}

double ExponentialLR::chained_rate(double lr, int64_t epoch) const {
  return epoch == 0 ? lr : lr * gamma_;
}

CosineAnnealingWarmRestarts::CosineAnnealingWarmRestarts(Optimizer& optimizer, int64_t t_0,
                                                         int64_t t_mult, double eta_min)
    : LRScheduler(optimizer), t_0_(t_0), t_mult_(t_mult), eta_min_(eta_min) {
  GALLEY_CHECK(t_0 > 0, "CosineAnnealingWarmRestarts: t_0 ", t_0, " must be positive");
  GALLEY_CHECK(t_mult >= 1, "CosineAnnealingWarmRestarts: t_mult ", t_mult, " must be 1 or more");
  check_non_negative("CosineAnnealingWarmRestarts", "eta_min", eta_min);
  initial_step();  // the base rate, which PyTorch's first step sets (an earlier schedule moved it)
}

double CosineAnnealingWarmRestarts::lr_at(int64_t epoch) const {
  // The period within its cycle and the cycle's length, as PyTorch's step() counts them (in
  // integers: its closed form through logarithms can land a cycle early).
  int64_t t_cur = epoch, t_i = t_0_;
  if (t_mult_ == 1) {
    t_cur = epoch % t_0_;
  } else {
    while (t_cur >= t_i) {
      t_cur -= t_i;
      if (__builtin_mul_overflow(t_i, t_mult_, &t_i)) t_i = INT64_MAX;  // past any epoch
    }
  }
  return eta_min_ + (base_lr_ - eta_min_) * (1 + std::cos(M_PI * double(t_cur) / double(t_i))) / 2;
}

// The schedules below follow torch/optim/lr_scheduler.py of PyTorch 1.13 formula for formula
// (same operation order, in double), so that the rates agree to the last bits. This file is built
// with -ffp-contract=off (CMakeLists.txt): a * b + c fused into one FMA would skip the product's
// rounding that Python does (OneCycleLR's phase end 0.1 * 10 - 1 is 0 in Python, 5.6e-17 fused;
// its cosine rates came out an ulp off).

LinearLR::LinearLR(Optimizer& optimizer, LinearLROptions options)
    : LRScheduler(optimizer), o_(options) {
  GALLEY_CHECK(o_.start_factor >= 0 && o_.start_factor <= 1, "LinearLR: start_factor ",
               o_.start_factor, " must be in [0, 1]");
  GALLEY_CHECK(o_.end_factor >= 0 && o_.end_factor <= 1, "LinearLR: end_factor ", o_.end_factor,
               " must be in [0, 1]");
  GALLEY_CHECK(o_.total_iters > 0, "LinearLR: total_iters ", o_.total_iters, " must be positive");
  initial_step();
}

double LinearLR::lr_at(int64_t epoch) const {
  const double done = double(std::min(o_.total_iters, epoch));
  return base_lr_ *
         (o_.start_factor + (o_.end_factor - o_.start_factor) * done / double(o_.total_iters));
}

double LinearLR::chained_rate(double lr, int64_t epoch) const {
  if (epoch == 0) return lr * o_.start_factor;
  if (epoch > o_.total_iters) return lr;
  const double span = o_.end_factor - o_.start_factor;
  const double from = double(o_.total_iters) * o_.start_factor + double(epoch - 1) * span;
  // A start_factor of 0 (which PyTorch refuses) leaves no ratio at period 1: the closed form.
  // A decay to 0 can round to a hair below it (PyTorch sets -2.2e-18); the rate is held at 0.
  return from == 0 ? lr_at(epoch) : std::max(0.0, lr * (1.0 + span / from));
}

OneCycleLR::OneCycleLR(Optimizer& optimizer, OneCycleLROptions options)
    : LRScheduler(optimizer), o_(options) {
  check_positive("OneCycleLR", "max_lr", o_.max_lr);
  GALLEY_CHECK(o_.total_steps >= 0 && o_.epochs >= 0 && o_.steps_per_epoch >= 0,
               "OneCycleLR: total_steps ", o_.total_steps, ", epochs ", o_.epochs,
               " and steps_per_epoch ", o_.steps_per_epoch, " must not be negative");
  GALLEY_CHECK(o_.total_steps > 0 || (o_.epochs > 0 && o_.steps_per_epoch > 0),
               "OneCycleLR: give total_steps, or epochs and steps_per_epoch");
  int64_t product = 0;
  GALLEY_CHECK(
      o_.total_steps > 0 || !__builtin_mul_overflow(o_.epochs, o_.steps_per_epoch, &product),
      "OneCycleLR: epochs ", o_.epochs, " x steps_per_epoch ", o_.steps_per_epoch,
      " overflows a 64-bit step count");
  total_steps_ = o_.total_steps > 0 ? o_.total_steps : product;
  GALLEY_CHECK(o_.pct_start >= 0 && o_.pct_start <= 1, "OneCycleLR: pct_start ", o_.pct_start,
               " must be in [0, 1]");
  check_positive("OneCycleLR", "div_factor", o_.div_factor);
  check_positive("OneCycleLR", "final_div_factor", o_.final_div_factor);
  const double initial = o_.max_lr / o_.div_factor, min_lr = initial / o_.final_div_factor;
  const double total = double(total_steps_);
  if (o_.three_phase) {
    phases_ = {{o_.pct_start * total - 1, initial, o_.max_lr},
               {2 * o_.pct_start * total - 2, o_.max_lr, initial},
               {total - 1, initial, min_lr}};
  } else {
    phases_ = {{o_.pct_start * total - 1, initial, o_.max_lr}, {total - 1, o_.max_lr, min_lr}};
  }
  // PyTorch divides by each phase's length; a phase of zero steps would divide by zero.
  double start = 0;
  for (size_t i = 0; i < phases_.size(); ++i) {
    GALLEY_CHECK(phases_[i].end_step != start, "OneCycleLR: pct_start ", o_.pct_start,
                 " with total_steps ", total_steps_, " leaves phase ", i, " with no steps");
    start = phases_[i].end_step;
  }
  base_lr_ = initial;
  opt_.initial_lr_ = initial;  // as PyTorch's OneCycleLR sets initial_lr
  chained_ = false;            // a closed form from its own base
  set_rate(lr_at(0));
}

double OneCycleLR::lr_at(int64_t epoch) const {
  GALLEY_CHECK(epoch >= 0 && epoch <= total_steps_, "OneCycleLR: period ", epoch,
               " is outside the cycle of total_steps ", total_steps_, " (rates exist for 0 to ",
               total_steps_, ")");
  double start = 0;
  for (size_t i = 0; i < phases_.size(); ++i) {
    const Phase& ph = phases_[i];
    if (double(epoch) <= ph.end_step || i + 1 == phases_.size()) {
      const double pct = (double(epoch) - start) / (ph.end_step - start);
      if (o_.anneal_strategy == AnnealStrategy::Cos)
        return ph.end_lr + (ph.start_lr - ph.end_lr) / 2.0 * (std::cos(M_PI * pct) + 1);
      // Period total_steps lies one past the last phase; a linear anneal extrapolated there can
      // go below zero, where the rate is held at 0 (PyTorch would set the negative rate).
      return std::max(0.0, (ph.end_lr - ph.start_lr) * pct + ph.start_lr);
    }
    start = ph.end_step;
  }
  return 0;  // not reached: the last phase always answers
}

ReduceLROnPlateau::ReduceLROnPlateau(Optimizer& optimizer, ReduceLROnPlateauOptions options)
    : LRScheduler(optimizer, /*record_initial=*/false), o_(options) {
  GALLEY_CHECK(o_.factor >= 0 && o_.factor < 1, "ReduceLROnPlateau: factor ", o_.factor,
               " must be in [0, 1)");
  GALLEY_CHECK(o_.patience >= 0, "ReduceLROnPlateau: patience ", o_.patience,
               " must not be negative");
  check_non_negative("ReduceLROnPlateau", "threshold", o_.threshold);
  GALLEY_CHECK(o_.cooldown >= 0, "ReduceLROnPlateau: cooldown ", o_.cooldown,
               " must not be negative");
  check_non_negative("ReduceLROnPlateau", "min_lr", o_.min_lr);
  check_non_negative("ReduceLROnPlateau", "eps", o_.eps);
  best_ = o_.mode == PlateauMode::Min ? HUGE_VAL : -HUGE_VAL;
}

bool ReduceLROnPlateau::is_better(double a) const {
  const bool rel = o_.threshold_mode == ThresholdMode::Rel;
  if (o_.mode == PlateauMode::Min)
    return rel ? a < best_ * (1. - o_.threshold) : a < best_ - o_.threshold;
  return rel ? a > best_ * (o_.threshold + 1.) : a > best_ + o_.threshold;
}

void ReduceLROnPlateau::step(double metric) {
  ++epoch_;
  if (is_better(metric)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;  // a NaN metric is a bad period, as in PyTorch
  }
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;
  }
  if (num_bad_epochs_ > o_.patience) {
    const double old_lr = opt_.learning_rate(), new_lr = std::max(old_lr * o_.factor, o_.min_lr);
    if (old_lr - new_lr > o_.eps) set_rate(new_lr);
    cooldown_counter_ = o_.cooldown;
    num_bad_epochs_ = 0;
  }
}

void ReduceLROnPlateau::step() {
  GALLEY_CHECK(false, "ReduceLROnPlateau: step() needs the metric; call step(metric)");
}

double ReduceLROnPlateau::lr_at(int64_t epoch) const {
  GALLEY_CHECK(epoch == epoch_, "ReduceLROnPlateau: the rate of period ", epoch,
               " is unknown; it depends on the metrics, so only the current period's (", epoch_,
               ") is known");
  return opt_.learning_rate();
}

StateDict ReduceLROnPlateau::state_dict() const {
  StateDict st = LRScheduler::state_dict();
  st.set("best", best_);
  st.set("num_bad_epochs", num_bad_epochs_);
  st.set("cooldown_counter", cooldown_counter_);
  st.set("lr", opt_.learning_rate());
  return st;
}

void ReduceLROnPlateau::load_state_dict(const StateDict& st) {
  const std::string owner = "ReduceLROnPlateau";
  const int64_t epoch = st.get_int("last_epoch", owner), bad = st.get_int("num_bad_epochs", owner),
                cooldown = st.get_int("cooldown_counter", owner);
  const double base = st.get_double("base_lr", owner), best = st.get_double("best", owner),
               lr = st.get_double("lr", owner);
  GALLEY_CHECK(epoch >= 0 && bad >= 0 && cooldown >= 0, owner, ": saved last_epoch ", epoch,
               ", num_bad_epochs ", bad, " and cooldown_counter ", cooldown,
               " must not be negative");
  GALLEY_CHECK(std::isfinite(lr) && lr >= 0, owner, ": saved rate ", lr,
               " must be finite and not negative");
  set_rate(lr);  // before anything else changes: a rate the optimizer refuses leaves all as it was
  epoch_ = epoch;
  base_lr_ = base;
  best_ = best;
  num_bad_epochs_ = bad;
  cooldown_counter_ = cooldown;
}

SequentialLR::SequentialLR(Optimizer& optimizer, std::vector<LRScheduler*> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer), children_(std::move(schedulers)), milestones_(std::move(milestones)) {
  GALLEY_CHECK(!children_.empty(), "SequentialLR: got no schedulers");
  GALLEY_CHECK(milestones_.size() + 1 == children_.size(), "SequentialLR: ", children_.size(),
               " schedulers need ", children_.size() - 1, " milestones, got ", milestones_.size());
  for (size_t i = 0; i < children_.size(); ++i) {
    GALLEY_CHECK(children_[i], "SequentialLR: scheduler ", i, " is null");
    GALLEY_CHECK(&children_[i]->opt_ == &optimizer, "SequentialLR: scheduler ", i,
                 " is on another optimizer");
    GALLEY_CHECK(!dynamic_cast<ReduceLROnPlateau*>(children_[i]), "SequentialLR: scheduler ", i,
                 " is a ReduceLROnPlateau, whose rates depend on metrics");
  }
  for (size_t i = 0; i < milestones_.size(); ++i)
    GALLEY_CHECK(milestones_[i] > (i ? milestones_[i - 1] : 0), "SequentialLR: milestone ", i, " (",
                 milestones_[i], ") must be positive and above the one before");
  // The children share one initial rate, as PyTorch's SequentialLR resets the rate to the
  // optimizer's initial_lr: the rate when the first schedule was made on the optimizer, unless a
  // OneCycleLR set its own (max_lr / div_factor), as PyTorch's does. The rate is set afresh here,
  // so the sequence starts unchained whatever its children did to the rate when they were made.
  rebase(*opt_.initial_learning_rate());
  for (LRScheduler* c : children_) c->epoch_ = 0, c->chained_ = false;
  chained_ = false;
  set_rate(lr_at(0));
}

void SequentialLR::rebase(double base) {
  base_lr_ = base;
  for (LRScheduler* c : children_) {
    if (auto* seq = dynamic_cast<SequentialLR*>(c))
      seq->rebase(base);
    else
      c->base_lr_ = base;
  }
}

std::pair<size_t, int64_t> SequentialLR::locate(int64_t epoch) const {
  const size_t i =
      size_t(std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin());
  return {i, i == 0 ? epoch : epoch - milestones_[i - 1]};
}

double SequentialLR::start_lr() const {
  return children_.front()->start_lr();
}

double SequentialLR::lr_at(int64_t epoch) const {
  auto [i, local] = locate(epoch);
  // PyTorch starts the first child with its implicit first step and each later one with
  // step(0), which takes its closed form.
  if (i == 0 && local == 0) return children_.front()->start_lr();
  return children_[i]->lr_at(local);
}

double SequentialLR::chained_rate(double lr, int64_t epoch) const {
  // PyTorch steps the running schedule by its recursive form, and starts each later one with
  // step(0), its closed form.
  auto [i, local] = locate(epoch);
  if (local == 0) return lr_at(epoch);
  return children_[i]->chained_rate(lr, local);
}

void SequentialLR::step() {
  LRScheduler::step();
  auto [i, local] = locate(epoch_);
  children_[i]->epoch_ = local;
}

void SequentialLR::load_state_dict(const StateDict& state) {
  LRScheduler::load_state_dict(state);
  rebase(base_lr_);
  auto [i, local] = locate(epoch_);
  children_[i]->epoch_ = local;
  if (!chained_) set_rate(epoch_ == 0 ? start_lr() : lr_at(epoch_));  // with the children's base
}

}  // namespace galley::optim
