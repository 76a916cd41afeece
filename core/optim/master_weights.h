// optim::MasterWeights: f32 master weights for a model stored in bf16 / f16 (mixed precision as
// llm.c's "master weights" and torch.autocast with f32 parameters in the optimizer): the wrapped
// optimizer (SGD, Adam, AdamW, ...) runs on f32 copies of the parameters and keeps its state in
// f32; after each step the masters are rounded into the model's parameters.
//
// Note [Master weights]
// Created from the model's parameters: master i is an f32 Parameter of the same name and SHAPE
// as parameter i (nanoGPT's dim-based AdamW groups still apply), its data the exact upcast of the
// model's (bf16 and f16 values are all f32 values). f32 model parameters are not copied: their
// master is the parameter's own data tensor (updated in place, as without the wrapper).
// One step:
//   load_master_grads()  master.grad = f32(model.grad)       exact upcast; undefined stays so
//   [GradScaler::unscale_(master_parameters()), clip_grad_norm_(master_parameters())]
//   step()               inner.step() on the masters (f32 arithmetic, f32 state), then
//                        model.data = round_to_dtype(master.data)   (RNE, Note [Small float
//                        conversions]; written in place, so views of the data stay valid)
// Rounding happens once per step per parameter, on the device, in both determinism modes; so a
// bf16 run's parameters are a function of the f32 masters only, and bitwise mode stays bitwise
// whenever the gradients are (Note [Reductions over ranks]).
// state_dict = the inner's (type, options and "state.<i>.<key>" as without the wrapper) plus
// "master.<i>" (f32, every parameter's master) and the option "master_weights" = "f32", so that a
// checkpoint resumes bit-exactly: the bf16 parameters alone would lose the masters' low bits.
// With a GradScaler attached (f16), its state_dict travels as options "grad_scaler.<key>" (torch
// saves scaler.state_dict() beside the optimizer's), so a resumed f16 run has the same scale.
//
// Note [Typed optimizer step]
// Where the backend runs the typed multi-tensor kernels (Kernels::has_multi_tensor_ex: cuda;
// the simulator only in a dry run, which prices cuda's launches), clip_grad_norm_ and step()
// take the fused path, with the bits of the steps above:
//   the masters' grads are the model's grads themselves (bf16 / f16 in fast mode, f32 in
//   bitwise mode: Note [Mixed precision]), not f32 copies: no cast launch and no f32 scratch;
//   clip_grad_norm_ sums their squares as stored (ops::sum_squares_multi ->
//   Kernels::sum_squares_multi_ex: each element widened as loaded, the bits of the f32 copy's
//   sums) and keeps the coefficient instead of scaling (a bf16 gradient scaled in place would
//   round: other bits than scaling its f32 copy);
//   step() is one launch per device (inner Optimizer::step_fused -> ops::adam_step_multi_ ->
//   Kernels::adam_step_multi_ex): per element the grad widened, times the clip's coefficient
//   (the f32 copy's scale), AdamW's update of the f32 master, and the master rounded once into
//   the model's weight (RNE, as ops::cast): no cast and no copy per parameter.
// The path is taken when no GradScaler is attached (f16's unscale_ and inf check read f32
// copies), the inner optimizer has a fused step (Adam, AdamW; can_step_fused) and every
// parameter with a grad lives on a backend whose typed kernels take its grad's and weight's
// dtypes; otherwise the steps above run as they are (the simulator's real run: its bits,
// launches and memory accounting unchanged). Unlike the steps above, the fused clip leaves an
// f32 parameter's gradient unscaled (the step applies the coefficient). load_master_grads()
// after a fused clip applies the kept coefficient to the f32 copies it makes (the same bits).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "core/numerics/determinism.h"
#include "core/optim/grad_scaler.h"
#include "core/optim/optimizer.h"

