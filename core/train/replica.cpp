// Replica (trainer.h): one replica's model, optimizer and loss, its step and its evaluation;
// and params_checksum.
#include <vector>

#include "core/data/data_loader.h"
#include "core/nn/sequential.h"
#include "core/optim/adam.h"
#include "core/optim/clip.h"
#include "core/optim/sgd.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/distributed_data_parallel.h"
#include "core/runtime/backend.h"
#include "core/runtime/error.h"
#include "core/train/trainer.h"

namespace ditto::train {

std::vector<float> flat_parameters(nn::Module& m) {
  std::vector<float> all;
  for (nn::Parameter* p : m.parameters()) {
    std::vector<float> v = p->data.to_vector<float>();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

std::uint64_t params_checksum(nn::Module& m) {
  const std::vector<float> v = flat_parameters(m);
  const auto* b = reinterpret_cast<const unsigned char*>(v.data());
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < v.size() * sizeof(float); ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}

Replica::Replica(const TrainerConfig& config, const DataSource& data, std::vector<Device> devices)
    : config_(config), devices_(std::move(devices)) {
  DITTO_CHECK(!devices_.empty(), "Replica: devices: expected at least one device");
  build(config, data, devices_[0]);
  parallel::DataParallelOptions o;
  o.determinism = config.determinism;
  o.micro_shards = config.micro_shards;
  dp_ = std::make_unique<parallel::DataParallel>(*model_, devices_, o);
}

Replica::Replica(const TrainerConfig& config, const DataSource& data, Communicator comm)
    : config_(config), devices_{comm.device()}, comm_(std::move(comm)) {
  build(config, data, devices_[0]);
  eval_criterion_ = criterion_->clone();
  eval_criterion_->set_determinism(config.determinism);
}

Replica::~Replica() = default;

void Replica::build(const TrainerConfig& c, const DataSource& data, const Device& device) {
  if (c.make_model) {
    model_ = c.make_model(device);
  } else {
    std::vector<std::int64_t> sizes{data.num_inputs()};
    sizes.insert(sizes.end(), c.hidden.begin(), c.hidden.end());
    sizes.push_back(data.num_outputs());
    model_ = nn::mlp(sizes, device, c.seed);
  }
  DITTO_CHECK(model_ != nullptr, c.name_of("make_model"), ": returned no model");
  model_->set_input_requires_grad(false);
  if (c.make_loss) criterion_ = c.make_loss();
  else if (c.loss == "mse") criterion_ = std::make_unique<nn::MSELoss>();
  else criterion_ = std::make_unique<nn::CrossEntropyLoss>();
  DITTO_CHECK(criterion_ != nullptr, c.name_of("make_loss"), ": returned no loss");
  criterion_->set_determinism(c.determinism);
  const float lr = c.effective_lr();
  if (c.make_optimizer) {
    opt_ = c.make_optimizer(model_->parameters(), lr);
  } else if (c.optimizer == "adam") {
    optim::AdamOptions ao;
    ao.lr = lr;
    ao.weight_decay = c.weight_decay;
    opt_ = std::make_unique<optim::Adam>(model_->parameters(), ao);
  } else {
    optim::SGDOptions so;
    so.lr = lr;
    so.momentum = c.momentum;
    so.weight_decay = c.weight_decay;
    opt_ = std::make_unique<optim::SGD>(model_->parameters(), so);
  }
  DITTO_CHECK(opt_ != nullptr, c.name_of("make_optimizer"), ": returned no optimizer");
}

void Replica::begin() {
  if (!comm_ || ddp_) return;
  parallel::DistributedDataParallelOptions o;
  o.bucket_cap_mb = config_.bucket_cap_mb;
  o.micro_shards = config_.micro_shards;
  o.average_gradients = false;  // the loss divides by the global batch (Note [DDP loss scaling])
  ddp_ = std::make_unique<parallel::DistributedDataParallel>(*model_, *comm_, o);
}

Tensor Replica::target(const Tensor& y, std::int64_t outputs, const Device& device) const {
  if (config_.make_target) return config_.make_target(y, outputs, device);
  if (config_.make_loss || config_.loss != "mse") return y.to(device);
  // MSE on one-hot targets: f32 [N, outputs].
  std::vector<std::int64_t> labels = y.to_vector<std::int64_t>();
  std::vector<float> onehot(labels.size() * static_cast<std::size_t>(outputs), 0.0f);
  for (std::size_t r = 0; r < labels.size(); ++r) onehot[r * outputs + labels[r]] = 1.0f;
  return Tensor::from_vector(onehot, {static_cast<std::int64_t>(labels.size()), outputs}, device);
}

double Replica::step(const data::Batch& b) {
  begin();
  const std::int64_t n = b.x.size(0);
  Tensor out, loss;  // both alive until the optimizer step is done, as in a hand-written loop
  if (dp_) {
    out = dp_->forward(b.x);
    loss = criterion_->forward(out, target(b.y, out.size(1), out.device()));
    opt_->zero_grad(true);
    dp_->backward(criterion_->backward());
  } else {
    const auto [lo, hi] = ddp_->local_rows(n);
    criterion_->set_global_batch(n);
    out = ddp_->forward({b.x.narrow(lo, hi - lo)}, n);
    loss = criterion_->forward(out, target(b.y.narrow(lo, hi - lo), out.size(1), devices_[0]));
    opt_->zero_grad(true);
    ddp_->backward(criterion_->backward());
  }
  // Between backward and step, on the reduced gradients (the same on every rank).
  if (config_.grad_clip > 0)
    optim::clip_grad_norm_(model_->parameters(), config_.grad_clip, config_.determinism);
  opt_->step();
  return static_cast<double>(loss.item()) * n;
}

double Replica::eval_loss(DataSource& data, EvalSplit split, std::int64_t iters,
                          std::int64_t batch_size) {
  struct EvalMode {  // torch's model.eval() ... model.train(), also when a forward throws
    nn::Module& m;
    explicit EvalMode(nn::Module& mod) : m(mod) { m.set_training(false); }
    ~EvalMode() { m.set_training(true); }
  } mode(*model_);
  nn::Loss& criterion = dp_ ? *criterion_ : *eval_criterion_;
  double sum = 0;
  for (std::int64_t k = 0; k < iters; ++k) {
    data::Batch b = data.eval_batch(split, k, batch_size);
    Tensor out = dp_ ? dp_->forward(b.x) : model_->forward(b.x.to(devices_[0]));
    Tensor y = target(b.y, out.size(out.dim() - 1), out.device());
    sum += static_cast<double>(criterion.forward(out, y).item());
  }
  return iters > 0 ? sum / static_cast<double>(iters) : 0.0;
}

Evaluation Replica::evaluate(const data::Dataset& ds, std::int64_t batch_size) {
  data::DataLoader loader(ds, batch_size, /*shuffle=*/false);
  nn::Loss& criterion = dp_ ? *criterion_ : *eval_criterion_;
  double loss_sum = 0;
  std::int64_t correct = 0, seen = 0;
  for (data::Batch b : loader) {
    Tensor logits = dp_ ? dp_->forward(b.x) : model_->forward(b.x.to(devices_[0]));
    Tensor y = target(b.y, logits.size(1), logits.device());
    loss_sum += static_cast<double>(criterion.forward(logits, y).item()) * b.x.size(0);
    std::vector<float> l = logits.to_vector<float>();
    std::vector<std::int64_t> t = b.y.to_vector<std::int64_t>();
    const std::int64_t classes = logits.size(1);
    for (std::size_t r = 0; r < t.size(); ++r) {
      std::int64_t best = 0;
      for (std::int64_t c = 1; c < classes; ++c)
        if (l[r * classes + c] > l[r * classes + best]) best = c;
      correct += best == t[r];
    }
    seen += b.x.size(0);
  }
  return {seen ? loss_sum / seen : 0.0, seen ? static_cast<double>(correct) / seen : 0.0};
}

double Replica::sum_over_ranks(double v) {
  if (!comm_) return v;
  Tensor t = Tensor::from_vector(std::vector<float>{static_cast<float>(v)}, {1}, devices_[0]);
  comm_->all_reduce(t);
  return static_cast<double>(t.item());
}

std::uint64_t Replica::checked_checksum() {
  // A dry run's parameters hold no data (Note [Dry run], backend_sim/sim_backend.h): reading
  // 1.5B of them back would cost 6 GB of host memory for a checksum of zeros.
  if (is_dry_run(devices_[0])) return 0;
  const std::uint64_t sum = params_checksum(*model_);
  if (!comm_) return sum;
  // Every rank must end with the same parameters.
  Tensor mine = Tensor::from_vector(std::vector<std::int64_t>{static_cast<std::int64_t>(sum)},
                                    {1}, devices_[0]);
  Tensor all = Tensor::empty({comm_->size()}, DType::i64, devices_[0]);
  comm_->all_gather(mine, all);
  std::vector<std::int64_t> sums = all.to_vector<std::int64_t>();
  for (int r = 1; r < comm_->size(); ++r)
    DITTO_CHECK(sums[static_cast<std::size_t>(r)] == sums[0], "Trainer (ddp): rank ", r,
                " ended with params_checksum ", std::hex, sums[static_cast<std::size_t>(r)],
                ", rank 0 with ", sums[0], " (the replicas diverged)");
  return sum;
}

}  // namespace ditto::train
