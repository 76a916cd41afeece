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
  DITTO_CHECK(cfg.n_layer >= 1 && cfg.n_layer <= kGptMaxLayers,
              "GPTConfig: n_layer: expected in [1, 2^46) (the init streams' layer ids fit in 48 "
              "bits), got ",
              cfg.n_layer);
  DITTO_CHECK(cfg.n_head >= 1, "GPTConfig: n_head: expected >= 1, got ", cfg.n_head);
  DITTO_CHECK(cfg.n_embd >= 1 && cfg.n_embd % cfg.n_head == 0,
              "GPTConfig: n_embd: expected a positive multiple of n_head = ", cfg.n_head, ", got ",
              cfg.n_embd);
  DITTO_CHECK(cfg.dropout >= 0.0f && cfg.dropout < 1.0f,
              "GPTConfig: dropout: expected in [0, 1), got ", cfg.dropout);
  DITTO_CHECK(cfg.dropout == 0.0f || cfg.n_layer <= kGptMaxDropoutLayers,
              "GPTConfig: n_layer: expected at most ", kGptMaxDropoutLayers,
              " with dropout > 0 (the dropout sites fit in 16 bits, Note [Dropout masks]), got ",
              cfg.n_layer, " with dropout ", cfg.dropout);
}

float gpt_c_proj_std(std::int64_t n_layer) {
  return static_cast<float>(0.02 / std::sqrt(2.0 * static_cast<double>(n_layer)));
}

// ---- Block -----------------------------------------------------------------------------------

Block::Block(const GPTConfig& cfg, std::int64_t layer, const Device& device, std::uint64_t seed)
    : Block(cfg.n_embd) {
  check_config(cfg);
  add_child("ln_1", std::make_unique<LayerNorm>(cfg.n_embd, device, cfg.bias));
  add_child("attn", std::make_unique<CausalSelfAttention>(cfg, layer, device, seed));
  add_child("ln_2", std::make_unique<LayerNorm>(cfg.n_embd, device, cfg.bias));
  add_child("mlp", std::make_unique<GPTMLP>(cfg, layer, device, seed));
}

std::unique_ptr<Container> Block::empty_clone() const {
  return std::unique_ptr<Container>(new Block(n_embd()));
}

// Each residual add is folded into the LayerNorm after it (LayerNorm::forward_add: one kernel
// where the backend has it, the bits of the separate add): attn's into ln_2 here, the MLP's
// into the next block's ln_1 (or ln_f) by nn::GPT, or added here when the block runs alone.
Tensor Block::forward_btc(const Tensor& x) {
  Residual out = forward_residual({x, Tensor()});
  return ops::add(out.x, out.branch);
}

Residual Block::forward_residual(Residual in) {
  LayerNorm& ln_1 = child<LayerNorm>(kLn1);
  BlockModule::check_input(in.x);
  Tensor x, h;
  if (in.branch.defined()) {
    DITTO_CHECK(in.branch.shape() == in.x.shape() && in.branch.dtype() == in.x.dtype() &&
                    in.branch.device() == in.x.device(),
                name(), ".forward: branch: expected ", shape_str(in.x.shape()), " ",
                dtype_name(in.x.dtype()), " on ", in.x.device().str(),
                " (the input's shape, dtype and device), got ", describe(in.branch));
    AddNorm s = ln_1.forward_add(in.x, std::move(in.branch));
    x = std::move(s.sum);
    h = std::move(s.y);
  } else {
    x = std::move(in.x);
    h = ln_1.forward(x);
  }
  in = Residual();
  Tensor a = child<Module>(kAttn).forward(h);
  h = Tensor();
  AddNorm s = child<LayerNorm>(kLn2).forward_add(x, std::move(a));
  x = Tensor();
  return {std::move(s.sum), child<Module>(kMlp).forward(s.y)};
}

// Each residual gradient's add is folded into the LayerNorm backward below it (one kernel where
// the backend has it: ops::layernorm_backward_add; the bits of the separate add).
Tensor Block::backward(const Tensor& grad_output) {
  const Tensor g1 =
      child<LayerNorm>(kLn2).backward(child<Module>(kMlp).backward(grad_output), grad_output);
  return child<LayerNorm>(kLn1).backward(child<Module>(kAttn).backward(g1), g1);
}

// ---- GPT -------------------------------------------------------------------------------------

GPT::GPT(const GPTConfig& cfg, const Device& device, std::uint64_t seed) : GPT(cfg, seed) {
  check_config(cfg);
  add_child("transformer.wte", std::make_unique<Embedding>(cfg.vocab_size, cfg.n_embd, device, seed,
                                                           kWteLayerId, kGptInitStd));
  add_child("transformer.wpe", std::make_unique<Embedding>(cfg.block_size, cfg.n_embd, device, seed,
                                                           kWpeLayerId, kGptInitStd));
  add_child("", std::make_unique<Dropout>(cfg.dropout, kEmbeddingDropoutSite, seed));
  for (std::int64_t l = 0; l < cfg.n_layer; ++l)
    add_child("transformer.h." + std::to_string(l), std::make_unique<Block>(cfg, l, device, seed));
  add_child("transformer.ln_f", std::make_unique<LayerNorm>(cfg.n_embd, device, cfg.bias));
}

std::unique_ptr<Container> GPT::empty_clone() const {
  return std::unique_ptr<Container>(new GPT(cfg_, seed_));
}

