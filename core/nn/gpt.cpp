// nn::Block and nn::GPT: forward, backward, nanoGPT's names and init, the tied head's gradient.
#include "core/nn/gpt.h"

#include <cmath>
#include <utility>

#include "core/nn/token_bounds.h"
#include "core/runtime/ops.h"

namespace ditto::nn {

void check_config(const GPTConfig& cfg) {
  DITTO_CHECK(cfg.block_size >= 1, "GPTConfig: block_size: expected >= 1, got ", cfg.block_size);
  DITTO_CHECK(cfg.vocab_size >= 1, "GPTConfig: vocab_size: expected >= 1, got ", cfg.vocab_size);
  DITTO_CHECK(cfg.n_layer >= 1 && cfg.n_layer <= 85,
              "GPTConfig: n_layer: expected in [1, 85] (dropout sites fit in 8 bits), got ",
              cfg.n_layer);
  DITTO_CHECK(cfg.n_head >= 1, "GPTConfig: n_head: expected >= 1, got ", cfg.n_head);
  DITTO_CHECK(cfg.n_embd >= 1 && cfg.n_embd % cfg.n_head == 0,
              "GPTConfig: n_embd: expected a positive multiple of n_head = ", cfg.n_head, ", got ",
              cfg.n_embd);
  DITTO_CHECK(cfg.dropout >= 0.0f && cfg.dropout < 1.0f,
              "GPTConfig: dropout: expected in [0, 1), got ", cfg.dropout);
}

float gpt_c_proj_std(std::int64_t n_layer) {
  return static_cast<float>(0.02 / std::sqrt(2.0 * static_cast<double>(n_layer)));
}

// ---- Block -----------------------------------------------------------------------------------

Block::Block(const GPTConfig& cfg, std::int64_t layer, const Device& device, std::uint64_t seed) {
  check_config(cfg);
  ln_1_ = std::make_unique<LayerNorm>(cfg.n_embd, device, cfg.bias);
  attn_ = std::make_unique<CausalSelfAttention>(cfg, layer, device, seed);
  ln_2_ = std::make_unique<LayerNorm>(cfg.n_embd, device, cfg.bias);
  mlp_ = std::make_unique<GPTMLP>(cfg, layer, device, seed);
  name_children();
}

void Block::name_children() {
  prefix_names(*ln_1_, "ln_1");
  prefix_names(*attn_, "attn");
  prefix_names(*ln_2_, "ln_2");
  prefix_names(*mlp_, "mlp");
}

std::vector<Module*> Block::children() {
  return {ln_1_.get(), attn_.get(), ln_2_.get(), mlp_.get()};
}

Tensor Block::forward(const Tensor& x) {
  Tensor x1 = ops::add(x, attn_->forward(ln_1_->forward(x)));
  return ops::add(x1, mlp_->forward(ln_2_->forward(x1)));
}

Tensor Block::backward(const Tensor& grad_output) {
  Tensor g1 = ops::add(grad_output, ln_2_->backward(mlp_->backward(grad_output)));
  return ops::add(g1, ln_1_->backward(attn_->backward(g1)));
}

std::unique_ptr<Module> Block::clone() const {
  std::unique_ptr<Block> m(new Block());
  m->ln_1_ = clone_as(*ln_1_);
  m->attn_ = clone_as(*attn_);
  m->ln_2_ = clone_as(*ln_2_);
  m->mlp_ = clone_as(*mlp_);
  m->name_children();
  copy_settings(*this, *m);
  return m;
}

// ---- GPT -------------------------------------------------------------------------------------

GPT::GPT(const GPTConfig& cfg, const Device& device, std::uint64_t seed) : cfg_(cfg), seed_(seed) {
  check_config(cfg);
  input_requires_grad_ = false;
  wte_ = std::make_unique<Embedding>(cfg.vocab_size, cfg.n_embd, device, seed, kWteLayerId,
                                     kGptInitStd);
  wpe_ = std::make_unique<Embedding>(cfg.block_size, cfg.n_embd, device, seed, kWpeLayerId,
                                     kGptInitStd);
  drop_ = std::make_unique<Dropout>(cfg.dropout, kEmbeddingDropoutSite, seed);
  for (std::int64_t l = 0; l < cfg.n_layer; ++l)
    h_.push_back(std::make_unique<Block>(cfg, l, device, seed));
  ln_f_ = std::make_unique<LayerNorm>(cfg.n_embd, device, cfg.bias);
  name_children();
}

void GPT::name_children() {
  prefix_names(*wte_, "transformer.wte");
  prefix_names(*wpe_, "transformer.wpe");
  for (std::size_t l = 0; l < h_.size(); ++l)
    prefix_names(*h_[l], "transformer.h." + std::to_string(l));
  prefix_names(*ln_f_, "transformer.ln_f");
}

std::vector<Module*> GPT::children() {
  std::vector<Module*> out{wte_.get(), wpe_.get(), drop_.get()};
  for (auto& b : h_) out.push_back(b.get());
  out.push_back(ln_f_.get());
  return out;
}

std::unique_ptr<Module> GPT::clone() const {
  std::unique_ptr<GPT> m(new GPT(cfg_, seed_));
  m->wte_ = clone_as(*wte_);
  m->wpe_ = clone_as(*wpe_);
  m->drop_ = clone_as(*drop_);
  for (const auto& b : h_) m->h_.push_back(clone_as(*b));
  m->ln_f_ = clone_as(*ln_f_);
  m->name_children();
  copy_settings(*this, *m);
  return m;
}

Tensor GPT::forward(const Tensor& idx) {
  DITTO_CHECK(idx.defined() && idx.dim() == 2 && idx.dtype() == DType::i64,
              "GPT.forward: idx: expected [B, T] i64 token ids, got ", describe(idx));
  const std::int64_t B = idx.size(0), T = idx.size(1), C = cfg_.n_embd;
  DITTO_CHECK(T >= 1 && T <= cfg_.block_size,
              "GPT.forward: idx: expected 1 <= T <= block_size = ", cfg_.block_size, ", got ",
              idx.str());
  const Tensor ids = idx.to(wte_->weight().data.device());
  Tensor x;
  try {
    x = ops::embedding(ids, wte_->weight().data, wpe_->weight().data);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string("GPT.forward: ") + e.what());
  }
  x = drop_->forward(x);
  for (auto& b : h_) x = b->forward(x);
  x = ln_f_->forward(x);
  idx_ = ids;
  xf_ = x.view({B * T, C});
  Tensor logits = ops::matmul(xf_, wte_->weight().data, false, true, determinism_);  // lm_head
  return logits.view({B, T, cfg_.vocab_size});
}

