// DistributedDataParallel: parameter check and broadcast, gradient buckets all-reduced on a
// communication stream as backward produces them, no_sync, Join for uneven inputs, abort on
// failure (see the header's notes).
#include "core/parallel/distributed_data_parallel.h"

#include <algorithm>
#include <exception>
#include <functional>
#include <limits>
#include <unordered_map>

#include "core/base/error.h"
#include "core/comm/comm.h"
#include "core/numerics/micro_shards.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"

namespace ditto::parallel {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// Per-parameter signature exchanged at construction: dtype, number of dims, the first kSigDims
// sizes (0 past the last) and a hash of the whole shape.
constexpr std::size_t kSigDims = 5;
constexpr std::size_t kSigLen = 3 + kSigDims;

std::vector<std::int64_t> signature(const Tensor& t) {
  std::vector<std::int64_t> s(kSigLen, 0);
  s[0] = static_cast<std::int64_t>(t.dtype());
  s[1] = t.dim();
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t d = 0; d < t.shape().size(); ++d) {
    if (d < kSigDims) s[2 + d] = t.shape()[d];
    h = (h ^ static_cast<std::uint64_t>(t.shape()[d])) * 1099511628211ull;
  }
  s[kSigLen - 1] = static_cast<std::int64_t>(h);
  return s;
}

std::string signature_str(const std::int64_t* s) {
  std::string out = "[";
  for (std::int64_t d = 0; d < s[1]; ++d) {
    if (d) out += ", ";
    if (d == static_cast<std::int64_t>(kSigDims)) {
      out += "...";
      break;
    }
    out += std::to_string(s[2 + d]);
  }
  return out + "] " + dtype_name(static_cast<DType>(s[0]));
}

std::string message_of(const std::exception& e) { return e.what(); }

}  // namespace

DType DistributedDataParallel::grad_dtype_of(const nn::Parameter& p) const {
  // Note [DDP gradient dtype]: nn::grad_dtype, the rule every module allocates its grads with.
  return nn::grad_dtype(p.data.dtype(), mode_);
}

struct DistributedDataParallel::Bucket {
  std::vector<std::size_t> params;    // indices into params_
  std::vector<std::int64_t> offsets;  // element offset of each parameter in `flat`
  std::int64_t numel = 0;
  DType dtype = DType::f32;  // the grads' dtype (Note [DDP gradient dtype])
  Tensor flat;               // dtype [numel] on the rank's device
  std::size_t pending = 0;   // parameters not yet ready in this backward
  bool launched = false;
  // The grads packed by launch(), kept alive until the communication stream has read them
  // (freeing them on the host would let the compute stream reuse their memory first).
  std::vector<Tensor> packed;

  // Parameter k's slot of `flat`, in the parameter's shape (Note [DDP grads as bucket views]).
  Tensor slot(std::size_t k, const nn::Parameter& p) const {
    return flat.narrow(offsets[k], p.data.numel()).view(p.data.shape());
  }
};

