// DataParallel: scatter, replicate, parallel_apply, gather; and the reverse pass.
#include "core/parallel/data_parallel.h"

#include <mutex>
#include <set>

#include "core/base/error.h"
#include "core/comm/comm.h"
#include "core/nn/checked_clone.h"
#include "core/numerics/micro_shards.h"
#include "core/parallel/parallel_apply.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"

namespace ditto::parallel {

namespace {
// A DataParallel built before init_backend re-created its backend holds that instance's
// parameters, replica buffers and communicators (Note [Tensors of a replaced backend],
// core/runtime/tensor.cpp): `call` refuses before scattering anything, naming the first
// parameter of the old instance. Without it, with fewer devices, the input was scattered to the
// first devices before an allocation on a device the live instance lacks failed.
void check_parameters_live(const char* call, nn::Module& module) {
  for (const nn::Parameter* p : module.parameters()) {
    const Tensor& t = p->data;
    if (!t.defined() || t.device().is_cpu()) continue;
    DITTO_CHECK(&t.buffer()->backend() == &get_backend(t.device().type), call, ": parameter '",
                p->name, "' (", t.str(), ") was made on an instance of backend ", t.device().type,
                " that init_backend has since re-initialised: build the model and its "
                "DataParallel again on the live instance");
  }
}
}  // namespace

DataParallel::DataParallel(nn::Module& module, std::vector<Device> devices,
                           DataParallelOptions options)
    : module_(module), devices_(std::move(devices)), options_(options) {
  DITTO_CHECK(!devices_.empty(), "DataParallel: devices: expected at least one device, got an "
                                 "empty list");
  std::set<Device> seen;
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    const Device& d = devices_[i];
    DITTO_CHECK(!d.is_cpu(), "DataParallel: devices[", i,
                "]: expected a sim or cuda device, got cpu");
    DITTO_CHECK(d.type == devices_[0].type, "DataParallel: devices[", i, "]: expected a ",
                devices_[0].type, " device like devices[0], got ", d.str());
    d.backend();  // throws when out of range
    DITTO_CHECK(seen.insert(d).second, "DataParallel: devices[", i, "]: device ", d.str(),
                " is repeated");
  }
  DITTO_CHECK(options_.comm_timeout_ms > 0 && options_.comm_timeout_ms <= kMaxCommTimeoutMs,
              "DataParallel: options.comm_timeout_ms: expected a positive number of milliseconds "
              "<= ",
              kMaxCommTimeoutMs, " (2^31, about 24.9 days), got ", options_.comm_timeout_ms);
  const std::vector<nn::Parameter*> params = module_.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const nn::Parameter* p = params[i];
    DITTO_CHECK(p->data.device() == devices_[0],
                "DataParallel: module must have its parameters on ", devices_[0].str(),
                " (devices[0]) but parameter '", p->name, "' is on ", p->data.device().str());
    // The replica buckets hold f32, bf16 or f16 parameters (Note [Mixed precision]).
    DITTO_CHECK(nn::is_float_storage(p->data.dtype()), "DataParallel: parameter ", i, " ('",
                p->name, "'): expected dtype f32, bf16 or f16, got ", p->data.str());
  }
  if (options_.determinism == Determinism::bitwise) {
    const std::int64_t k = options_.micro_shards;
    DITTO_CHECK(k >= 1 && k <= kMaxMicroShards && (k & (k - 1)) == 0,
                "DataParallel: micro_shards: expected a power of two in [1, ", kMaxMicroShards,
                "], got ", k);
    DITTO_CHECK(static_cast<std::int64_t>(devices_.size()) <= k, "DataParallel: bitwise mode with ",
                k, " micro-shards supports at most ", k, " devices, got ", devices_.size(),
                " (raise micro_shards)");
  }
  output_device_ = options_.output_device.value_or(devices_[0]);
  if (!output_device_.is_cpu()) output_device_.backend();
  module_.set_determinism(options_.determinism);
}

DataParallel::~DataParallel() = default;