Tensor GPT::backward(const Tensor& grad_logits) {
  DITTO_CHECK(idx_.defined(), "GPT.backward: called before forward");
  const std::int64_t B = idx_.size(0), T = idx_.size(1), C = cfg_.n_embd, V = cfg_.vocab_size;
  DITTO_CHECK(grad_logits.defined() && grad_logits.shape() == (Shape{B, T, V}) &&
                  is_float_storage(grad_logits.dtype()) && grad_logits.device() == idx_.device(),
              "GPT.backward: grad_logits: expected ", shape_str({B, T, V}), " f32 (or bf16 / f16) on ",
              idx_.device().str(), " (the logits' shape and device), got ", describe(grad_logits));
  auto report = [&](Module& m) {
    if (grad_ready_hook_)
      for (Parameter* p : m.parameters()) grad_ready_hook_(*p);
  };
  const Tensor g = grad_logits.view({B * T, V});
  Tensor dx = ops::matmul(g, wte_->weight().data, false, false, determinism_).view({B, T, C});
  dx = ln_f_->backward(dx);
  report(*ln_f_);
  for (auto it = h_.rbegin(); it != h_.rend(); ++it) {
    dx = (*it)->backward(dx);
    report(**it);
  }
  const Tensor demb = drop_->backward(dx);
  // wpe: the sum over samples of each position's gradient (rows T.. of wpe get none).
  Parameter& wpe = wpe_->weight();
  new_grad(wpe, grad_dtype(wpe.data.dtype(), determinism_), demb.device(), /*zero=*/true);
  Tensor wpe_rows = wpe.grad.narrow(0, T).view({T * C});
  const Tensor demb_samples = demb.view({B, T * C});
  row_sums_into(demb_samples, wpe_rows, determinism_,
                determinism_ == Determinism::bitwise ? token_bounds(*this, "GPT", B, 1)
                                                     : std::vector<std::int64_t>{},
                /*accumulate=*/true);
  report(*wpe_);
  wte_grad(g, demb.view({B * T, C}));
  report(*wte_);
  return Tensor();
}

// transformer.wte.weight's gradient: lm_head's dW = g^T xf plus the embedding's scatter-add of
// demb (Note [GPT]: per micro-shard in bitwise mode).
void GPT::wte_grad(const Tensor& g, const Tensor& demb) {
  Parameter& wte = wte_->weight();
  const std::int64_t N = g.size(0), V = cfg_.vocab_size, C = cfg_.n_embd;
  const Tensor ids = idx_.view({N});
  if (determinism_ != Determinism::bitwise) {
    const bool acc = wte.grad.defined();
    new_grad(wte, grad_dtype(wte.data.dtype(), determinism_), g.device());
    ops::gemm(g, xf_, wte.grad, true, false, 1.0f, acc ? 1.0f : 0.0f, determinism_);
    ops::embedding_backward(ids, demb, wte.grad, {0, N}, true);
    return;
  }
  const std::vector<std::int64_t> bounds = token_bounds(*this, "GPT", idx_.size(0), idx_.size(1));
  // The canonical tree over the shards (Note [Canonical tree]) as a stack of complete subtrees:
  // equal-sized neighbours are added as they appear, the rest folded from the right at the end.
  std::vector<std::pair<Tensor, std::int64_t>> stack;
  for (std::size_t s = 0; s + 1 < bounds.size(); ++s) {
    const std::int64_t lo = bounds[s], n = bounds[s + 1] - lo;
    Tensor part = Tensor::empty({V, C}, grad_dtype(wte.data.dtype(), determinism_), g.device());
    if (n == 0) {
      ops::fill_(part, 0.0f);
    } else {
      ops::gemm_tn_sharded(g.narrow(lo, n), xf_.narrow(lo, n), part, {0, n}, false);
      ops::embedding_backward(ids.narrow(lo, n), demb.narrow(lo, n), part, {0, n}, true);
    }
    stack.emplace_back(std::move(part), 1);
    while (stack.size() >= 2 && stack[stack.size() - 2].second == stack.back().second) {
      ops::axpy_(1.0f, stack.back().first, stack[stack.size() - 2].first);
      stack[stack.size() - 2].second *= 2;
      stack.pop_back();
    }
  }
  Tensor total = std::move(stack.back().first);
  for (std::size_t i = stack.size() - 1; i-- > 0;) {
    ops::axpy_(1.0f, total, stack[i].first);
    total = std::move(stack[i].first);
  }
  if (wte.grad.defined())
    ops::axpy_(1.0f, total, wte.grad);
  else
    wte.grad = std::move(total);
}

}  // namespace ditto::nn