DistributedDataParallel::DistributedDataParallel(nn::Module& module, Communicator comm,
                                                 DistributedDataParallelOptions options)
    : module_(module),
      comm_(std::move(comm)),
      options_(options),
      mode_(comm_.options().determinism),
      uncaught_at_construction_(std::uncaught_exceptions()) {
  try {
    DITTO_CHECK(options_.bucket_cap_mb > 0,
                "DistributedDataParallel: bucket_cap_mb: expected > 0, got ",
                options_.bucket_cap_mb);
    DITTO_CHECK(options_.first_bucket_cap_mb > 0,
                "DistributedDataParallel: first_bucket_cap_mb: expected > 0, got ",
                options_.first_bucket_cap_mb);
    const std::int64_t k = options_.micro_shards;
    DITTO_CHECK(k >= 1 && k <= kMaxMicroShards && (k & (k - 1)) == 0,
                "DistributedDataParallel: micro_shards: expected a power of two in [1, ",
                kMaxMicroShards, "], got ", k);
    // Bitwise mode gives every rank whole micro-shards; fast mode splits without them.
    DITTO_CHECK(mode_ != Determinism::bitwise || comm_.size() <= k,
                "DistributedDataParallel: micro_shards: expected at least the "
                "world size ",
                comm_.size(), " in bitwise mode, got ", k, " (raise micro_shards)");
    params_ = module_.parameters();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const nn::Parameter& p = *params_[i];
      DITTO_CHECK(p.data.defined() && p.data.device() == comm_.device(),
                  "DistributedDataParallel: rank ", comm_.rank(), ": parameter ", i, " ('", p.name,
                  "'): expected a tensor on ", comm_.device().str(),
                  " (the communicator's device "
                  "of this rank), got ",
                  p.data.defined() ? p.data.str() : std::string("undefined"));
      DITTO_CHECK(nn::is_float_storage(p.data.dtype()), "DistributedDataParallel: rank ",
                  comm_.rank(), ": parameter ", i, " ('", p.name,
                  "'): expected dtype f32, bf16 or f16, got ", p.data.str());
    }
    Backend& be = comm_.device().backend();
    comm_stream_ = be.create_stream(comm_.device().index);
    grads_done_ = be.create_event(comm_.device().index);
    comm_done_ = be.create_event(comm_.device().index);
    module_.set_determinism(mode_);
    check_parameters();
    if (options_.broadcast_parameters) broadcast_from(0);
    build_buckets();
    module_.set_grad_ready_hook([this](nn::Parameter& p) { on_grad_ready(p); });
  } catch (const std::exception& e) {
    comm_.abort(message_of(e));
    throw;
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  module_.set_grad_ready_hook({});
  if (std::uncaught_exceptions() > uncaught_at_construction_)
    comm_.abort("its training loop threw (DistributedDataParallel destroyed while the exception "
                "unwound the rank's stack)");
  try {
    if (comm_stream_) comm_stream_->synchronize();  // no work may outlive the buckets
  } catch (...) {  // already reported (or the run is failing anyway)
  }
}

void DistributedDataParallel::abort(const std::string& reason) const noexcept {
  comm_.abort(reason);
}

void DistributedDataParallel::fail(const char* call) {
  // Called inside a catch block: report this rank's error to the others, then rethrow it.
  try {
    throw;
  } catch (const std::exception& e) {
    // A refusal of DDP's own already names its call: not twice ("DistributedDataParallel.forward:
    // DistributedDataParallel.forward: ...", tester hB, 11c).
    const std::string what = e.what();
    comm_.abort(what.rfind("DistributedDataParallel", 0) == 0
                    ? what
                    : detail::cat("DistributedDataParallel.", call, ": ", what));
    throw;
  }
}

DType DistributedDataParallel::bucket_dtype(std::size_t b) const {
  DITTO_CHECK(b < buckets_.size(), "DistributedDataParallel.bucket_dtype: b: expected < ",
              buckets_.size(), ", got ", b);
  return buckets_[b]->dtype;
}

// ---- construction ------------------------------------------------------------------------------