// Note [DataParallel models in several threads]
// torch.nn.DataParallel models trained at once in several host threads over the same GPUs just
// work: torch.cuda.comm's NCCL launches run under the CUDA caching allocator's free mutex
// (torch/csrc/cuda/nccl.cpp; c10d's AutoNcclGroup), and the GIL orders the rest of each step's
// host side. Here two DataParallel models' calls interleaved on the devices' default streams:
// one model's replicas blocked in their host-to-device input copies (parallel_apply's threads)
// behind the other model's broadcast, which waited for a rank queued behind them, and both
// stopped until the collective timeout (tester helper-87: 5 of 6 runs of two 4-device MLPs over
// 300 steps failed with a Timeout, the default timeout a 5-minute hang). A process-wide lock
// taken for the whole of each forward and backward (forward_rows and backward) orders those
// host sides one after another: each call enqueues all of its work (replication, the replicas'
// copies and kernels, the gather; the gradients' reduce) before another model's call starts,
// while the devices still run the two models' queued work as it comes. Serialising only each
// collective's launch (one lock around the single-controller forms' enqueue, as torch's free
// mutex does) was tried and did not remove the timeouts (4 of 9 runs failed). One model's
// calls come from one thread at a time anyway (the module and its buffers are not guarded
// otherwise). A DataParallel inside a replica's module (nested: its calls come from a replica,
// on parallel_apply's threads or inline on the caller's) runs under the outer call's lock and
// does not take it again, so nesting works as before.
namespace {
std::mutex& calls_mutex() {
  static std::mutex m;
  return m;
}
thread_local bool t_in_replica = false;  // this thread runs a DataParallel replica's work

// Holds the calls' lock for one forward or backward unless this thread runs a replica of an
// outer DataParallel call, which holds it.
class OneCallAtATime {
 public:
  OneCallAtATime() : lock_(calls_mutex(), std::defer_lock) {
    if (!t_in_replica) lock_.lock();
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

// Marks this thread as running a replica for the scope (restoring what it was: replica 0 may run
// inline on the caller's thread).
class ReplicaScope {
 public:
  ReplicaScope() : was_(t_in_replica) { t_in_replica = true; }
  ~ReplicaScope() { t_in_replica = was_; }
  ReplicaScope(const ReplicaScope&) = delete;
  ReplicaScope& operator=(const ReplicaScope&) = delete;

 private:
  bool was_;
};
}  // namespace

Tensor DataParallel::forward(const Tensor& input) { return forward(std::vector<Tensor>{input}); }

// Note [Persistent replica buffers]
// torch.nn.DataParallel replicates the module with broadcast_coalesced and reduces the gradients
// with reduce_add_coalesced, which pack the tensors of each bucket (consecutive parameters up to
// buffer_size bytes) into fresh flat buffers on every step and move them with NCCL's broadcast and
// reduce. Here each bucket keeps its flat buffers from step to step (the packed parameters and
// each replica's packed gradients on every device), and they move with a Communicator over the
// replicas' devices: broadcast from devices[0], reduce onto devices[0]. The reduction is the one
// reduce_add does (sum over the replicas in device order: in bitwise mode the canonical tree over
// rank index, Note [Canonical tree]; left to right in fast mode), so the values are the same bits;
// what goes is allocating and first touching about 3 model-sized buffers per device per step
// (page faults were ~20% of a 4-device step of a 7 MB MLP) and the staging copies onto
// devices[0] (the simulator's reduce reads every rank's buffer in place, all ranks in parallel).
// The gradient sums land in a fresh tensor each step (the module's grads are views of it, as
// before). Buckets are rebuilt when the parameters' shapes or dtypes change. Parameters are f32,
// bf16 or f16 (checked by the constructor, and again here for a parameter replaced since); a
// bucket holds parameters of one dtype (a new one starts where the dtype changes), its packed
// parameters in that dtype and its packed gradients in nn::grad_dtype of it (bitwise: f32, so
// the reduce over replicas rounds nowhere but once, Note [Reductions over ranks]; fast: the
// parameters' dtype, llm.c's bf16 gradient reduction).
std::vector<Communicator>& DataParallel::comms(int n) {
  auto it = comms_.find(n);
  if (it != comms_.end()) return it->second;
  CommOptions o;
  o.determinism = options_.determinism;
  o.timeout_ms = options_.comm_timeout_ms;
  std::vector<Device> devs(devices_.begin(), devices_.begin() + n);
  return comms_.emplace(n, Communicator::init_all(devs, o)).first->second;
}

void DataParallel::ensure_buckets(const std::vector<nn::Parameter*>& params) {
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  shapes.reserve(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    DITTO_CHECK(nn::is_float_storage(params[i]->data.dtype()), "DataParallel: parameter ", i, " ('",
                params[i]->name, "'): expected dtype f32, bf16 or f16, got ",
                params[i]->data.str());
    shapes.push_back(params[i]->data.shape());
    dtypes.push_back(params[i]->data.dtype());
  }
  if (!buckets_.empty() && shapes == bucket_shapes_ && dtypes == bucket_dtypes_) return;
  buckets_.clear();
  param_slot_.assign(params.size(), {0, 0});
  const std::size_t n_dev = devices_.size();
  std::size_t bytes = 0;
  for (std::size_t k = 0; k < params.size(); ++k) {
    const std::size_t b = params[k]->data.nbytes();
    if (buckets_.empty() || buckets_.back().dtype != dtypes[k] ||
        (bytes + b > options_.buffer_size && !buckets_.back().params.empty())) {
      buckets_.emplace_back();
      buckets_.back().dtype = dtypes[k];
      bytes = 0;
    }
    Bucket& bk = buckets_.back();
    param_slot_[k] = {buckets_.size() - 1, bk.numel};
    bk.params.push_back(k);
    bk.numel += params[k]->data.numel();
    bytes += b;
  }
  for (Bucket& bk : buckets_) {
    for (std::size_t d = 0; d < n_dev; ++d) {
      bk.param_flat.push_back(Tensor::empty({bk.numel}, bk.dtype, devices_[d]));
      bk.grad_flat.push_back(
          Tensor::empty({bk.numel}, nn::grad_dtype(bk.dtype, options_.determinism), devices_[d]));
    }
  }
  replica_views_.assign(n_dev, std::vector<Tensor>(params.size()));
  for (std::size_t d = 0; d < n_dev; ++d)
    for (std::size_t k = 0; k < params.size(); ++k) {
      const auto [b, off] = param_slot_[k];
      replica_views_[d][k] =
          buckets_[b].param_flat[d].narrow(off, params[k]->data.numel()).view(shapes[k]);
    }
  bucket_shapes_ = std::move(shapes);
  bucket_dtypes_ = std::move(dtypes);
}

void DataParallel::replicate(int n) {
  if (static_cast<int>(replicas_.size()) < n) replicas_.resize(static_cast<std::size_t>(n));
  std::vector<nn::Parameter*> params = module_.parameters();
  std::vector<Tensor> data;
  data.reserve(params.size());
  for (nn::Parameter* p : params) data.push_back(p->data);
  std::vector<std::vector<Tensor>> copies;
  if (!data.empty()) {  // Note [Persistent replica buffers]
    ensure_buckets(params);
    copies.assign(static_cast<std::size_t>(n), data);  // replica 0 shares the module's tensors
    for (Bucket& bk : buckets_) {
      std::size_t off = 0;
      for (std::size_t k : bk.params) {
        const Tensor& t = data[k];
        detail::copy_block(bk.param_flat[0], off, t.nbytes(), t, 0, t.nbytes(), t.nbytes(), 1);
        off += t.nbytes();
      }
      if (n > 1) {
        std::vector<Tensor> flats(bk.param_flat.begin(), bk.param_flat.begin() + n);
        broadcast(comms(n), flats, 0);
      }
    }
    for (int d = 1; d < n; ++d)
      copies[static_cast<std::size_t>(d)] = replica_views_[static_cast<std::size_t>(d)];
  }
  for (int i = 0; i < n; ++i) {
    auto& r = replicas_[static_cast<std::size_t>(i)];
    if (!r) r = nn::checked_clone(module_, "DataParallel: the module's replica");
    r->set_input_requires_grad(module_.input_requires_grad());
    r->set_determinism(options_.determinism);
    r->set_training(module_.training());  // module.train() / eval() since the last forward
    r->set_step(module_.step());
    std::vector<nn::Parameter*> rp = r->parameters();
    DITTO_ASSERT(rp.size() == params.size());
    for (std::size_t k = 0; k < rp.size(); ++k) {
      rp[k]->data = copies[static_cast<std::size_t>(i)][k];
      rp[k]->grad = Tensor();
    }
  }
}

Tensor DataParallel::forward(const std::vector<Tensor>& inputs) {
  return forward_rows(inputs, 0, nullptr);
}

Tensor DataParallel::forward(const std::vector<Tensor>& inputs, std::int64_t first_row,
                             const std::vector<std::int64_t>& shard_bounds) {
  DITTO_CHECK(first_row >= 0, "DataParallel.forward: first_row: expected >= 0, got ", first_row);
  return forward_rows(inputs, first_row, &shard_bounds);
}

Tensor DataParallel::forward_rows(const std::vector<Tensor>& inputs, std::int64_t first_row,
                                  const std::vector<std::int64_t>* given_bounds) {
  OneCallAtATime one_call;  // Note [DataParallel models in several threads]
  DITTO_CHECK(!inputs.empty(), "DataParallel.forward: inputs: expected at least one tensor");
  check_parameters_live("DataParallel.forward", module_);
  const std::int64_t dim = options_.dim;
  for (std::size_t j = 0; j < inputs.size(); ++j) {
    DITTO_CHECK(inputs[j].defined(), "DataParallel.forward: inputs[", j, "] is undefined");
    DITTO_CHECK(dim < inputs[j].dim(), "DataParallel.forward: inputs[", j, "]: expected at least ",
                dim + 1, " dims to scatter along dim ", dim, ", got ", inputs[j].str());
    DITTO_CHECK(inputs[j].size(dim) == inputs[0].size(dim), "DataParallel.forward: inputs[", j,
                "]: expected size ", inputs[0].size(dim), " along dim ", dim,
                " (as inputs[0]), got ", inputs[j].str());
  }
  has_forward_ = false;
  last_input_devices_.clear();
  for (const Tensor& t : inputs) last_input_devices_.push_back(t.device());
  const std::int64_t batch = inputs[0].size(dim);

  const bool bitwise = options_.determinism == Determinism::bitwise;
  std::vector<std::int64_t> shard_bounds;
  if (bitwise && given_bounds) {  // a block of a larger batch (Note [Gradient accumulation])
    check_shard_bounds("DataParallel.forward", *given_bounds, batch);
    DITTO_CHECK(given_bounds->size() - 1 >= devices_.size(),
                "DataParallel.forward: "
                "shard_bounds: bitwise mode gives every device whole micro-shards: expected at "
                "least ",
                devices_.size(), " shards (the devices), got ", given_bounds->size() - 1);
    shard_bounds = *given_bounds;
  } else if (bitwise) {
    shard_bounds = micro_shard_bounds(batch, options_.micro_shards);
  }

  if (devices_.size() == 1) {
    std::vector<Tensor> moved;
    for (const Tensor& t : inputs) moved.push_back(t.to(devices_[0]));
    if (bitwise) module_.set_micro_shards(shard_bounds);
    module_.set_first_row(first_row);  // the whole batch (Note [Dropout masks])
    Tensor out = module_.forward(moved);
    last_chunks_ = {batch};
    last_output_shape_ = out.shape();
    last_output_dtype_ = out.dtype();
    has_forward_ = true;
    return out.device() == output_device_ ? out : out.to(output_device_);
  }

  // fast: torch.chunk sizes (fewer replicas for a small batch); bitwise: every device takes the
  // rows of its micro-shards [d*K/D, (d+1)*K/D), possibly none.
  std::vector<std::int64_t> chunks;
  std::vector<std::vector<std::int64_t>> local_shards;
  const auto n_dev = static_cast<std::int64_t>(devices_.size());
  if (bitwise) {
    const auto k = static_cast<std::int64_t>(shard_bounds.size()) - 1;
    for (std::int64_t d = 0; d < n_dev; ++d) {
      const std::int64_t first = d * k / n_dev, last = (d + 1) * k / n_dev;
      chunks.push_back(shard_bounds[static_cast<std::size_t>(last)] -
                       shard_bounds[static_cast<std::size_t>(first)]);
      local_shards.push_back(local_bounds(shard_bounds, first, last));
    }
  } else {
    chunks = comm::chunk_sizes(batch, n_dev);
    if (chunks.empty()) chunks = {0};  // an empty batch still runs one replica
  }
  const int n = static_cast<int>(chunks.size());
  std::vector<Device> devs(devices_.begin(), devices_.begin() + n);
  // Host inputs split along dim 0 are copied by each replica's own thread inside parallel_apply:
  // a host-to-device copy blocks until the device's stream has run it, so the n copies overlap
  // instead of waiting one after another (the same rows land on the same devices as
  // comm::scatter would put them). Other inputs are scattered here.
  std::vector<std::vector<Tensor>> per_replica(static_cast<std::size_t>(n));
  std::vector<std::int64_t> starts(static_cast<std::size_t>(n), 0);
  for (int i = 1; i < n; ++i)
    starts[static_cast<std::size_t>(i)] =
        starts[static_cast<std::size_t>(i - 1)] + chunks[static_cast<std::size_t>(i - 1)];
  std::vector<bool> copy_in_replica(inputs.size(), false);
  for (std::size_t j = 0; j < inputs.size(); ++j) {
    copy_in_replica[j] = dim == 0 && inputs[j].device().is_cpu();
    if (copy_in_replica[j]) {
      for (int i = 0; i < n; ++i) per_replica[static_cast<std::size_t>(i)].push_back(Tensor());
      continue;
    }
    std::vector<Tensor> parts = comm::scatter(inputs[j], devs, chunks, dim);
    for (int i = 0; i < n; ++i)
      per_replica[static_cast<std::size_t>(i)].push_back(parts[static_cast<std::size_t>(i)]);
  }
  replicate(n);
  for (int i = 0; i < n; ++i) {
    nn::Module& r = *replicas_[static_cast<std::size_t>(i)];
    if (bitwise) r.set_micro_shards(local_shards[static_cast<std::size_t>(i)]);
    r.set_first_row(first_row + starts[static_cast<std::size_t>(i)]);  // its rows' global place
  }
  std::vector<Tensor> outputs(static_cast<std::size_t>(n));
  parallel_apply(devs, "forward", [&](int i) {
    ReplicaScope replica;
    const auto r = static_cast<std::size_t>(i);
    for (std::size_t j = 0; j < inputs.size(); ++j)
      if (copy_in_replica[j])
        per_replica[r][j] = inputs[j].narrow(starts[r], chunks[r]).to(devs[r]);
    outputs[r] = replicas_[r]->forward(per_replica[r]);
  });
  replica_output_shapes_.clear();
  for (const Tensor& o : outputs) replica_output_shapes_.push_back(o.shape());
  // A replica given no rows (bitwise, B < devices) ran for the gradient reduction's sake but is
  // not in the output: torch.nn.DataParallel gathers min(B, devices) replicas, as fast mode does
  // (an empty batch: replica 0 alone, as fast mode runs it).
  in_output_.assign(static_cast<std::size_t>(n), false);
  std::vector<Tensor> gathered;
  for (int i = 0; i < n; ++i)
    if (chunks[static_cast<std::size_t>(i)] > 0 || (batch == 0 && i == 0)) {
      in_output_[static_cast<std::size_t>(i)] = true;
      gathered.push_back(outputs[static_cast<std::size_t>(i)]);
    }
  Tensor out = comm::gather(gathered, dim, output_device_);
  last_chunks_ = chunks;
  last_output_shape_ = out.shape();
  last_output_dtype_ = out.dtype();
  has_forward_ = true;
  return out;
}

Tensor DataParallel::backward(const Tensor& grad_output) {
  OneCallAtATime one_call;  // Note [DataParallel models in several threads]
  DITTO_CHECK(has_forward_, "DataParallel.backward: no forward to go back through (call forward "
                            "first; each forward allows one backward)");
  // Shape and dtype up front, the forward kept on a refusal: a replica refusing the dtype named
  // its slice, and the forward was gone for a corrected retry (tester hB, 6).
  DITTO_CHECK(grad_output.defined() && grad_output.shape() == last_output_shape_ &&
                  grad_output.dtype() == last_output_dtype_,
              "DataParallel.backward: grad_output: expected shape ", shape_str(last_output_shape_),
              " and dtype ", dtype_name(last_output_dtype_), " (the last output), got ",
              grad_output.str());
  check_parameters_live("DataParallel.backward", module_);
  has_forward_ = false;

  if (devices_.size() == 1) {
    Tensor g = module_.backward(grad_output.to(devices_[0]));
    return g.defined() ? g.to(last_input_devices_[0]) : g;
  }

  const int n = static_cast<int>(last_chunks_.size());
  std::vector<Device> devs(devices_.begin(), devices_.begin() + n);
  const bool scalar_outputs = replica_output_shapes_[0].empty();
  // The gathered replicas get their part of grad_output; one left out of the output (no rows)
  // gets zeros of its output's shape.
  std::vector<std::int64_t> sizes;
  std::vector<Device> out_devs;
  for (int i = 0; i < n; ++i) {
    if (!in_output_[static_cast<std::size_t>(i)]) continue;
    const Shape& s = replica_output_shapes_[static_cast<std::size_t>(i)];
    sizes.push_back(scalar_outputs ? 1 : s[static_cast<std::size_t>(options_.dim)]);
    out_devs.push_back(devs[static_cast<std::size_t>(i)]);
  }
  std::vector<Tensor> parts =
      comm::scatter(grad_output, out_devs, sizes, scalar_outputs ? 0 : options_.dim);
  std::vector<Tensor> grads(static_cast<std::size_t>(n));
  for (int i = 0, j = 0; i < n; ++i) {
    const auto r = static_cast<std::size_t>(i);
    if (in_output_[r]) {
      grads[r] = parts[static_cast<std::size_t>(j++)];
      if (scalar_outputs) grads[r] = grads[r].view({});
    } else {
      grads[r] = Tensor::zeros(replica_output_shapes_[r], grad_output.dtype(), devs[r]);
    }
  }

  std::vector<Tensor> grad_inputs(static_cast<std::size_t>(n));
  parallel_apply(devs, "backward", [&](int i) {
    ReplicaScope replica;
    grad_inputs[static_cast<std::size_t>(i)] =
        replicas_[static_cast<std::size_t>(i)]->backward(grads[static_cast<std::size_t>(i)]);
  });

  // Reduce the replicas' gradients onto devices[0] and accumulate into the module's grads.
  std::vector<nn::Parameter*> params = module_.parameters();
  if (!params.empty()) {  // Note [Persistent replica buffers]
    ensure_buckets(params);
    std::vector<Tensor> sums(params.size());
    for (Bucket& bk : buckets_) {
      for (int i = 0; i < n; ++i) {
        const auto d = static_cast<std::size_t>(i);
        std::vector<nn::Parameter*> rp = replicas_[d]->parameters();
        std::int64_t off = 0;
        const DType gd = bk.grad_flat[d].dtype();
        for (std::size_t k : bk.params) {
          const Tensor& g = rp[k]->grad;
          const std::int64_t numel = params[k]->data.numel();
          if (g.defined()) {  // else a parameter the replica did not use: zeros
            DITTO_CHECK(g.dtype() == gd, "DataParallel.backward: replica ", i, " parameter ", k,
                        " ('", params[k]->name, "'): expected a ", dtype_name(gd),
                        " gradient (nn::grad_dtype of its ", dtype_name(bk.dtype), " data), got ",
                        g.str());
            detail::copy_block(bk.grad_flat[d], static_cast<std::size_t>(off) * dtype_size(gd),
                               g.nbytes(), g, 0, g.nbytes(), g.nbytes(), 1);
          } else {
            Tensor z = bk.grad_flat[d].narrow(off, numel);
            ops::fill_(z, 0.0f);
          }
          off += numel;
        }
      }
      Tensor out = Tensor::empty({bk.numel}, bk.grad_flat[0].dtype(), devices_[0]);
      std::vector<Tensor> send(bk.grad_flat.begin(), bk.grad_flat.begin() + n);
      std::vector<Tensor> recv(static_cast<std::size_t>(n));  // ignored off the root
      recv[0] = out;
      reduce(comms(n), send, recv, ReduceOp::sum, 0);
      for (std::size_t k : bk.params) {
        const std::int64_t off = param_slot_[k].second;
        sums[k] = out.narrow(off, params[k]->data.numel()).view(params[k]->data.shape());
      }
    }
    for (std::size_t k = 0; k < params.size(); ++k) {
      if (!params[k]->grad.defined())
        params[k]->grad = sums[k];
      else
        ops::axpy_(1.0f, sums[k], params[k]->grad);
    }
  }
  if (!module_.input_requires_grad()) return Tensor();
  // A module whose backward returns no input gradient (a first layer of the user's) gives none
  // on any device count, as on one device (tester7's F6: comm::gather refused the undefined
  // tensors with a message about its own argument); some replicas with and some without is the
  // module's error.
  std::string with, without;
  for (int i = 0; i < n; ++i)
    (grad_inputs[static_cast<std::size_t>(i)].defined() ? with : without) += detail::cat(" ", i);
  if (with.empty()) return Tensor();
  DITTO_CHECK(without.empty(),
              "DataParallel.backward: the replicas' backward returned an input "
              "gradient on replicas",
              with, " and none on replicas", without,
              ": expected one on every replica (or none on any)");
  return comm::gather(grad_inputs, options_.dim, last_input_devices_[0]);
}

}  // namespace ditto::parallel
