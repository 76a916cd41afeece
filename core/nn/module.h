// nn::Module: layers with explicit forward and backward (no general autograd).
//
// A module keeps what its backward needs from the last forward (one forward in flight per module
// instance; DataParallel gives each device its own replica). backward(grad_output) accumulates
// into its parameters' grad tensors (allocating them on first use) and returns the gradient with
// respect to its first input, or an undefined Tensor when input_requires_grad() is false.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/base/non_copyable.h"
#include "core/numerics/determinism.h"
#include "core/runtime/tensor.h"

namespace ditto::nn {

/// The dtype of a parameter's gradient (Note [Mixed precision], core/runtime/mixed_precision.h):
/// fast mode: the parameter's dtype (llm.c: bf16 gradients, bf16 all_reduce); bitwise mode: f32,
/// whatever the parameter's dtype, because a bf16 gradient rounded at a device's subtree of the
/// micro-shard tree would depend on the device count, while in f32 the micro-shard tree, the
/// rank tree and the accumulation tree round nowhere (Note [Reductions over ranks]). f32
/// parameters get f32 gradients in both modes. Every module allocating a grad uses it.
/// `param` must be f32, bf16 or f16 (InvalidArgument naming it otherwise).
DType grad_dtype(DType param, Determinism mode);

/// f32, bf16 or f16: the dtypes a model's parameters and activations may have.
constexpr bool is_float_storage(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

/// A learnable tensor and its gradient (grad undefined until the first backward or zero_grad).
struct Parameter {
  std::string name;  ///< e.g. "0.weight" within a Sequential
  Tensor data;
  Tensor grad;
  /// Where a gradient this parameter does not have yet is created (undefined: a new tensor).
  /// DistributedDataParallel sets it to the parameter's slot in its bucket for the length of a
  /// synchronised backward, so a backward after zero_grad(set_to_none) writes the gradient
  /// there and the bucket needs no copy (Note [DDP grads as bucket views]). Used only while it
  /// matches the grad wanted (data's shape, the grad's dtype, the device); otherwise ignored.
  Tensor grad_home = Tensor();
};

/// p.grad, created if undefined: p.grad_home when it has `data`'s shape, `dtype` and `device`,
/// else a new tensor; its values are unspecified (the caller overwrites them, or passes
/// zero = true for zeros). A defined grad is returned as it is. The modules' backwards create
/// their parameters' grads through it, except GPT's bitwise wte grad, which is the root of a
/// tree of per-shard tensors and is moved in whole (DDP then copies it into its bucket).
Tensor& new_grad(Parameter& p, DType dtype, const Device& device, bool zero = false);

class Module : public NonCopyable {
 public:
  /// Short type name ("Linear", "Sequential").
  virtual std::string name() const = 0;

  /// Forward for single-input modules. Default throws InvalidArgument ("takes N inputs").
  virtual Tensor forward(const Tensor& input);
  /// Forward with several inputs (e.g. input and target for a module that ends in a loss).
  /// Default: expects exactly one input and calls forward(input).
  virtual Tensor forward(const std::vector<Tensor>& inputs);
  /// Number of inputs forward expects (1 unless overridden).
  virtual int num_inputs() const { return 1; }

  /// Backward of the last forward: accumulates parameter gradients, returns d(output)/d(input 0)
  /// contracted with grad_output (undefined when !input_requires_grad()).
  virtual Tensor backward(const Tensor& grad_output) = 0;

  /// Parameters in a fixed order (pointers valid while the module lives).
  virtual std::vector<Parameter*> parameters() { return {}; }

  /// A module of the same structure and settings whose parameters share this one's data tensors
  /// (grads undefined). DataParallel rebinds the replica's parameter data to per-device copies.
  virtual std::unique_ptr<Module> clone() const = 0;

  /// Whether backward must produce the input gradient (false for a network's first layer saves
  /// a GEMM). Containers pass it to their first child.
  virtual void set_input_requires_grad(bool v) { input_requires_grad_ = v; }
  bool input_requires_grad() const { return input_requires_grad_; }

  /// Reduction order used by this module's kernels (containers pass it on).
  virtual void set_determinism(Determinism d) { determinism_ = d; }
  Determinism determinism() const { return determinism_; }

  /// Micro-shard boundaries of the next forward's batch (Note [Micro-shards] in
  /// core/numerics/micro_shards.h): S+1 ascending row offsets from 0 to the batch size. In bitwise
  /// mode the batch reductions of backward (weight and bias gradients) sum rows in order inside
  /// each micro-shard and combine the shards with the canonical tree. Empty (the default) means
  /// kDefaultMicroShards shards over the whole batch. DataParallel sets each replica's local
  /// shards. Containers pass it on.
  virtual void set_micro_shards(std::vector<std::int64_t> bounds) {
    micro_shards_ = std::move(bounds);
  }
  const std::vector<std::int64_t>& micro_shards() const { return micro_shards_; }

  /// torch's Module.train() / eval(): training mode turns Dropout on (default true).
  /// Containers pass it on; DataParallel and DDP copy it to their replicas at each forward.
  virtual void set_training(bool v) { training_ = v; }
  bool training() const { return training_; }

  /// The optimizer step the next forward belongs to, and the row of the global batch that this
  /// module's first input row is (Note [Dropout masks] in core/numerics/gpt_math.h: a mask is
  /// keyed by seed, step and the logical element index, so any device count draws the same
  /// one). The Trainer sets the step; DataParallel and DistributedDataParallel set each replica's
  /// first row (0 on one device) and copy the step. Containers pass both on.
  virtual void set_step(std::int64_t step) { step_ = step; }
  std::int64_t step() const { return step_; }
  virtual void set_first_row(std::int64_t row) { first_row_ = row; }
  std::int64_t first_row() const { return first_row_; }

  /// Called during backward with a parameter whose gradient for this backward is final (torch's
  /// Tensor.register_post_accumulate_grad_hook; DistributedDataParallel starts a bucket's
  /// all_reduce once all of the bucket's parameters were reported). Containers report each
  /// child's parameters right after that child's backward (Sequential; WithLoss passes the hook to
  /// its model); a leaf layer reports nothing: whoever calls its backward treats all its
  /// parameters as ready when backward returns. The hook runs on the thread calling backward,
  /// after the child's kernels are enqueued on the current stream (not finished). An empty
  /// function removes it. Not copied by clone().
  using GradReadyHook = std::function<void(Parameter&)>;
  virtual void set_grad_ready_hook(GradReadyHook hook) { grad_ready_hook_ = std::move(hook); }

  /// Set every parameter's grad to zero (allocating where undefined, or where its shape, device or
  /// dtype (grad_dtype of the parameter's dtype and this module's determinism) differs).
  void zero_grad();
  /// Move every parameter (and grad) to `device`.
  void to(const Device& device);
  /// torch's Module.to(dtype): every parameter's data converted to `dtype` (f32, bf16 or f16;
  /// round to nearest even, Tensor::to(DType)); the grads are dropped (undefined: the next
  /// backward or zero_grad allocates them in grad_dtype). The model then runs in `dtype`
  /// (activations in it; Note [Mixed precision]). InvalidArgument for another dtype. Parameters
  /// sharing one tensor (a clone's) stop sharing it: convert a model before cloning it.
  void to(DType dtype);
  /// Device of the first parameter (Device::cpu() for a module without parameters).
  Device device();
  /// Total number of parameter elements.
  std::int64_t num_parameters();

 protected:
  /// Note [One backward per forward]: a forward allows one backward, as torch's autograd frees
  /// the graph after one ("Trying to backward through the graph a second time"); a second
  /// backward would add the same gradients again. A module whose backward reads what its forward
  /// kept calls forward_done() in forward, require_forward(call) first in backward (an
  /// InvalidArgument "<call>: no forward to go back through (call forward first; each forward
  /// allows one backward)", DataParallel.backward's words, when there is none) and
  /// backward_done() once its arguments passed their checks (a refused grad_output keeps the
  /// forward).
  void forward_done() { has_forward_ = true; }
  void require_forward(const std::string& call) const;
  void backward_done() { has_forward_ = false; }

  bool input_requires_grad_ = true;
  Determinism determinism_ = Determinism::fast;
  std::vector<std::int64_t> micro_shards_;
  bool training_ = true;
  std::int64_t step_ = 0, first_row_ = 0;
  GradReadyHook grad_ready_hook_;

 private:
  bool has_forward_ = false;
};

/// Copy the settings (input_requires_grad, determinism, micro-shards, training, step, first row)
/// of `from` to `to` (for clone()).
void copy_settings(const Module& from, Module& to);

}  // namespace ditto::nn