void DistributedDataParallel::check_parameters() {
  const Device dev = comm_.device();
  const int n = comm_.size();
  StreamGuard guard(*comm_stream_);
  // Parameter counts first (the signatures' broadcast needs one length on every rank).
  Tensor count = Tensor::from_vector(
      std::vector<std::int64_t>{static_cast<std::int64_t>(params_.size())}, {1}, dev);
  Tensor counts = Tensor::empty({n}, DType::i64, dev);
  comm_.all_gather(count, counts);
  std::vector<std::int64_t> c = counts.to_vector<std::int64_t>();
  for (int r = 1; r < n; ++r)
    DITTO_CHECK(c[static_cast<std::size_t>(r)] == c[0],
                "DistributedDataParallel: the ranks' modules differ: rank 0 has ", c[0],
                " parameters but rank ", r, " has ", c[static_cast<std::size_t>(r)]);
  if (params_.empty()) return;
  std::vector<std::int64_t> sig;
  sig.reserve(params_.size() * kSigLen);
  for (nn::Parameter* p : params_) {
    std::vector<std::int64_t> s = signature(p->data);
    sig.insert(sig.end(), s.begin(), s.end());
  }
  // Rank 0's signatures to every rank, each comparing its own; then every rank learns each
  // rank's first differing parameter (one number per rank) and all fail with the same error,
  // naming the first parameter that differs and the first rank it differs on, with that rank's
  // signature. An all_gather of every rank's signatures copied to every host took n^2 x 64
  // bytes per parameter at once in a process of n ranks (a dry run of GPT-2 XL: 10 GB at 512).
  const bool dry = is_dry_run(dev);  // reads zeros (Note [Dry run], sim_backend.h): all agree
  const auto len = static_cast<std::int64_t>(sig.size());
  Tensor first = Tensor::from_vector(sig, {len}, dev);
  comm_.broadcast(first, 0);
  const std::vector<std::int64_t> a = first.to_vector<std::int64_t>();
  std::int64_t mine = 0;  // 1 + the first parameter that differs from rank 0's, or 0
  for (std::size_t i = 0; i < params_.size() && !dry && mine == 0; ++i)
    if (!std::equal(a.data() + i * kSigLen, a.data() + (i + 1) * kSigLen, sig.data() + i * kSigLen))
      mine = static_cast<std::int64_t>(i) + 1;
  Tensor bad = Tensor::from_vector(std::vector<std::int64_t>{mine}, {1}, dev);
  Tensor bads = Tensor::empty({n}, DType::i64, dev);
  comm_.all_gather(bad, bads);
  const std::vector<std::int64_t> b = bads.to_vector<std::int64_t>();
  int r = -1;  // the rank of the first differing parameter (the lowest rank of those)
  for (int q = 1; q < n; ++q) {
    const std::int64_t bq = b[static_cast<std::size_t>(q)];
    if (bq != 0 && (r < 0 || bq < b[static_cast<std::size_t>(r)])) r = q;
  }
  if (r < 0) return;
  const auto i = static_cast<std::size_t>(b[static_cast<std::size_t>(r)] - 1);
  Tensor theirs = Tensor::from_vector(
      std::vector<std::int64_t>(sig.data() + i * kSigLen, sig.data() + (i + 1) * kSigLen),
      {static_cast<std::int64_t>(kSigLen)}, dev);
  comm_.broadcast(theirs, r);
  const std::vector<std::int64_t> sr = theirs.to_vector<std::int64_t>();
  throw InvalidArgument(detail::cat(
      "DistributedDataParallel: the ranks' parameters differ: parameter ", i, " ('",
      params_[i]->name, "' on rank ", comm_.rank(), ") is ", signature_str(a.data() + i * kSigLen),
      " on rank 0 but ", signature_str(sr.data()), " on rank ", r));
}

void DistributedDataParallel::broadcast_from(int root) {
  Stream& compute = current_stream(comm_.device());
  compute.record(*grads_done_);
  comm_stream_->wait(*grads_done_);
  {
    StreamGuard guard(*comm_stream_);
    for (nn::Parameter* p : params_) comm_.broadcast(p->data, root);
  }
  comm_stream_->synchronize();
}

