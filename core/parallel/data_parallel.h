// parallel::DataParallel: single-process data parallelism, as torch.nn.DataParallel does it.
//
// Each forward: scatter the inputs along `dim` over the devices (torch.chunk sizes, so a batch
// smaller than the device count uses fewer devices), replicate the module onto those devices
// (parameters broadcast from devices[0] with broadcast_coalesced), run the replicas in parallel
// (parallel_apply, on a bounded set of host threads), and gather their outputs on the output
// device. backward(grad_output) is the explicit reverse pass: scatter grad_output back to the
// replicas (gather's backward), run their backward in parallel, and reduce the replicas' parameter
// gradients onto the module's parameters on devices[0] (reduce_add_coalesced, accumulating into
// existing grads like autograd). The optimizer then steps the module on devices[0]; the next
// forward replicates the updated parameters.
//
// Replicas are persistent clones of the module (made at the first forward that needs them,
// parameters rebound to the broadcast copies at every forward). Each forward copies the module's
// training() and step() to them (torch's replicate copies module.training) and sets each one's
// first_row() to the global row of its first input row (0, b0, b0 + b1, ... for chunk sizes b_i;
// the module itself gets 0 on one device), which keys its dropout masks (Note [Dropout masks]).
//
// With one device the module is called directly (as PyTorch does). The module's parameters must
// be on devices[0]. In bitwise mode the split follows micro-shard boundaries (see
// DataParallelOptions::determinism).
//
// Threads: several DataParallel models may train at once, each from its own host thread, over the
// same devices (as torch.nn.DataParallel models may): their forward and backward calls take turns
// on the host (one process-wide lock for each whole call; the devices run the queued work of both)
// and each model gets the bits it gets alone (Note [DataParallel models in several threads],
// data_parallel.cpp). One model's calls must come from one thread at a time.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "core/comm/communicator.h"
#include "core/nn/module.h"
#include "core/numerics/determinism.h"

