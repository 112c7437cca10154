// Optimizer base, Adam/AdamW, SGD and the learning-rate schedulers.
#include <algorithm>
#include <cmath>

#include "galley/optim/adam.h"
#include "galley/optim/lr_scheduler.h"
#include "galley/optim/sgd.h"
#include "kernels/cpu/optimizer_update.h"
#include "src/device_scope.h"
#include "src/ops/backend.h"
#include "src/runtime/device_memory.h"

namespace galley::optim {

namespace cpu = kernels::cpu;

// ---------------------------------------------------------------------------------------------
// Optimizer

Optimizer::Optimizer(std::vector<Tensor> params, double learning_rate)
    : params_(std::move(params)), lr_(learning_rate) {
  GALLEY_CHECK(!params_.empty(), "optimizer: got an empty parameter list");
  GALLEY_CHECK(learning_rate >= 0, "optimizer: learning rate ", learning_rate, " is negative");
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    GALLEY_CHECK(p.defined() && p.is_leaf() && p.dtype() == DType::Float32, "optimizer: parameter ",
                 i, " must be a defined float32 leaf tensor");
    for (size_t j = 0; j < i; ++j)
      GALLEY_CHECK(!params_[j].is_same(p), "optimizer: parameter ", i, " appears twice (also at ",
                   j, ")");
  }
}

void Optimizer::clear_grad() {
  for (auto& p : params_) p.set_grad(Tensor());
}

void Optimizer::set_learning_rate(double lr) {
  GALLEY_CHECK(lr >= 0, "optimizer: learning rate ", lr, " is negative");
  lr_ = lr;
}

void Optimizer::for_each_gradient(
    const std::function<void(size_t, Tensor&, const Tensor&)>& update) {
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    GALLEY_CHECK(g.shape() == p.shape(), "optimizer: gradient of parameter ", i, " has shape ",
                 shape_str(g.shape()), ", the parameter ", shape_str(p.shape()));
    // State created for a parameter lives on the parameter's device.
    detail::DeviceScope scope(p.device());
    update(i, p, g.contiguous());
  }
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