void DistributedDataParallel::build_buckets() {
  // Reverse parameter order (backward produces the last layer's gradients first), a bucket closed
  // once it reaches its cap (torch's compute_bucket_assignment_by_size: the first cap is
  // first_bucket_cap_mb, the later ones bucket_cap_mb).
  // Grads of another dtype go to their own open bucket (torch's compute_bucket_assignment_by_size
  // keys its buckets by dtype); the open buckets left at the end follow in the order their dtype
  // first came. One dtype (every f32 model): the single sequence of buckets as before.
  // The caps in bytes, in double and saturated: a cap past 2^63 bytes (--bucket-cap-mb 1e13)
  // overflowed the conversion to int64 (undefined; it came out negative, one bucket a
  // parameter); torch's huge cap is one bucket, and so is this (no model has 2^63 bytes).
  const auto bytes_of = [](double mb) {
    const double b = mb * kMiB;
    return b < 0x1p63 ? static_cast<std::int64_t>(b) : std::numeric_limits<std::int64_t>::max();
  };
  const std::int64_t first_cap = bytes_of(options_.first_bucket_cap_mb);
  const std::int64_t cap = bytes_of(options_.bucket_cap_mb);
  bucket_of_.assign(params_.size(), 0);
  struct Open {
    DType dtype;
    std::vector<std::size_t> params;
    std::int64_t bytes = 0;
  };
  std::vector<Open> open;     // one per dtype, in first-seen order
  std::vector<DType> dtypes;  // per bucket
  for (std::size_t j = params_.size(); j-- > 0;) {
    const DType d = grad_dtype_of(*params_[j]);
    auto it = std::find_if(open.begin(), open.end(), [&](const Open& o) { return o.dtype == d; });
    if (it == open.end()) it = open.insert(open.end(), Open{d, {}, 0});
    it->params.push_back(j);
    it->bytes += params_[j]->data.numel() * static_cast<std::int64_t>(dtype_size(d));
    if (it->bytes >= (bucket_params_.empty() ? first_cap : cap)) {
      bucket_params_.push_back(std::move(it->params));
      dtypes.push_back(d);
      it->params.clear();
      it->bytes = 0;
    }
  }
  for (Open& o : open)
    if (!o.params.empty()) {
      bucket_params_.push_back(std::move(o.params));
      dtypes.push_back(o.dtype);
    }
  for (std::size_t b = 0; b < bucket_params_.size(); ++b) {
    auto bucket = std::make_unique<Bucket>();
    bucket->params = bucket_params_[b];
    bucket->dtype = dtypes[b];
    for (std::size_t j : bucket->params) {
      bucket_of_[j] = b;
      bucket->offsets.push_back(bucket->numel);
      bucket->numel += params_[j]->data.numel();
    }
    // bucket->flat is allocated by its first all_reduce (launch): a DDP that never syncs (ZeRO's
    // no_sync on every backward, core/optim/zero.h) holds no bucket memory.
    buckets_.push_back(std::move(bucket));
  }
  ready_.assign(params_.size(), 0);
  for (std::size_t i = 0; i < params_.size(); ++i) index_of_[params_[i]] = i;
}

// ---- forward -----------------------------------------------------------------------------------

std::pair<std::int64_t, std::int64_t> DistributedDataParallel::local_rows(
    std::int64_t global_batch) const {
  return rows_of_rank(global_batch, comm_.rank());
}

std::pair<std::int64_t, std::int64_t> DistributedDataParallel::rows_of_rank(
    std::int64_t global_batch, int rank) const {
  DITTO_CHECK(global_batch >= 0,
              "DistributedDataParallel.local_rows: global_batch: expected >= 0, got ",
              global_batch);
  DITTO_CHECK(rank >= 0 && rank < comm_.size(),
              "DistributedDataParallel.rows_of_rank: rank: expected 0 <= rank < ", comm_.size(),
              ", got ", rank);
  const std::int64_t k = options_.micro_shards, d = comm_.size(), r = rank;
  // Fast mode: DataParallel's fast split (torch.chunk), 8 rows each for 24 over 3 ranks.
  if (mode_ != Determinism::bitwise) return comm::chunk_range(global_batch, d, r);
  // Bitwise: row floor(i * B / K) starts micro-shard i (micro_shard_bounds); this rank holds
  // shards [r * K / D, (r + 1) * K / D) (Note [DDP loss scaling]).
  const std::int64_t first = r * k / d, last = (r + 1) * k / d;
  const std::vector<std::int64_t> bounds = micro_shard_bounds(global_batch, k);
  return {bounds[static_cast<std::size_t>(first)], bounds[static_cast<std::size_t>(last)]};
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  return forward(std::vector<Tensor>{input});
}

Tensor DistributedDataParallel::forward(const std::vector<Tensor>& inputs) {
  try {
    if (join_enabled_) exchange_join_flags(sync_ ? 2 : 1, nullptr);
    if (mode_ == Determinism::bitwise) module_.set_micro_shards({});
    std::vector<Tensor> moved;
    moved.reserve(inputs.size());
    for (const Tensor& t : inputs) moved.push_back(t.defined() ? t.to(comm_.device()) : t);
    return module_.forward(moved);
  } catch (...) {
    fail("forward");
  }
}

Tensor DistributedDataParallel::forward_rows(const std::vector<Tensor>& inputs,
                                             std::int64_t first_row,
                                             const std::vector<std::int64_t>& shard_bounds) {
  if (join_enabled_) exchange_join_flags(sync_ ? 2 : 1, nullptr);
  if (mode_ == Determinism::bitwise) module_.set_micro_shards(shard_bounds);
  module_.set_first_row(first_row);  // Note [Dropout masks]
  std::vector<Tensor> moved;
  moved.reserve(inputs.size());
  for (const Tensor& t : inputs) moved.push_back(t.to(comm_.device()));
  return module_.forward(moved);
}

