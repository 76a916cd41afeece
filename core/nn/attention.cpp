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

void check_btc(const char* who, const Tensor& x, std::int64_t c) {
  DITTO_CHECK(x.defined() && x.dim() == 3 && x.size(2) == c && is_float_storage(x.dtype()), who,
              ".forward: input: expected [B, T, ", c, "] f32 (or bf16 / f16), got ", describe(x));
}

}  // namespace

// ---- CausalSelfAttention ---------------------------------------------------------------------

CausalSelfAttention::CausalSelfAttention(const GPTConfig& cfg, std::int64_t layer,
                                         const Device& device, std::uint64_t seed)
    : n_head_(cfg.n_head) {
  check_config(cfg);
  const std::int64_t c = cfg.n_embd;
  c_attn_ =
      std::make_unique<Linear>(c, 3 * c, device, seed, gpt_layer_id(layer, BlockLinear::c_attn),
                               gpt_linear(cfg, kGptInitStd));
  c_proj_ =
      std::make_unique<Linear>(c, c, device, seed, gpt_layer_id(layer, BlockLinear::attn_c_proj),
                               gpt_linear(cfg, gpt_c_proj_std(cfg.n_layer)));
  attn_dropout_ =
      std::make_unique<Dropout>(cfg.dropout, gpt_dropout_site(layer, BlockDropout::attn), seed);
  resid_dropout_ =
      std::make_unique<Dropout>(cfg.dropout, gpt_dropout_site(layer, BlockDropout::resid), seed);
  prefix_names(*c_attn_, "c_attn");
  prefix_names(*c_proj_, "c_proj");
}

std::vector<Module*> CausalSelfAttention::children() {
  return {c_attn_.get(), attn_dropout_.get(), c_proj_.get(), resid_dropout_.get()};
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  check_btc("CausalSelfAttention", x, c_attn_->in_features());
  qkv_ = c_attn_->forward(x);
  // attn_dropout acts on att [B, nh, T, T] before att @ v, inside the attention kernel (Note
  // [GPT kernels], attention with dropout); stats_ keeps the softmax statistics for backward.
  att_p_ = attn_dropout_->active() && x.numel() > 0 ? attn_dropout_->p() : 0.0f;
  att_stream_ = att_base_ = 0;
  if (att_p_ > 0.0f) {
    att_stream_ = dropout_stream(step_, attn_dropout_->site());
    att_base_ = dropout_index_base(first_row_, n_head_ * x.size(1) * x.size(1));
  }
  const Tensor y = ops::attention(qkv_, n_head_, stats_, att_p_, attn_dropout_->seed(),
                                  att_stream_, att_base_, determinism());
  return resid_dropout_->forward(c_proj_->forward(y));
}

Tensor CausalSelfAttention::backward(const Tensor& grad_output) {
  DITTO_CHECK(qkv_.defined(), "CausalSelfAttention.backward: called before forward");
  Tensor g = c_proj_->backward(resid_dropout_->backward(grad_output));
  const Tensor dqkv = ops::attention_backward(g, qkv_, stats_, n_head_, att_p_,
                                              attn_dropout_->seed(), att_stream_, att_base_,
                                              determinism());
  return c_attn_->backward(dqkv);
}

std::unique_ptr<Module> CausalSelfAttention::clone() const {
  std::unique_ptr<CausalSelfAttention> m(new CausalSelfAttention());
  m->n_head_ = n_head_;
  m->c_attn_ = clone_as(*c_attn_);
  m->c_proj_ = clone_as(*c_proj_);
  m->attn_dropout_ = clone_as(*attn_dropout_);
  m->resid_dropout_ = clone_as(*resid_dropout_);
  prefix_names(*m->c_attn_, "c_attn");
  prefix_names(*m->c_proj_, "c_proj");
  copy_settings(*this, *m);
  return m;
}

// ---- MLP -------------------------------------------------------------------------------------

GPTMLP::GPTMLP(const GPTConfig& cfg, std::int64_t layer, const Device& device, std::uint64_t seed) {
  check_config(cfg);
  const std::int64_t c = cfg.n_embd;
  c_fc_ = std::make_unique<Linear>(c, 4 * c, device, seed, gpt_layer_id(layer, BlockLinear::c_fc),
                                   gpt_linear(cfg, kGptInitStd));
  c_proj_ =
      std::make_unique<Linear>(4 * c, c, device, seed, gpt_layer_id(layer, BlockLinear::mlp_c_proj),
                               gpt_linear(cfg, gpt_c_proj_std(cfg.n_layer)));
  gelu_ = std::make_unique<GELU>();
  dropout_ =
      std::make_unique<Dropout>(cfg.dropout, gpt_dropout_site(layer, BlockDropout::mlp), seed);
  prefix_names(*c_fc_, "c_fc");
  prefix_names(*c_proj_, "c_proj");
}

std::vector<Module*> GPTMLP::children() {
  return {c_fc_.get(), gelu_.get(), c_proj_.get(), dropout_.get()};
}

Tensor GPTMLP::forward(const Tensor& x) {
  check_btc("MLP", x, c_fc_->in_features());
  return dropout_->forward(c_proj_->forward(gelu_->forward(c_fc_->forward(x))));
}

Tensor GPTMLP::backward(const Tensor& grad_output) {
  return c_fc_->backward(gelu_->backward(c_proj_->backward(dropout_->backward(grad_output))));
}

std::unique_ptr<Module> GPTMLP::clone() const {
  std::unique_ptr<GPTMLP> m(new GPTMLP());
  m->c_fc_ = clone_as(*c_fc_);
  m->c_proj_ = clone_as(*c_proj_);
  m->gelu_ = std::make_unique<GELU>();
  m->dropout_ = clone_as(*dropout_);
  prefix_names(*m->c_fc_, "c_fc");
  prefix_names(*m->c_proj_, "c_proj");
  copy_settings(*this, *m);
  return m;
}

}  // namespace ditto::nn
