// optim::Optimizer: the interface every optimizer implements (torch.optim.Optimizer): a fixed list
// of parameters, step(), zero_grad(), and state_dict() / load_state_dict() for checkpoints.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/base/non_copyable.h"
#include "core/nn/module.h"

namespace ditto::optim {

/// An optimizer's state (torch.optim.Optimizer.state_dict(), flattened so that it fits a
/// safetensors file): per-parameter state tensors named "state.<i>.<key>" with i the parameter's
/// index in parameters() and key PyTorch's ("momentum_buffer"; "step", "exp_avg", "exp_avg_sq",
/// "max_exp_avg_sq"), as host tensors; and the hyper-parameters (PyTorch's param_groups[0]) as
/// exact decimal strings ("lr" -> "0.05").
struct OptimizerState {
  std::string type;                                     ///< "SGD", "Adam", "AdamW"
  std::map<std::string, std::string> options;           ///< hyper-parameters and "num_params"
  std::vector<std::pair<std::string, Tensor>> tensors;  ///< host tensors
};

/// A float or double as a decimal string that reads back to the same value: printf's %.9g for a
/// float, %.17g for a double (round-trip digits, not the shortest such string; these strings are
/// saved in optimizer state, so they keep this form).
std::string exact_str(double v);
std::string exact_str(float v);

/// What optim::MasterWeights hands its inner optimizer for a fused step (Note [Typed optimizer
/// step], core/optim/master_weights.h).
struct FusedStepArgs {
  /// Per parameter, in parameters() order: null, or a bf16 / f16 tensor of the parameter's shape
  /// on its device (the model's weight) that receives the updated parameter rounded once.
  std::vector<Tensor*> outputs;
  /// When set, every gradient is multiplied by it as it is loaded (the clip's coefficient).
  std::optional<float> grad_scale;
};

class Optimizer : public NonCopyable {
 public:
  /// Throws InvalidArgument for an empty list, a null or repeated parameter, or a parameter
  /// whose data is undefined or not f32 (naming the parameter). `call` names the optimizer.
  Optimizer(std::vector<nn::Parameter*> params, const char* call);
  /// The same checks, with data of any dtype in `dtypes` accepted (a wrapper such as
  /// MasterWeights over bf16 / f16 parameters).
  Optimizer(std::vector<nn::Parameter*> params, const char* call, std::vector<DType> dtypes);

  /// One update of every parameter whose grad is defined (others are skipped, as in PyTorch).
  /// Asynchronous: enqueued on each parameter's device's current stream.
  virtual void step() = 0;

  /// Whether step_fused(args) can run now: this optimizer has a fused step, and every parameter
  /// with a grad is on a backend whose typed multi-tensor kernels take its grad's dtype and
  /// args.outputs' (ops::has_multi_tensor_ex). Default: false (SGD; the simulator's real run).
  virtual bool can_step_fused(const FusedStepArgs& args) const;
  /// step() in one typed launch per device (Note [Typed optimizer step]): each grad read as
  /// stored (f32, bf16 or f16), times args.grad_scale when set, and each updated parameter
  /// rounded once into args.outputs[i] where set. The bits of: grads cast to f32, scaled
  /// (ops::scale_), step(), parameters cast into the outputs. Throws InvalidArgument where
  /// can_step_fused(args) is false (default: always).
  virtual void step_fused(const FusedStepArgs& args);

  /// Zero every defined grad in place (keeping its storage, so views of it stay valid), or with
  /// set_to_none reset it to undefined (PyTorch's default since 2.0).
  void zero_grad(bool set_to_none = false);

  const std::vector<nn::Parameter*>& parameters() const { return params_; }

  /// The learning rate of the next step() (torch: param_groups[g]['lr'], which schedules such
  /// as nanoGPT's get_lr set before each step; every group here shares one). Throws
  /// InvalidArgument for lr < 0 or NaN ("Invalid learning rate"). SGD keeps it as a float.
  virtual void set_lr(double lr) = 0;
  virtual double lr() const = 0;

  /// Copy of the state and hyper-parameters (blocks: state tensors are copied to the host).
  /// Parameters without state (no step yet) have no entries. Mirrors state_dict().
  virtual OptimizerState state_dict() const = 0;
  /// Restore state from state_dict()'s result, onto each parameter's device, so that the next
  /// step() gives exactly the bits it would have given in the run that saved it. Unlike PyTorch,
  /// which overwrites the hyper-parameters with the saved ones, these must match: throws
  /// InvalidArgument naming the first difference (another optimizer type, another number of
  /// parameters, an option such as lr, a tensor of another shape or dtype than its parameter, a
  /// missing or unexpected tensor), before changing anything.
  virtual void load_state_dict(const OptimizerState& state) = 0;

  /// Bytes of optimizer state this optimizer holds on its devices (momentum buffers, moments;
  /// ZeRO: this rank's shard of them), as a memory report counts it: no step counters, no
  /// parameters. Default: the sizes of state_dict()'s tensors other than the 0-dim ones (blocks).
  virtual std::size_t state_bytes() const;

 protected:
  /// The checks of load_state_dict shared by every optimizer: type, options (own_options
  /// must equal state.options), and for each tensor a name "state.<i>.<key>" with i in range and
  /// key in `keys`, no name twice, dtype and shape: i64 0-dim for "step", else f32 with the
  /// parameter's shape. `call` names the caller.
  void check_state(const OptimizerState& state, const char* call, const std::string& type,
                   const std::map<std::string, std::string>& own_options,
                   const std::vector<std::string>& keys) const;
  /// Parse "state.<i>.<key>" (no checks; check_state has run).
  static std::pair<std::size_t, std::string> split_state_name(const std::string& name);
  /// set_lr's check: InvalidArgument "<call>: lr: Invalid learning rate: ..." unless lr >= 0.
  static void check_lr(double lr, const char* call);

  std::vector<nn::Parameter*> params_;
};

/// An optimizer with hyper-parameters `Options` (SGDOptions, AdamOptions, AdamWOptions): keeps
/// them, and gives lr() and set_lr() over Options::lr.
template <class Options>
class OptimizerWith : public Optimizer {
 public:
  /// Throws InvalidArgument for lr < 0 or NaN ("optim::Adam::set_lr: lr: Invalid learning rate:
  /// -1"); else options().lr = lr, in Options::lr's type (a float for SGD).
  void set_lr(double lr) override {
    check_lr(lr, set_lr_call_.c_str());
    options_.lr = static_cast<decltype(Options::lr)>(lr);
  }
  double lr() const override { return options_.lr; }
  const Options& options() const { return options_; }

 protected:
  /// Optimizer's checks of `params` (naming `call`), then `options` kept as they are.
  OptimizerWith(std::vector<nn::Parameter*> params, const char* call, const Options& options)
      : Optimizer(std::move(params), call), options_(options), set_lr_call_(call) {
    set_lr_call_ += "::set_lr";
  }

  Options options_;

 private:
  std::string set_lr_call_;
};

}  // namespace ditto::optim