Tensor DistributedDataParallel::forward(const std::vector<Tensor>& inputs,
                                        std::int64_t global_batch) {
  try {
    const auto [lo, hi] = local_rows(global_batch);
    for (std::size_t j = 0; j < inputs.size(); ++j)
      DITTO_CHECK(inputs[j].defined() && inputs[j].dim() >= 1 && inputs[j].size(0) == hi - lo,
                  "DistributedDataParallel.forward: inputs[", j, "]: expected the ", hi - lo,
                  " rows [", lo, ", ", hi, ") of the global batch of ", global_batch, " that rank ",
                  comm_.rank(), " of ", comm_.size(), " takes (local_rows), got ",
                  inputs[j].defined() ? inputs[j].str() : std::string("an undefined tensor"));
    std::vector<std::int64_t> bounds;
    if (mode_ == Determinism::bitwise) {
      const std::int64_t k = options_.micro_shards, d = comm_.size(), r = comm_.rank();
      bounds = local_bounds(micro_shard_bounds(global_batch, k), r * k / d, (r + 1) * k / d);
    }
    return forward_rows(inputs, lo, bounds);  // lo: this rank's rows of the global batch
  } catch (...) {
    fail("forward");
  }
}

Tensor DistributedDataParallel::forward(const std::vector<Tensor>& inputs, std::int64_t first_row,
                                        const std::vector<std::int64_t>& shard_bounds) {
  try {
    DITTO_CHECK(!inputs.empty(), "DistributedDataParallel.forward: inputs: expected at least one "
                                 "tensor");
    DITTO_CHECK(first_row >= 0, "DistributedDataParallel.forward: first_row: expected >= 0, got ",
                first_row);
    for (std::size_t j = 0; j < inputs.size(); ++j)
      DITTO_CHECK(
          inputs[j].defined() && inputs[j].dim() >= 1 && inputs[j].size(0) == inputs[0].size(0),
          "DistributedDataParallel.forward: inputs[", j, "]: expected ",
          inputs[0].defined() && inputs[0].dim() >= 1 ? inputs[0].size(0) : 0,
          " rows (as inputs[0]), got ",
          inputs[j].defined() ? inputs[j].str() : std::string("an undefined tensor"));
    if (mode_ == Determinism::bitwise)
      check_shard_bounds("DistributedDataParallel.forward", shard_bounds, inputs[0].size(0));
    return forward_rows(inputs, first_row, shard_bounds);
  } catch (...) {
    fail("forward");
  }
}

// ---- backward ----------------------------------------------------------------------------------

Tensor DistributedDataParallel::backward(const Tensor& grad_output) {
  try {
    std::fill(ready_.begin(), ready_.end(), 0);
    for (auto& b : buckets_) {
      b->pending = b->params.size();
      b->launched = false;
    }
    next_bucket_ = 0;
    buckets_overlapped_ = 0;
    in_backward_ = true;
    Tensor g = grad_output.defined() ? grad_output.to(comm_.device()) : grad_output;
    if (sync_) set_grad_homes(true);  // Note [DDP grads as bucket views]
    Tensor grad_input = module_.backward(g);
    set_grad_homes(false);
    in_backward_ = false;
    buckets_overlapped_ = next_bucket_;
    finish_backward();
    return grad_input;
  } catch (...) {
    set_grad_homes(false);
    in_backward_ = false;
    fail("backward");
  }
}

void DistributedDataParallel::set_grad_homes(bool on) {
  for (auto& b : buckets_)
    for (std::size_t k = 0; k < b->params.size(); ++k) {
      nn::Parameter& p = *params_[b->params[k]];
      p.grad_home = on && b->flat.defined() ? b->slot(k, p) : Tensor();
    }
}