namespace ditto::optim {

/// Builds the optimizer that MasterWeights runs over the f32 masters.
using InnerOptimizerFactory =
    std::function<std::unique_ptr<Optimizer>(std::vector<nn::Parameter*> masters)>;

class MasterWeights : public Optimizer {
 public:
  /// `params`: the model's parameters (f32, bf16 or f16 data; any mix), all on devices; the
  /// masters are made on each parameter's device. `make_inner` is called once with the masters
  /// (in `params`' order). Throws InvalidArgument for what Optimizer's constructor throws
  /// (another dtype, a null or repeated parameter, an empty list) or when make_inner returns null
  /// or an optimizer over other parameters.
  MasterWeights(std::vector<nn::Parameter*> params, const InnerOptimizerFactory& make_inner);

  /// Sets each master's grad to the f32 upcast of its model parameter's grad (undefined where
  /// the model's is); an f32 parameter's master shares its grad tensor. step() calls it unless it
  /// ran since the last step. Asynchronous.
  void load_master_grads();
  /// load_master_grads() unless done, the inner step on the masters, then every master with a
  /// grad rounded into its model parameter's data (Note [Master weights]); on the fused path
  /// (Note [Typed optimizer step]) one typed launch per device instead. Asynchronous.
  void step() override;
  /// torch.nn.utils.clip_grad_norm_ on the model's gradients between backward and step(), for
  /// a trainer (optim::clip_grad_norm_'s arithmetic, norm and bits): on the fused path (Note
  /// [Typed optimizer step]) the sums read the model's grads as stored and step() applies the
  /// coefficient; otherwise load_master_grads() unless done, then
  /// optim::clip_grad_norm_(master_parameters(), max_norm, mode). Blocks (the sums are read).
  /// Throws InvalidArgument as optim::clip_grad_norm_, and for a second fused clip before
  /// step() (the sums would be those of unscaled grads).
  float clip_grad_norm_(double max_norm, Determinism mode);
  /// Whether clip_grad_norm_ and step() take the fused path now (Note [Typed optimizer step]).
  bool fused_path() const;
  void set_lr(double lr) override { inner_->set_lr(lr); }
  double lr() const override { return inner_->lr(); }

  /// The inner's state with "master.<i>" tensors (f32 host copies) and option
  /// "master_weights" = "f32" added (Note [Master weights]). Blocks.
  OptimizerState state_dict() const override;
  /// The inner optimizer's state_bytes plus the f32 masters (4 bytes per parameter), counted
  /// from the tensors held, without copying them (state_dict's default would copy the whole
  /// state to the host: in a dry run, gigabytes of real memory for what holds no data).
  std::size_t state_bytes() const override;
  /// Restores the masters and the inner's state. Throws InvalidArgument, before changing
  /// anything, for a state without "master_weights" ("saved without master weights"), a
  /// missing or repeated master.<i>, one of another shape or dtype than f32 [parameter's shape],
  /// and what the inner's load_state_dict throws.
  void load_state_dict(const OptimizerState& state) override;

  /// Saves and restores `scaler`'s state with this optimizer's (Note [Master weights]); null
  /// detaches. Not owned: must outlive this object's state_dict / load_state_dict calls.
  void attach_grad_scaler(GradScaler* scaler) { scaler_ = scaler; }

  /// The f32 masters, in parameters() order: what the trainer unscales and clips.
  const std::vector<nn::Parameter*>& master_parameters() const { return master_ptrs_; }
  Optimizer& inner() { return *inner_; }
  const Optimizer& inner() const { return *inner_; }

 private:
  std::vector<std::unique_ptr<nn::Parameter>> masters_;
  std::vector<nn::Parameter*> master_ptrs_;
  /// Points each master's grad at its model parameter's grad (no copy: the masters are held
  /// through pointers) and returns the fused step's arguments (outputs in inner_->parameters()
  /// order).
  FusedStepArgs load_model_grads() const;

  std::unique_ptr<Optimizer> inner_;
  enum class Grads { none, f32, model };  // what the masters' grads hold since the last step
  Grads grads_ = Grads::none;
  std::optional<float> grad_scale_;       // a fused clip's coefficient, for the step
  std::vector<std::size_t> inner_index_;  // inner_->parameters()[k] is master inner_index_[k]
  GradScaler* scaler_ = nullptr;
};

}  // namespace ditto::optim