namespace ditto::parallel {

struct DataParallelOptions {
  /// Device for the gathered output (torch: output_device); default devices[0]. May be the host.
  std::optional<Device> output_device;
  /// Dimension along which inputs are scattered and outputs gathered.
  std::int64_t dim = 0;
  /// Reduction order of the gradient reduction (and of the replicas' kernels). In bitwise mode
  /// the batch is scattered along micro-shard boundaries instead of torch.chunk sizes, and every
  /// device runs a replica even when its share of a small batch is empty (Note [Micro-shards]),
  /// so the parameters come out the same, bit for bit, for 1, 2, 4, ... micro_shards devices.
  Determinism determinism = Determinism::fast;
  /// Micro-shards K of a global batch in bitwise mode (a power of two >= the device count).
  std::int64_t micro_shards = 64;
  /// Bucket size in bytes for broadcast_coalesced / reduce_add_coalesced (torch uses 10 MiB).
  std::size_t buffer_size = std::size_t(10) << 20;
  /// CommOptions::timeout_ms of the communicators it makes over its devices (ms, 1 ..
  /// kMaxCommTimeoutMs; torch.distributed's timeout=): ditto-train's --comm-timeout-ms. Throws
  /// InvalidArgument outside that range.
  std::int64_t comm_timeout_ms = CommOptions{}.timeout_ms;
};

class DataParallel {
 public:
  /// Wrap `module` (not owned; must outlive this object) for `devices` (non-empty, distinct, one
  /// non-cpu backend). Throws InvalidArgument when the list is bad or a parameter of the module is
  /// not on devices[0] or not f32, bf16 or f16 (naming the parameter and its device or dtype).
  /// bf16 / f16 parameters replicate in their dtype; their gradients (nn::grad_dtype: f32 in
  /// bitwise mode, the parameters' dtype in fast mode) reduce in the gradients' dtype.
  DataParallel(nn::Module& module, std::vector<Device> devices, DataParallelOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  /// Forward of a single-input module. input: [B, ...] on any device (host included).
  /// Returns the gathered output on the output device.
  Tensor forward(const Tensor& input);
  /// Forward with several inputs (e.g. {x, target} for a module ending in a loss). Every input
  /// must have the same size along dim and is split the same way. Replicas returning 0-dim
  /// tensors are gathered into a vector with one entry per replica that received rows (as
  /// PyTorch does, with a warning there: torch.nn.DataParallel scatters B < devices rows to B
  /// replicas). In bitwise mode every device runs, but a device given no rows (B < devices)
  /// adds nothing to the output, so both modes return min(B, devices) entries (one for B = 0).
  Tensor forward(const std::vector<Tensor>& inputs);
  /// Forward of a block of a larger global batch (a micro-step of gradient accumulation, Note
  /// [Gradient accumulation] in core/train/grad_accumulation.h): the inputs' rows are rows
  /// [first_row, first_row + B) of the global batch, so the replicas' first_row() are offset by
  /// it (Note [Dropout masks]); in bitwise mode `shard_bounds` are the micro-shard bounds of these
  /// B rows (rebased to 0: local_bounds of the global ones, at least one shard per device) and
  /// device d takes shards [d*S/D, (d+1)*S/D) of its S shards instead of micro_shards' split of
  /// B; ignored in fast mode. forward(inputs) is forward(inputs, 0, micro_shard_bounds(B,
  /// micro_shards)). Throws InvalidArgument for first_row < 0 or bad bounds (bitwise), and as
  /// forward(inputs).
  Tensor forward(const std::vector<Tensor>& inputs, std::int64_t first_row,
                 const std::vector<std::int64_t>& shard_bounds);

  /// Reverse pass of the last forward. grad_output: shape and dtype of the gathered output, any
  /// device. Accumulates into the module's parameter grads on devices[0]. Returns the gradient of
  /// the first input gathered on that input's device when the module's input_requires_grad(),
  /// else an undefined tensor. Throws InvalidArgument without a preceding forward, or for a
  /// grad_output of another shape or dtype (naming the output's); such a refusal keeps the
  /// forward, so a corrected backward may follow.
  Tensor backward(const Tensor& grad_output);

  nn::Module& module() { return module_; }
  const std::vector<Device>& devices() const { return devices_; }
  const Device& output_device() const { return output_device_; }
  /// Replicas used by the last forward (fewer than devices() for a small batch).
  int last_num_replicas() const { return static_cast<int>(last_chunks_.size()); }
  /// Rows along dim that each replica received in the last forward.
  const std::vector<std::int64_t>& last_chunk_sizes() const { return last_chunks_; }

 private:
  Tensor forward_rows(const std::vector<Tensor>& inputs, std::int64_t first_row,
                      const std::vector<std::int64_t>* shard_bounds);
  void replicate(int n);
  /// Builds (or keeps) the persistent buckets for `params` (f32, bf16 or f16; InvalidArgument
  /// naming a parameter that is not).
  void ensure_buckets(const std::vector<nn::Parameter*>& params);

  /// Note [Persistent replica buffers] (data_parallel.cpp): one bucket of consecutive parameters.
  struct Bucket {
    std::vector<std::size_t> params;  ///< indices into module().parameters()
    std::int64_t numel = 0;
    DType dtype = DType::f32;        ///< of every parameter in the bucket
    std::vector<Tensor> param_flat;  ///< [d]: packed parameters on devices_[d]
    std::vector<Tensor> grad_flat;   ///< [d]: packed gradients of replica d on devices_[d]
  };
  /// Communicator over devices_[0, n) (made on first use), for the buckets' broadcast and reduce.
  std::vector<Communicator>& comms(int n);
  std::map<int, std::vector<Communicator>> comms_;
  std::vector<Bucket> buckets_;
  std::vector<Shape> bucket_shapes_;                ///< parameter shapes the buckets were built for
  std::vector<DType> bucket_dtypes_;                ///< and their dtypes
  std::vector<std::vector<Tensor>> replica_views_;  ///< [d][k]: parameter k's view in param_flat
  std::vector<std::pair<std::size_t, std::int64_t>> param_slot_;  ///< [k]: (bucket, offset)

  nn::Module& module_;
  std::vector<Device> devices_;
  DataParallelOptions options_;
  Device output_device_;
  std::vector<std::unique_ptr<nn::Module>> replicas_;  // replicas_[i] runs on devices_[i]
  std::vector<std::int64_t> last_chunks_;
  std::vector<Device> last_input_devices_;
  Shape last_output_shape_;
  DType last_output_dtype_ = DType::f32;
  std::vector<Shape> replica_output_shapes_;
  std::vector<bool> in_output_;  ///< [i]: replica i's output is part of the gathered output
  bool has_forward_ = false;
};

}  // namespace ditto::parallel
