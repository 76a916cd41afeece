// Replica (replica.h): one replica's model, optimizer and loss, its step and its evaluation;
// and params_checksum.
#include "core/train/replica.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/data/data_loader.h"
#include "core/io/crc32.h"
#include "core/nn/checked_clone.h"
#include "core/nn/sequential.h"
#include "core/optim/adam.h"
#include "core/optim/clip.h"
#include "core/optim/grad_scaler.h"
#include "core/optim/master_weights.h"
#include "core/optim/sgd.h"
#include "core/optim/zero.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/distributed_data_parallel.h"
#include "core/runtime/backend.h"
#include "core/runtime/nan_bits.h"
#include "core/train/grad_accumulation.h"

namespace ditto::train {

std::vector<float> flat_parameters(nn::Module& m) {
  std::vector<float> all;
  for (nn::Parameter* p : m.parameters()) {
    std::vector<float> v = p->data.to(DType::f32).to_vector<float>();  // bf16 / f16: exact
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

std::uint64_t params_checksum(nn::Module& m) {
  // FNV-1a over each parameter's bytes in its own dtype (an f32 model: the bytes of
  // flat_parameters, so f32 checksums are those of every run before mixed precision), every NaN
  // hashed as its dtype's canonical NaN (Note [NaN bits]: a NaN's sign and payload are the
  // hardware's; a model without NaNs hashes its bytes as they are). In chunks of a host buffer:
  // the parameter's own memory (host data may be shared) is never written.
  std::uint64_t h = 1469598103934665603ull;
  std::vector<unsigned char> chunk;
  for (nn::Parameter* p : m.parameters()) {
    const Tensor host = p->data.to(Device::cpu());
    const auto* b = static_cast<const unsigned char*>(host.data_ptr());
    const std::size_t esize = dtype_size(host.dtype());
    const std::size_t step = esize * 8192;
    for (std::size_t at = 0; at < host.nbytes(); at += step) {
      const std::size_t len = std::min(step, host.nbytes() - at);
      chunk.assign(b + at, b + at + len);
      canonicalize_nans(host.dtype(), chunk.data(), static_cast<std::int64_t>(len / esize));
      for (unsigned char c : chunk) {
        h ^= c;
        h *= 1099511628211ull;
      }
    }
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
  if (config.comm_timeout_ms > 0) o.comm_timeout_ms = config.comm_timeout_ms;
  dp_ = std::make_unique<parallel::DataParallel>(*model_, devices_, o);
  check_grad_accumulation(config, static_cast<int>(devices_.size()));
}

Replica::Replica(const TrainerConfig& config, const DataSource& data, Communicator comm)
    : config_(config), devices_{comm.device()}, comm_(std::move(comm)) {
  check_grad_accumulation(config, comm_->size());
  build(config, data, devices_[0]);
  eval_criterion_ = nn::checked_clone(
      *criterion_,
      "Trainer (ddp): the loss's evaluation copy");  // the determinism of criterion_; its own rows
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
  if (c.dtype != DType::f32) model_->to(c.dtype);  // Note [Mixed precision]: bf16 / f16 storage
  if (c.make_loss)
    criterion_ = c.make_loss();
  else if (c.loss == "mse")
    criterion_ = std::make_unique<nn::MSELoss>();
  else
    criterion_ = std::make_unique<nn::CrossEntropyLoss>();
  DITTO_CHECK(criterion_ != nullptr, c.name_of("make_loss"), ": returned no loss");
  criterion_->set_determinism(c.determinism);
  const float lr = c.effective_lr();
  OptimizerFactory factory = c.make_optimizer;
  if (!factory)
    factory = [&c](std::vector<nn::Parameter*> params,
                   float rate) -> std::unique_ptr<optim::Optimizer> {
      if (c.optimizer == "adam") {
        optim::AdamOptions ao;
        ao.lr = rate;
        ao.weight_decay = c.weight_decay;
        return std::make_unique<optim::Adam>(std::move(params), ao);
      }
      optim::SGDOptions so;
      so.lr = rate;
      so.momentum = c.momentum;
      so.weight_decay = c.weight_decay;
      return std::make_unique<optim::SGD>(std::move(params), so);
    };
  // Held by value: ZeRO keeps its factory for the unsharded layout of checkpoints.
  auto checked = [&c, factory](std::vector<nn::Parameter*> params, float rate) {
    auto o = factory(std::move(params), rate);
    DITTO_CHECK(o != nullptr, c.name_of("make_optimizer"), ": returned no optimizer");
    return o;
  };
  // f16 scales the loss (Note [GradScaler]; bf16 has f32's range and needs none, as in torch).
  if (c.dtype == DType::f16 && c.grad_scaler.enabled)
    scaler_ = std::make_unique<optim::GradScaler>(c.grad_scaler);
  if (c.zero_stage == 1 && comm_) {
    // ZeRO-1: the factory's optimizer updates this rank's shard; the clip runs inside. bf16 /
    // f16: the f32 masters live in ZeRO's shard (Note [ZeRO mixed precision]); f16's GradScaler
    // unscales and checks the reduced shard inside ZeRO's step.
    optim::ZeroOptions zo;
    zo.max_grad_norm = c.grad_clip;
    zo.bucket_cap_mb = c.bucket_cap_mb;
    zo.overlap_comm = c.zero_overlap_comm;  // Note [ZeRO overlapped reduce_scatter]
    auto zero = std::make_unique<optim::ZeroRedundancyOptimizer>(model_->parameters(), *comm_,
                                                                 checked, lr, zo);
    if (scaler_) zero->attach_grad_scaler(scaler_.get());
    zero_ = zero.get();
    opt_ = std::move(zero);
    return;
  }
  if (c.dtype == DType::f32) {
    opt_ = checked(model_->parameters(), lr);
    return;
  }
  // Mixed precision: the optimizer runs on f32 masters (Note [Master weights]).
  auto mw = std::make_unique<optim::MasterWeights>(
      model_->parameters(), [checked, lr](std::vector<nn::Parameter*> masters) {
        return checked(std::move(masters), lr);
      });
  master_ = mw.get();
  opt_ = std::move(mw);
  if (scaler_) master_->attach_grad_scaler(scaler_.get());
}

Tensor Replica::loss_grad(const Device& device) const {
  return scaler_ ? scaler_->loss_grad(device) : Tensor();
}

void Replica::optimizer_step() {
  // Between backward and step, on the reduced gradients (the same on every rank): [f16: unscale
  // and the inf / NaN check], clip, the step (skipped on inf / NaN), [the scale's update].
  if (optimizer_reduces_gradients()) {  // ZeRO: unscale, check, clip and step all inside
    opt_->step();
    if (scaler_) scaler_->update();
    return;
  }
  if (master_ && !scaler_) {  // the clip and the step inside (Note [Typed optimizer step])
    if (config_.grad_clip > 0) master_->clip_grad_norm_(config_.grad_clip, config_.determinism);
    opt_->step();
    return;
  }
  std::vector<nn::Parameter*> params = model_->parameters();
  if (master_) {
    master_->load_master_grads();
    params = master_->master_parameters();
  }
  const bool found_inf = scaler_ && scaler_->unscale_(params, config_.determinism);
  if (!found_inf) {
    if (config_.grad_clip > 0)
      optim::clip_grad_norm_(params, config_.grad_clip, config_.determinism);
    opt_->step();
  }
  if (scaler_) scaler_->update();
}

void Replica::begin() {
  if (!comm_ || ddp_) return;
  parallel::DistributedDataParallelOptions o;
  o.bucket_cap_mb = config_.bucket_cap_mb;
  o.micro_shards = config_.micro_shards;
  o.average_gradients = false;  // the loss divides by the global batch (Note [DDP loss scaling])
  ddp_ = std::make_unique<parallel::DistributedDataParallel>(*model_, *comm_, o);
  // ZeRO-1's overlap_comm: DDP holds the module's grad-ready hook and passes each ready
  // parameter on (ZeRO acts only between prepare_overlap() and its step).
  if (zero_ && config_.zero_overlap_comm)
    ddp_->set_grad_ready_observer([z = zero_](nn::Parameter& p) { z->grad_ready(p); });
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

// The step of Note [Gradient accumulation] (core/train/grad_accumulation.h), plan rule 6:
// K micro-steps of forward, loss and backward (DDP under no_sync except as below), in bitwise mode
// with K > 1 each micro-step's grads folded with the canonical tree over micro-steps; then the
// gradient all_reduce where it was not in a backward, clipping and the optimizer step. K = 1 is
// the one-step loop as before (the same operations in the same order).
std::int64_t Replica::rows_of(std::int64_t n) const {
  if (!ddp_) return n;
  const auto [lo, hi] = ddp_->local_rows(n);
  return hi - lo;
}

std::pair<std::int64_t, std::int64_t> Replica::row_range(std::int64_t n) const {
  if (!ddp_) return {0, n};
  return ddp_->local_rows(n);
}

double Replica::step(const data::Batch& b) {
  begin();
  const std::int64_t n = b.x.size(0);
  const std::int64_t steps = config_.grad_accum_steps;
  const bool bitwise = config_.determinism == Determinism::bitwise;
  const bool fold = bitwise && steps > 1;  // else the module accumulates into .grad
  const int world = comm_ ? comm_->size() : 1;
  if (steps > 1) check_micro_batch_rows(config_, world, n);
  // ddp: a backward that all-reduces (DDP's own, overlapped) only where nothing comes between the
  // last backward and the all_reduce: not with the fold, not when the optimizer reduces itself.
  const bool sync_in_backward = ddp_ && !fold && !optimizer_reduces_gradients();
  std::vector<nn::Parameter*> params;
  if (fold) params = model_->parameters();
  GradAccumulator tree;
  Tensor out, loss;  // the last micro-step's: alive until the optimizer step is done, as in a
                     // hand-written loop
  std::vector<Tensor> losses;  // read after the step (reading one waits for its device)
  // The loss's forward; with CrossEntropyLoss where it fuses (CUDA fast mode: one pass over the
  // logits, their gradient written over them) its backward too, given the backward's grad_loss
  // (the GradScaler's scale: unchanged until optimizer_step). `out` is not read again, and the
  // model's backward does not read it (loss_may_overwrite_output).
  auto* fused_ce = config_.loss_may_overwrite_output
                       ? dynamic_cast<nn::CrossEntropyLoss*>(criterion_.get())
                       : nullptr;
  auto loss_forward = [&](const Tensor& o, const Tensor& t) {
    if (fused_ce != nullptr && fused_ce->fuses(o, t))
      return fused_ce->forward_backward(o, t, loss_grad(o.device()));
    return criterion_->forward(o, t);
  };
  for (std::int64_t k = 0; k < steps; ++k) {
    const bool last = k + 1 == steps;
    out = Tensor();
    loss = Tensor();
    if (dp_ && steps == 1) {
      out = dp_->forward(b.x);
      loss = loss_forward(out, target(b.y, out.size(1), out.device()));
    } else if (steps == 1) {
      const auto [lo, hi] = ddp_->local_rows(n);
      criterion_->set_global_batch(n);
      out = ddp_->forward({b.x.narrow(lo, hi - lo)}, n);
      loss = loss_forward(out, target(b.y.narrow(lo, hi - lo), out.size(1), devices_[0]));
    } else {  // a micro-step: dp's block k of the batch, or ddp's block k of this rank's rows
      const MicroBatch m = micro_batch(n, config_.micro_shards, world, comm_ ? comm_->rank() : 0,
                                       steps, k, config_.determinism);
      criterion_->set_global_batch(n);
      const std::vector<Tensor> x{b.x.narrow(m.first_row, m.rows())};
      out = dp_ ? dp_->forward(x, m.first_row, m.shard_bounds)
                : ddp_->forward(x, m.first_row, m.shard_bounds);
      loss =
          loss_forward(out, target(b.y.narrow(m.first_row, m.rows()), out.size(1), out.device()));
    }
    // Fresh grads for every micro-step's node of the tree (fold), else once per step.
    if (k == 0 || fold) opt_->zero_grad(true);
    const Tensor grad_loss = loss_grad(out.device());  // f16: the GradScaler's scale
    if (dp_) {
      dp_->backward(criterion_->backward(grad_loss));
    } else if (sync_in_backward && last) {
      ddp_->backward(criterion_->backward(grad_loss));
    } else {
      // ZeRO-1 with overlap_comm: the last backward completes the step's grads (not with the
      // fold), so its reduce_scatters start as their grads are ready.
      if (last && zero_ && !fold) zero_->prepare_overlap();
      auto no_sync = ddp_->no_sync();
      ddp_->backward(criterion_->backward(grad_loss));
    }
    if (fold) tree.push(params);
    if (!last) losses.push_back(loss);
  }
  if (fold) tree.finish(params);
  if (dp_ && steps > 1) criterion_->set_global_batch(0);  // evaluations take their own rows
  if (ddp_ && !sync_in_backward && !optimizer_reduces_gradients()) ddp_->sync_gradients();
  optimizer_step();  // [unscale / inf check], clip (ZeRO: inside its step), step, [scale update]
  // Each loss is its rows' share of the global batch's mean (dp with K = 1: the mean itself).
  double loss_sum = 0;
  losses.push_back(loss);
  for (const Tensor& l : losses) loss_sum += static_cast<double>(l.item()) * n;
  return loss_sum;
}

void Replica::prepare_checkpoint() {
  if (auto* zero = dynamic_cast<optim::ZeroRedundancyOptimizer*>(opt_.get()))
    zero->consolidate_state_dict(0);
}

bool Replica::optimizer_reduces_gradients() const {
  // ZeRO-1's optimizer (optim::ZeroRedundancyOptimizer, ddp only) reduce_scatters the gradients
  // and clips them in its step; no other optimizer does.
  return config_.zero_stage == 1 && comm_.has_value();
}

// Note [Evaluation in pieces]
// nanoGPT's estimate_loss runs on every rank, each over its own micro-batch. ditto's evaluation is
// of the global batch (the same rows and the same loss whatever the device count), and under ddp
// rank 0 used to run it alone on its one device: a forward over the whole global batch, W x K
// times the rows of a training micro-step (W ranks, K micro-steps), which ran out of memory at
// step 0 for setups whose training fits (tester6's F1: README's llm.c command on 8 x 80 GB with
// --eval-iters 1), while the other ranks waited at their next collective. Now every rank
// evaluates: each forwards its own rows of the eval batch (the rows DDP gives it in training,
// DistributedDataParallel::rows_of_rank) in K pieces, no larger than a training micro-step's, and
// takes the loss's row terms (Loss::row_terms: a token's cross-entropy, a sample's squared
// error), which do not depend on the other rows. Each rank writes its terms at their rows of a
// zeroed vector of the whole batch's terms; one all_reduce (sum) puts every term in place on every
// rank (x + 0 = x: exact in any order), and mean_of_row_terms takes forward's mean over the whole
// batch: the bits of the one forward over the global batch that rank 0 made before (bitwise mode:
// a row's result does not depend on the rows beside it, Note [Micro-shards]). The vector is batch
// x T floats (2 MB for llm.c's 512 x 1024). Every rank decides per batch, from the batch's rows
// alone (the same on every rank): a batch where some rank has no rows (a short last batch of a
// loader source, a batch smaller than the ranks), and any batch of a loss without row terms
// (Loss::has_row_terms: a user's loss), is evaluated as before, by rank 0 over the whole batch,
// the other ranks going on to the next batch. Under ddp DataSource::eval_batch is called from
// every rank's thread at once (as step_batch is), and must give each rank the same batch for the
// same (split, k): the ranks check it (rows and a CRC-32 of x and y, one all_gather a batch)
// before they decide, so that a source that is not a function of (split, k) alone fails at once
// with the ranks named instead of waiting for the timeout or mixing batches (tester7's F3, F4).
// This is Replica::eval_loss_on_every_rank, the Trainer's; Replica::eval_loss, what a library
// user calls (from TrainerCallbacks::on_finish: rank 0 alone), evaluates the whole batch on the
// calling rank, no collective (it was the collective until tester7's F2: on_finish waited for
// ranks that never came, until the timeout).
bool Replica::evaluates_in_pieces() const {
  return ddp_ != nullptr && eval_criterion_ != nullptr && eval_criterion_->has_row_terms();
}

double Replica::eval_loss(DataSource& data, EvalSplit split, std::int64_t iters,
                          std::int64_t batch_size) {
  return eval_loss_of(data, split, iters, batch_size, /*every_rank=*/false);
}

double Replica::eval_loss_on_every_rank(DataSource& data, EvalSplit split, std::int64_t iters,
                                        std::int64_t batch_size) {
  return eval_loss_of(data, split, iters, batch_size, /*every_rank=*/true);
}

namespace {

const char* split_name(EvalSplit split) { return split == EvalSplit::train ? "train" : "val"; }

}  // namespace

void Replica::check_same_eval_batch(const data::Batch& b, EvalSplit split, std::int64_t k) {
  // tester7's F3 and F4: a source that is not a function of (split, k) alone (a sequential
  // reader, a source that is not thread-safe) gave each rank another batch; with other row
  // counts the ranks disagreed on evaluating in pieces and waited for each other until the
  // communicator's timeout, with the same rows they evaluated a mixture without a word. A dry
  // run's batches hold no data: the same exchange (the same allocations and collectives as a
  // real run), no comparison.
  const bool dry = is_dry_run(devices_[0]);
  std::int64_t crc = 0;
  if (!dry) {
    const Tensor hx = b.x.to(Device::cpu()), hy = b.y.to(Device::cpu());
    crc = io::crc32_update(io::crc32_update(0, hx.data_ptr(), hx.nbytes()), hy.data_ptr(),
                           hy.nbytes());
  }
  const int w = comm_->size();
  Tensor mine = Tensor::from_vector(std::vector<std::int64_t>{b.x.size(0), crc}, {2}, devices_[0]);
  Tensor all = Tensor::empty({2 * static_cast<std::int64_t>(w)}, DType::i64, devices_[0]);
  comm_->all_gather(mine, all);
  if (dry) return;
  const std::vector<std::int64_t> v = all.to_vector<std::int64_t>();
  std::string rows, differ;
  bool same = true;
  for (int r = 0; r < w; ++r) {
    const std::int64_t n = v[2 * static_cast<std::size_t>(r)];
    const std::int64_t c = v[2 * static_cast<std::size_t>(r) + 1];
    rows += detail::cat(r ? ", " : "", "rank ", r, " ", n);
    if (n != v[0] || c != v[1]) {
      same = false;
      differ += detail::cat(differ.empty() ? "" : ", ", r);
    }
  }
  DITTO_CHECK(same, "Replica::eval_loss (ddp): DataSource::eval_batch(", split_name(split), ", ", k,
              ") gave the ranks different batches (rows: ", rows,
              "; ranks whose rows or contents differ from rank 0's: ", differ,
              "): under ddp every rank's thread calls eval_batch at once, and each must get "
              "the same batch for the same (split, k), a function of them alone");
}

double Replica::eval_loss_of(DataSource& data, EvalSplit split, std::int64_t iters,
                             std::int64_t batch_size, bool every_rank) {
  struct EvalMode {  // torch's model.eval() ... model.train(), also when a forward throws
    nn::Module& m;
    explicit EvalMode(nn::Module& mod) : m(mod) { m.set_training(false); }
    ~EvalMode() { m.set_training(true); }
  } mode(*model_);
  nn::Loss& criterion = dp_ ? *criterion_ : *eval_criterion_;
  const bool may_split = every_rank && evaluates_in_pieces();
  if (every_rank && !may_split && !lead()) return 0.0;  // the trainer reports rank 0's
  double sum = 0;
  for (std::int64_t k = 0; k < iters; ++k) {
    data::Batch b = data.eval_batch(split, k, batch_size);
    const std::int64_t n = b.x.size(0);
    if (may_split) check_same_eval_batch(b, split, k);
    // Split only where every rank has rows of this batch (each then learns the terms' layout
    // from its own forward); the same batch, so the same decision, on every rank.
    bool pieces = may_split;
    for (int r = 0; pieces && r < comm_->size(); ++r) {
      const auto [lo, hi] = ddp_->rows_of_rank(n, r);
      pieces = hi > lo;
    }
    if (!pieces && every_rank && !lead()) continue;  // rank 0 evaluates this batch whole
    // A bad batch's error says which batch, and under ddp which rows of it the rank's pieces
    // are (an index in the error is one within the piece: tester7's F5).
    try {
      if (pieces) {
        sum += static_cast<double>(eval_loss_in_pieces(b).item());
        continue;
      }
      Tensor out = dp_ ? dp_->forward(b.x) : model_->forward(b.x.to(devices_[0]));
      Tensor y = target(b.y, out.size(out.dim() - 1), out.device());
      sum += static_cast<double>(criterion.forward(out, y).item());
    } catch (const InvalidArgument& e) {
      std::string where;
      if (pieces) {
        const auto [lo, hi] = ddp_->local_rows(n);
        where = detail::cat(", rows [", lo, ", ", hi, ") of its ", n, " on rank ", comm_->rank(),
                            " in pieces of up to ", eval_piece_rows(hi - lo),
                            " (an index below is one in its piece)");
      } else {
        where = detail::cat(", all ", n, " rows");
      }
      throw InvalidArgument(detail::cat("evaluating DataSource::eval_batch(", split_name(split),
                                        ", ", k, ")", where, ": ", e.what()));
    }
  }
  return iters > 0 ? sum / static_cast<double>(iters) : 0.0;
}

std::int64_t Replica::eval_piece_rows(std::int64_t rows) const {
  const std::int64_t steps = std::max<std::int64_t>(config_.grad_accum_steps, 1);
  return (rows + steps - 1) / steps;
}

Tensor Replica::eval_loss_in_pieces(const data::Batch& b) {
  const std::int64_t n = b.x.size(0);
  const auto [first, end] = ddp_->local_rows(n);  // not empty: eval_loss checked
  // K pieces of about rows / K, as the training micro-steps cut this rank's rows (the cut does
  // not change a row's term).
  const std::int64_t piece = eval_piece_rows(end - first);
  nn::RowTerms how;
  Tensor all;  // the whole batch's terms, this rank's in place, zeros elsewhere
  for (std::int64_t lo = first; lo < end; lo += piece) {
    const std::int64_t hi = std::min(end, lo + piece);
    Tensor out = model_->forward(b.x.narrow(lo, hi - lo).to(devices_[0]));
    Tensor y = target(b.y.narrow(lo, hi - lo), out.size(out.dim() - 1), out.device());
    Tensor terms = eval_criterion_->row_terms(out, y, how);
    const std::int64_t per = how.rows_per_sample;  // rows of terms a sample
    DITTO_CHECK(terms.defined() && terms.dim() == 1 && terms.size(0) == (hi - lo) * per,
                "Replica::eval_loss: the loss's row_terms: expected [rows] terms, got ",
                terms.defined() ? terms.str() : std::string("an undefined tensor"));
    if (!all.defined()) all = Tensor::zeros({n * per}, terms.dtype(), devices_[0]);
    Tensor dst = all.narrow(lo * per, (hi - lo) * per);
    dst.copy_(terms);
  }
  comm_->all_reduce(all);
  return eval_criterion_->mean_of_row_terms(all, how);
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
    // bf16 / f16 logits: exact upcast (argmax unchanged); f32: the tensor itself.
    std::vector<float> l = logits.to(DType::f32).to_vector<float>();
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

std::int64_t Replica::min_over_ranks(std::int64_t v) {
  if (!comm_) return v;
  Tensor t = Tensor::from_vector(std::vector<std::int64_t>{v}, {1}, devices_[0]);
  comm_->all_reduce(t, ReduceOp::min);
  return t.to_vector<std::int64_t>()[0];
}

std::uint64_t Replica::checked_checksum() {
  // A dry run's parameters hold no data (Note [Dry run], backend_sim/sim_backend.h): reading
  // 1.5B of them back would cost 6 GB of host memory for a checksum of zeros.
  if (is_dry_run(devices_[0])) return 0;
  const std::uint64_t sum = params_checksum(*model_);
  if (!comm_) return sum;
  // Every rank must end with the same parameters.
  Tensor mine = Tensor::from_vector(std::vector<std::int64_t>{static_cast<std::int64_t>(sum)}, {1},
                                    devices_[0]);
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