// The saved tensor for parameter i, checked against the parameter's shape.
Tensor saved(const StateDict& st, size_t i, const char* what, const Tensor& param,
             const std::string& owner) {
  auto it = st.tensors.find(key(i, what));
  GALLEY_CHECK(it != st.tensors.end(), owner, ": saved state lacks '", key(i, what), "'");
  GALLEY_CHECK(it->second.shape() == param.shape() && it->second.dtype() == DType::Float32, owner,
               ": saved '", key(i, what), "' is ", shape_str(it->second.shape()), " ",
               dtype_name(it->second.dtype()), " but parameter ", i, " is ",
               shape_str(param.shape()), " float32");
  return it->second;
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
using GpuBatches = std::vector<std::pair<Device, std::vector<backend::OptimizerTensor>>>;
std::vector<backend::OptimizerTensor>& group_of(GpuBatches& batches, Device device) {
  for (auto& [d, tensors] : batches)
    if (d == device) return tensors;
  batches.emplace_back(device, std::vector<backend::OptimizerTensor>{});
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

void Optimizer::load_state_dict(const StateDict& st) {
  const int64_t n = st.get_int("num_params", name());
  GALLEY_CHECK(n == static_cast<int64_t>(params_.size()), name(), ": saved state is for ", n,
               " parameters, this optimizer has ", params_.size());
  set_learning_rate(st.get_double("lr", name()));
}

// ---------------------------------------------------------------------------------------------
// Adam / AdamW

Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : Optimizer(std::move(params), options.learning_rate), opt_(options) {
  GALLEY_CHECK(opt_.beta1 >= 0 && opt_.beta1 < 1 && opt_.beta2 >= 0 && opt_.beta2 < 1,
               "Adam: betas (", opt_.beta1, ", ", opt_.beta2, ") must be in [0, 1)");
  GALLEY_CHECK(opt_.eps >= 0, "Adam: eps ", opt_.eps, " is negative");
  GALLEY_CHECK(opt_.weight_decay >= 0, "Adam: weight_decay ", opt_.weight_decay, " is negative");
  state_.resize(params_.size());
}

void Adam::step() {
  cpu::AdamStep s{};
  s.lr = static_cast<float>(lr_);
  s.beta1 = static_cast<float>(opt_.beta1);
  s.beta2 = static_cast<float>(opt_.beta2);
  s.eps = static_cast<float>(opt_.eps);
  s.weight_decay = static_cast<float>(opt_.weight_decay);
  s.decoupled = decoupled_;
  s.amsgrad = opt_.amsgrad;
  // GPU parameters are updated together, a few launches per device, once all are gathered.
  GpuBatches gpu;
  std::vector<Tensor> keep;  // gradients made contiguous for the batched launches
  for_each_gradient([&](size_t i, Tensor& p, const Tensor& g) {
    AdamState& st = state_[i];
    if (st.step == 0 && !st.exp_avg.defined()) {
      check_not_capturing(p, name());
      st.exp_avg = zeros(p.shape());
      st.exp_avg_sq = zeros(p.shape());
      if (opt_.amsgrad) st.max_exp_avg_sq = zeros(p.shape());
    }
    if (p.device().is_cuda()) {
      if (!st.device_step.defined()) {
        check_not_capturing(p, name());
        st.device_step = Tensor::from_vector(std::vector<int64_t>{st.step}, {1}, p.device());
      }
      ++st.step;
      keep.push_back(g);
      backend::OptimizerTensor t{};
      t.p = p.data<float>();
      t.g = g.data<float>();
      t.m = st.exp_avg.data<float>();
      t.v = st.exp_avg_sq.data<float>();
      t.vmax = opt_.amsgrad ? st.max_exp_avg_sq.data<float>() : nullptr;
      t.step = st.device_step.data<int64_t>();
      t.n = p.numel();
      group_of(gpu, p.device()).push_back(t);
      return;
    }
    ++st.step;
    cpu::AdamStep h = s;
    h.step_size = static_cast<float>(lr_ / (1.0 - std::pow(opt_.beta1, double(st.step))));
    h.bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(opt_.beta2, double(st.step))));
    backend::adam_update(p.device(), h, p.numel(), p.data<float>(), g.data<float>(),
                         st.exp_avg.data<float>(), st.exp_avg_sq.data<float>(),
                         opt_.amsgrad ? st.max_exp_avg_sq.data<float>() : nullptr);
  });
  for (auto& [device, tensors] : gpu) {
    detail::DeviceScope scope(device);
    backend::adam_update_multi(device, s, lr_, opt_.beta1, opt_.beta2, tensors);
  }
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

AdamW::AdamW(std::vector<Tensor> params, AdamOptions options) : Adam(std::move(params), options) {
  decoupled_ = true;
}

// ---------------------------------------------------------------------------------------------
// SGD

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : Optimizer(std::move(params), options.learning_rate), opt_(options) {
  GALLEY_CHECK(opt_.momentum >= 0, "SGD: momentum ", opt_.momentum, " is negative");
  GALLEY_CHECK(opt_.weight_decay >= 0, "SGD: weight_decay ", opt_.weight_decay, " is negative");
  GALLEY_CHECK(!opt_.nesterov || (opt_.momentum > 0 && opt_.dampening == 0),
               "SGD: Nesterov momentum needs momentum > 0 and zero dampening");
  momentum_.resize(params_.size());
}

void SGD::step() {
  cpu::SGDStep s{};
  s.lr = static_cast<float>(lr_);
  s.momentum = static_cast<float>(opt_.momentum);
  s.dampening = static_cast<float>(opt_.dampening);
  s.weight_decay = static_cast<float>(opt_.weight_decay);
  s.nesterov = opt_.nesterov;
  GpuBatches gpu;
  std::vector<Tensor> keep;
  for_each_gradient([&](size_t i, Tensor& p, const Tensor& g) {
    cpu::SGDStep h = s;
    h.first = opt_.momentum != 0 && !momentum_[i].defined();
    if (h.first) {
      check_not_capturing(p, name());
      momentum_[i] = Tensor::empty(p.shape());
    }
    float* buf = opt_.momentum != 0 ? momentum_[i].data<float>() : nullptr;
    if (p.device().is_cuda()) {
      keep.push_back(g);
      backend::OptimizerTensor t{};
      t.p = p.data<float>();
      t.g = g.data<float>();
      t.buf = buf;
      t.n = p.numel();
      t.first = h.first;
      group_of(gpu, p.device()).push_back(t);
      return;
    }
    backend::sgd_update(p.device(), h, p.numel(), p.data<float>(), g.data<float>(), buf);
  });
  for (auto& [device, tensors] : gpu) {
    detail::DeviceScope scope(device);
    backend::sgd_update_multi(device, s, tensors);
  }
}

StateDict SGD::state_dict() const {
  StateDict st = Optimizer::state_dict();
  for (size_t i = 0; i < momentum_.size(); ++i)
    if (momentum_[i].defined()) st.tensors[key(i, "momentum_buffer")] = momentum_[i].clone();
  return st;
}

void SGD::load_state_dict(const StateDict& st) {
  std::vector<Tensor> next(params_.size());
  for (size_t i = 0; i < params_.size(); ++i)
    if (st.tensors.count(key(i, "momentum_buffer")))
      next[i] = copy_on(saved(st, i, "momentum_buffer", params_[i], name()), params_[i]);
  Optimizer::load_state_dict(st);
  momentum_ = std::move(next);
}

// ---------------------------------------------------------------------------------------------
// Schedulers

LRScheduler::LRScheduler(Optimizer& optimizer)
    : opt_(optimizer), base_lr_(optimizer.learning_rate()) {}

void LRScheduler::step() {
  ++epoch_;
  opt_.set_learning_rate(lr_at(epoch_));
}

StateDict LRScheduler::state_dict() const {
  StateDict st;
  st.set("last_epoch", epoch_);
  st.set("base_lr", base_lr_);
  return st;
}

void LRScheduler::load_state_dict(const StateDict& st) {
  const int64_t epoch = st.get_int("last_epoch", "LRScheduler");
  const double base = st.get_double("base_lr", "LRScheduler");
  GALLEY_CHECK(epoch >= 0, "LRScheduler: saved last_epoch ", epoch, " is negative");
  epoch_ = epoch;
  base_lr_ = base;
  opt_.set_learning_rate(epoch_ == 0 ? base_lr_ : lr_at(epoch_));
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  GALLEY_CHECK(step_size > 0, "StepLR: step_size ", step_size, " must be positive");
  GALLEY_CHECK(gamma > 0, "StepLR: gamma ", gamma, " must be positive");
}

double StepLR::lr_at(int64_t epoch) const {
  return base_lr_ * std::pow(gamma_, double(epoch / step_size_));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min)
    : LRScheduler(optimizer), t_max_(t_max), eta_min_(eta_min) {
  GALLEY_CHECK(t_max > 0, "CosineAnnealingLR: t_max ", t_max, " must be positive");
}

double CosineAnnealingLR::lr_at(int64_t epoch) const {
  return eta_min_ +
         (base_lr_ - eta_min_) * (1 + std::cos(M_PI * double(epoch) / double(t_max_))) / 2;
}

}  // namespace galley::optim