void DistributedDataParallel::sync_gradients() {
  try {
    DITTO_CHECK(!join_enabled_,
                "DistributedDataParallel.sync_gradients: not available with "
                "enable_join() (the joined ranks shadow only the all_reduces of a backward)");
    // As a synchronised backward's finish, without the overlap: every bucket, in index order.
    for (auto& b : buckets_) {
      b->pending = 0;
      b->launched = false;
    }
    next_bucket_ = 0;
    buckets_overlapped_ = 0;
    launch_ready_buckets();
    comm_stream_->record(*comm_done_);
    current_stream(comm_.device()).wait(*comm_done_);
    comm_stream_->synchronize();  // rethrows the collectives' errors
    for (auto& b : buckets_) b->packed.clear();
  } catch (...) {
    fail("sync_gradients");
  }
}

void DistributedDataParallel::on_grad_ready(nn::Parameter& p) {
  if (!in_backward_) return;
  auto it = index_of_.find(&p);
  if (it == index_of_.end()) return;  // not a parameter of the wrapped module
  const std::size_t i = it->second;
  if (ready_[i]) return;
  ready_[i] = 1;
  Bucket& b = *buckets_[bucket_of_[i]];
  --b.pending;
  if (b.pending == 0 && sync_ && options_.overlap) launch_ready_buckets();
  if (observer_) observer_(p);
}

void DistributedDataParallel::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_]->pending == 0)
    launch(next_bucket_++);
}

void DistributedDataParallel::launch(std::size_t index) {
  Bucket& b = *buckets_[index];
  // The gradients were produced on this thread's current stream: the communication stream waits
  // for them, then copies them into the bucket, all-reduces it and copies the result back.
  Stream& compute = current_stream(comm_.device());
  compute.record(*grads_done_);
  comm_stream_->wait(*grads_done_);
  StreamGuard guard(*comm_stream_);
  if (!b.flat.defined()) b.flat = Tensor::empty({b.numel}, b.dtype, comm_.device());
  for (std::size_t k = 0; k < b.params.size(); ++k) {
    nn::Parameter& p = *params_[b.params[k]];
    if (!p.grad.defined())  // a parameter this backward did not reach: its gradient is zero
      p.grad = Tensor::zeros(p.data.shape(), b.dtype, comm_.device());
    Tensor slot = b.flat.narrow(b.offsets[k], p.data.numel());
    // Grads left as views of this slot by the last step (not zeroed with set_to_none, or in
    // no_sync) were accumulated in place: nothing to pack. A grad of another dtype than the
    // rule's (a module that allocated its own) is converted into the slot.
    if (p.grad.data_ptr() != slot.data_ptr()) {
      Tensor g = p.grad.view({p.data.numel()});
      if (g.dtype() != b.dtype) {
        g = ops::cast(g, b.dtype);
        b.packed.push_back(g);  // alive until the communication stream has read it
      }
      slot.copy_(g);
    }
  }
  comm_.all_reduce(b.flat, ReduceOp::sum);
  if (options_.average_gradients && comm_.size() > 1) {
    if (b.dtype == DType::f32)
      ops::scale_(b.flat, 1.0f / static_cast<float>(comm_.size()));
    else
      ops::scale_any_(b.flat, 1.0 / static_cast<double>(comm_.size()));
  }
  // Note [DDP grads as bucket views]: each grad becomes a view of its slot of the reduced bucket
  // (torch's gradient_as_bucket_view=True) instead of a copy back into the grad's own memory,
  // saving one gradient-sized copy per step. During a synchronised backward (not in no_sync,
  // whose grads a holder such as the GradAccumulator may move out and keep) the slot is also the
  // parameter's grad_home, so a backward after zero_grad(set_to_none), torch's default, creates
  // the grad in the slot (nn::new_grad) and the bucket needs no copy in either direction; torch's
  // DDP still copies a grad AccumulateGrad created into the bucket there. The values (and bits)
  // are the same; the bucket is overwritten by the next synchronised backward, so a grad kept
  // across a backward that does not accumulate into it (zero_grad(set_to_none) drops it) must
  // be cloned by its holder.
  for (std::size_t k = 0; k < b.params.size(); ++k) {
    nn::Parameter& p = *params_[b.params[k]];
    b.packed.push_back(std::move(p.grad));
    p.grad = b.slot(k, p);
  }
  b.launched = true;
}

