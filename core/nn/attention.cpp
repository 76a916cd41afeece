// nn::CausalSelfAttention and nn::GPTMLP: forward and backward of nanoGPT's two block halves.
#include "core/nn/attention.h"

#include "core/nn/token_bounds.h"
#include "core/runtime/ops.h"

namespace ditto::nn {

namespace {

LinearOptions gpt_linear(const GPTConfig& cfg, float std) {
  LinearOptions o;
  o.bias = cfg.bias;
  o.init_std = std;
  return o;
}

}  // namespace

void BlockModule::check_input(const Tensor& x) const {
  DITTO_CHECK(x.defined() && x.dim() == 3 && x.size(2) == n_embd_ && is_float_storage(x.dtype()),
              name_, ".forward: input: expected [B, T, ", n_embd_, "] f32 (or bf16 / f16), got ",
              describe(x));
}

Tensor BlockModule::forward(const Tensor& x) {
  check_input(x);
  return forward_btc(x);
}

// ---- CausalSelfAttention ---------------------------------------------------------------------

CausalSelfAttention::CausalSelfAttention(std::int64_t n_embd, std::int64_t n_head)
    : BlockModule("CausalSelfAttention", n_embd), n_head_(n_head) {}

CausalSelfAttention::CausalSelfAttention(const GPTConfig& cfg, std::int64_t layer,
                                         const Device& device, std::uint64_t seed)
    : CausalSelfAttention(cfg.n_embd, cfg.n_head) {
  check_config(cfg);
  const std::int64_t c = cfg.n_embd;
  add_child("c_attn", std::make_unique<Linear>(c, 3 * c, device, seed,
                                               gpt_layer_id(layer, BlockLinear::c_attn),
                                               gpt_linear(cfg, kGptInitStd)));
  add_child("", std::make_unique<Dropout>(cfg.dropout, gpt_dropout_site(layer, BlockDropout::attn),
                                          seed));
  add_child("c_proj", std::make_unique<Linear>(c, c, device, seed,
                                               gpt_layer_id(layer, BlockLinear::attn_c_proj),
                                               gpt_linear(cfg, gpt_c_proj_std(cfg.n_layer))));
  add_child("", std::make_unique<Dropout>(cfg.dropout, gpt_dropout_site(layer, BlockDropout::resid),
                                          seed));
}

std::unique_ptr<Container> CausalSelfAttention::empty_clone() const {
  return std::unique_ptr<Container>(new CausalSelfAttention(n_embd(), n_head_));
}

Tensor CausalSelfAttention::forward_btc(const Tensor& x) {
  const Dropout& attn_dropout = child<Dropout>(kAttnDropout);
  qkv_ = child<Linear>(kCAttn).forward(x);
  // attn_dropout acts on att [B, nh, T, T] before att @ v, inside the attention kernel (Note
  // [GPT kernels], attention with dropout); stats_ keeps the softmax statistics for backward.
  att_p_ = attn_dropout.active() && x.numel() > 0 ? attn_dropout.p() : 0.0f;
  att_stream_ = att_base_ = 0;
  if (att_p_ > 0.0f) {
    att_stream_ = dropout_stream(step_, attn_dropout.site());
    att_base_ = dropout_index_base(first_row_, n_head_ * x.size(1) * x.size(1));
  }
  y_ = ops::attention(qkv_, n_head_, stats_, att_p_, attn_dropout.seed(), att_stream_, att_base_,
                      determinism());
  forward_done();
  return child<Dropout>(kResidDropout).forward(child<Linear>(kCProj).forward(y_));
}

Tensor CausalSelfAttention::backward(const Tensor& grad_output) {
  require_forward("CausalSelfAttention.backward");
  Tensor g = child<Linear>(kCProj).backward(child<Dropout>(kResidDropout).backward(grad_output));
  backward_done();
  // y_: a fast typed backward reads D = rowsum(g * y) from it (FlashAttention-2's).
  const Tensor dqkv =
      ops::attention_backward(g, qkv_, stats_, n_head_, att_p_, child<Dropout>(kAttnDropout).seed(),
                              att_stream_, att_base_, determinism(), y_);
  return child<Linear>(kCAttn).backward(dqkv);
}

// ---- MLP -------------------------------------------------------------------------------------

GPTMLP::GPTMLP(const GPTConfig& cfg, std::int64_t layer, const Device& device, std::uint64_t seed)
    : GPTMLP(cfg.n_embd) {
  check_config(cfg);
  const std::int64_t c = cfg.n_embd;
  add_child("c_fc",
            std::make_unique<Linear>(c, 4 * c, device, seed, gpt_layer_id(layer, BlockLinear::c_fc),
                                     gpt_linear(cfg, kGptInitStd)));
  add_child("", std::make_unique<GELU>());
  add_child("c_proj", std::make_unique<Linear>(4 * c, c, device, seed,
                                               gpt_layer_id(layer, BlockLinear::mlp_c_proj),
                                               gpt_linear(cfg, gpt_c_proj_std(cfg.n_layer))));
  add_child(
      "", std::make_unique<Dropout>(cfg.dropout, gpt_dropout_site(layer, BlockDropout::mlp), seed));
}

Tensor GPTMLP::forward_btc(const Tensor& x) {
  Linear& c_fc = child<Linear>(kCFc);
  if (!c_fc.gelu_fused(x)) {
    pre_ = Tensor();
    return forward_chain(x);
  }
  const Tensor h = c_fc.forward_gelu(x, pre_);
  return child<Dropout>(kDropout).forward(child<Linear>(kCProj).forward(h));
}

Tensor GPTMLP::backward(const Tensor& grad_output) {
  if (!pre_.defined()) return backward_chain(grad_output);
  auto report = [&](Module& m) {  // as backward_chain does after each child
    if (grad_ready_hook_)
      for (Parameter* p : m.parameters()) grad_ready_hook_(*p);
  };
  Linear& c_proj = child<Linear>(kCProj);
  Linear& c_fc = child<Linear>(kCFc);
  const Tensor g = c_proj.backward_dgelu(child<Dropout>(kDropout).backward(grad_output), pre_);
  report(c_proj);
  Tensor dx = c_fc.backward(g);
  report(c_fc);
  return dx;
}

std::unique_ptr<Container> GPTMLP::empty_clone() const {
  return std::unique_ptr<Container>(new GPTMLP(n_embd()));
}

}  // namespace ditto::nn