Tensor GPT::forward(const Tensor& idx) {
  DITTO_CHECK(idx.defined() && idx.dim() == 2 && idx.dtype() == DType::i64,
              "GPT.forward: idx: expected [B, T] i64 token ids, got ", describe(idx));
  const std::int64_t B = idx.size(0), T = idx.size(1), C = cfg_.n_embd;
  DITTO_CHECK(T >= 1 && T <= cfg_.block_size,
              "GPT.forward: idx: expected 1 <= T <= block_size = ", cfg_.block_size, ", got ",
              idx.str());
  const Tensor ids = idx.to(wte().weight().data.device());
  Tensor x;
  try {
    x = ops::embedding(ids, wte().weight().data, wpe().weight().data);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string("GPT.forward: ") + e.what());
  }
  // Each block's last add is left pending and folded into the LayerNorm after it: the next
  // block's ln_1, then ln_f (Block::forward_residual).
  Residual r{drop().forward(x), Tensor()};
  x = Tensor();
  for (std::int64_t l = 0; l < cfg_.n_layer; ++l) r = h(l).forward_residual(std::move(r));
  x = ln_f().forward_add(r.x, std::move(r.branch)).y;
  r = Residual();
  idx_ = ids;
  xf_ = x.view({B * T, C});
  forward_done();
  Tensor logits = ops::matmul(xf_, wte().weight().data, false, true, determinism_);  // lm_head
  return logits.view({B, T, cfg_.vocab_size});
}

Tensor GPT::backward(const Tensor& grad_logits) {
  require_forward("GPT.backward");
  const std::int64_t B = idx_.size(0), T = idx_.size(1), C = cfg_.n_embd, V = cfg_.vocab_size;
  DITTO_CHECK(grad_logits.defined() && grad_logits.shape() == (Shape{B, T, V}) &&
                  is_float_storage(grad_logits.dtype()) && grad_logits.device() == idx_.device(),
              "GPT.backward: grad_logits: expected ", shape_str({B, T, V}),
              " f32 (or bf16 / f16) on ", idx_.device().str(),
              " (the logits' shape and device), got ", describe(grad_logits));
  backward_done();
  auto report = [&](Module& m) {
    if (grad_ready_hook_)
      for (Parameter* p : m.parameters()) grad_ready_hook_(*p);
  };
  const Tensor g = grad_logits.view({B * T, V});
  Tensor dx = ops::matmul(g, wte().weight().data, false, false, determinism_).view({B, T, C});
  dx = ln_f().backward(dx);
  report(ln_f());
  for (std::int64_t l = cfg_.n_layer - 1; l >= 0; --l) {
    dx = h(l).backward(dx);
    report(h(l));
  }
  const Tensor demb = drop().backward(dx);
  // wpe: the sum over samples of each position's gradient (rows T.. of wpe get none).
  Parameter& wpe = this->wpe().weight();
  new_grad(wpe, grad_dtype(wpe.data.dtype(), determinism_), demb.device(), /*zero=*/true);
  Tensor wpe_rows = wpe.grad.narrow(0, T).view({T * C});
  const Tensor demb_samples = demb.view({B, T * C});
  row_sums_into(demb_samples, wpe_rows, determinism_,
                determinism_ == Determinism::bitwise ? token_bounds(*this, "GPT", B, 1)
                                                     : std::vector<std::int64_t>{},
                /*accumulate=*/true);
  report(this->wpe());
  wte_grad(g, demb.view({B * T, C}));
  report(wte());
  return Tensor();
}

// transformer.wte.weight's gradient: lm_head's dW = g^T xf plus the embedding's scatter-add of
// demb (Note [GPT]: per micro-shard in bitwise mode).
void GPT::wte_grad(const Tensor& g, const Tensor& demb) {
  Parameter& wte = this->wte().weight();
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
  // A shard without tokens (more micro-shards than samples) adds +0.0 leaves: such a part is left
  // undefined (no [V, C] fill, no add) and a node with one such child is the other child as it
  // is. Exact (Note [GPT]): no part holds -0.0, so x + (+0.0) == x for all of them.
  std::vector<std::pair<Tensor, std::int64_t>> stack;
  auto add_into = [](Tensor& left, Tensor&& right) {  // left = left + right; undefined: +0.0
    if (!left.defined())
      left = std::move(right);
    else if (right.defined())
      ops::axpy_(1.0f, right, left);
  };
  for (std::size_t s = 0; s + 1 < bounds.size(); ++s) {
    const std::int64_t lo = bounds[s], n = bounds[s + 1] - lo;
    Tensor part;
    if (n > 0) {
      part = Tensor::empty({V, C}, grad_dtype(wte.data.dtype(), determinism_), g.device());
      ops::gemm_tn_sharded(g.narrow(lo, n), xf_.narrow(lo, n), part, {0, n}, false);
      ops::embedding_backward(ids.narrow(lo, n), demb.narrow(lo, n), part, {0, n}, true);
    }
    stack.emplace_back(std::move(part), 1);
    while (stack.size() >= 2 && stack[stack.size() - 2].second == stack.back().second) {
      add_into(stack[stack.size() - 2].first, std::move(stack.back().first));
      stack[stack.size() - 2].second *= 2;
      stack.pop_back();
    }
  }
  Tensor total = std::move(stack.back().first);
  for (std::size_t i = stack.size() - 1; i-- > 0;) {
    add_into(stack[i].first, std::move(total));
    total = std::move(stack[i].first);
  }
  if (!total.defined()) {  // no shard holds a token: the tree of +0.0 leaves
    total = Tensor::empty({V, C}, grad_dtype(wte.data.dtype(), determinism_), g.device());
    ops::fill_(total, 0.0f);
  }
  if (wte.grad.defined())
    ops::axpy_(1.0f, total, wte.grad);
  else
    wte.grad = std::move(total);
}

}  // namespace ditto::nn