void DistributedDataParallel::finish_backward() {
  if (sync_) {
    // Parameters the hook did not report (a module without the hook, or overlap disabled) are
    // ready now; the remaining buckets go in index order.
    for (auto& b : buckets_) b->pending = 0;
    launch_ready_buckets();
  }
  comm_stream_->record(*comm_done_);
  current_stream(comm_.device()).wait(*comm_done_);
  comm_stream_->synchronize();  // rethrows the collectives' errors (Timeout, a failed peer)
  for (auto& b : buckets_) b->packed.clear();
}

// ---- join (uneven inputs)
// ------------------------------------------------------------------------

bool DistributedDataParallel::exchange_join_flags(int my_flag, std::vector<std::int64_t>* out) {
  const int n = comm_.size();
  std::vector<std::int64_t> v(static_cast<std::size_t>(n), 0);
  v[static_cast<std::size_t>(comm_.rank())] = my_flag;
  std::vector<std::int64_t> flags;
  {
    StreamGuard guard(*comm_stream_);
    Tensor t = Tensor::from_vector(v, {n}, comm_.device());
    comm_.all_reduce(t, ReduceOp::sum);
    flags = t.to_vector<std::int64_t>();  // blocks; rethrows the all_reduce's error
  }
  bool any_sync = false, any_no_sync = false;
  for (int r = 0; r < n; ++r) {
    any_sync = any_sync || flags[static_cast<std::size_t>(r)] == 2;
    any_no_sync = any_no_sync || flags[static_cast<std::size_t>(r)] == 1;
  }
  if (any_sync || any_no_sync) {
    last_active_.clear();
    for (int r = 0; r < n; ++r)
      if (flags[static_cast<std::size_t>(r)] != 0) last_active_.push_back(r);
  }
  if (any_sync && any_no_sync) {
    std::string in_no_sync;
    for (int r = 0; r < n; ++r)
      if (flags[static_cast<std::size_t>(r)] == 1)
        in_no_sync += (in_no_sync.empty() ? "" : ", ") + std::to_string(r);
    throw InvalidArgument(detail::cat(
        "DistributedDataParallel.forward: the ranks disagree on gradient sync in this step: "
        "rank(s) ",
        in_no_sync,
        " are inside no_sync() and others are not (every rank must use "
        "no_sync() in the same steps)"));
  }
  if (out) *out = std::move(flags);
  return any_sync;
}

void DistributedDataParallel::shadow_all_reduces() {
  // This rank's grads may be views of the buckets (Note [DDP grads as bucket views]): give them
  // their own memory before the buckets carry the other ranks' sums, after the compute stream's
  // work that reads them (the last optimizer step).
  Stream& compute = current_stream(comm_.device());
  compute.record(*grads_done_);
  comm_stream_->wait(*grads_done_);
  StreamGuard guard(*comm_stream_);
  for (auto& b : buckets_)
    for (std::size_t k = 0; k < b->params.size(); ++k) {
      nn::Parameter& p = *params_[b->params[k]];
      if (p.grad.defined() && b->flat.defined() &&
          p.grad.data_ptr() == b->flat.narrow(b->offsets[k], 1).data_ptr())
        p.grad = p.grad.clone();
    }
  for (auto& b : buckets_) {
    if (!b->flat.defined()) b->flat = Tensor::empty({b->numel}, b->dtype, comm_.device());
    ops::fill_(b->flat, 0.0);
    comm_.all_reduce(b->flat, ReduceOp::sum);
  }
  comm_stream_->synchronize();
}

std::int64_t DistributedDataParallel::join() {
  DITTO_CHECK(join_enabled_, "DistributedDataParallel.join: call enable_join() on every rank "
                             "before training (the ranks' forwards must announce themselves)");
  try {
    std::int64_t shadowed = 0;
    for (;;) {
      std::vector<std::int64_t> flags;
      const bool sync = exchange_join_flags(0, &flags);
      if (std::all_of(flags.begin(), flags.end(), [](std::int64_t f) { return f == 0; })) break;
      ++shadowed;
      if (sync) shadow_all_reduces();
    }
    // Every rank has joined; the last to join holds the parameters of the final step.
    if (!last_active_.empty()) broadcast_from(last_active_.back());
    return shadowed;
  } catch (...) {
    fail("join");
  }
}

}  // namespace ditto::parallel
