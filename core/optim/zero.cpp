// optim::ZeroRedundancyOptimizer (zero.h): the flat layout, the chunked reduce_scatter /
// all_gather through one buffer, the sharded clip and the segment parameters of the inner
// optimizer (Note [ZeRO flat shards], Note [ZeRO grad clip]).
#include "core/optim/zero.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "core/base/error.h"
#include "core/numerics/canonical_tree.h"
#include "core/numerics/gpt_math.h"
#include "core/optim/grad_scaler.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/runtime/stream.h"

namespace ditto::optim {

namespace {

constexpr const char* kCall = "optim::ZeroRedundancyOptimizer";
constexpr std::int64_t kBlock = gpt::kSquaresBlock;

std::int64_t round_up(std::int64_t n, std::int64_t m) { return (n + m - 1) / m * m; }

/// `t` as a 1-dim view of all its elements.
Tensor flat(const Tensor& t) { return t.view({t.numel()}); }

}  // namespace

/// One piece of parameter `param` inside this rank's shard: elements [param_off, param_off +
/// len) of the parameter, at shard_off in the shard. `p` is what the inner optimizer steps.
struct ZeroRedundancyOptimizer::Segment {
  std::size_t param = 0;
  std::int64_t param_off = 0, shard_off = 0, len = 0;
  bool placeholder = false;     // a shard of padding only: one zero element
  const void* bound = nullptr;  // the parameter storage p.data views (f32), to notice a rebind
  bool master = false;          // p.data is this rank's f32 master of a bf16 / f16 piece
  nn::Parameter p;
};

/// One piece of parameter `param` inside one rank's part of a chunk: elements [param_off,
/// param_off + len) of the parameter, at buf_off in the collectives' buffer; rank = its owner.
struct ZeroRedundancyOptimizer::Piece {
  std::size_t param = 0;
  int rank = 0;
  std::int64_t param_off = 0, buf_off = 0, len = 0;
};

template <class F>
void ZeroRedundancyOptimizer::for_each_piece(std::int64_t c, int q0, int q1, F&& f) const {
  // chunk_params_[c] is in index order, so in decreasing slot offset (the layout is in reverse
  // parameters() order), and the slots do not overlap: the parameters with elements in rank q's
  // part [lo, hi) are the run of those starting before hi and ending after lo.
  const std::vector<std::size_t>& ps = chunk_params_[static_cast<std::size_t>(c)];
  const std::int64_t len_c = part_numel(c);
  for (int q = q0; q < q1; ++q) {
    const std::int64_t lo = flat_begin(q, c), hi = lo + len_c;
    auto it =
        std::partition_point(ps.begin(), ps.end(), [&](std::size_t i) { return offset_[i] >= hi; });
    for (; it != ps.end(); ++it) {
      const std::size_t i = *it;
      const std::int64_t a = std::max(lo, offset_[i]);
      const std::int64_t b = std::min(hi, offset_[i] + params_[i]->data.numel());
      if (a >= b) break;  // this slot ends at or before lo, and so do the later ones
      f(Piece{i, q, a - offset_[i], q * len_c + (a - lo), b - a});
    }
  }
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<nn::Parameter*> params,
                                                 Communicator comm,
                                                 const ZeroInnerFactory& make_inner, float lr,
                                                 ZeroOptions options)
    : Optimizer(std::move(params), kCall, {DType::f32, DType::bf16, DType::f16}),
      comm_(std::move(comm)),
      options_(options),
      make_inner_(make_inner) {
  DITTO_CHECK(std::isfinite(options.max_grad_norm) && options.max_grad_norm >= 0.0, kCall,
              ": options.max_grad_norm: expected a finite value >= 0 (0: no clipping), got ",
              options.max_grad_norm);
  DITTO_CHECK(options.bucket_cap_mb > 0.0 && std::isfinite(options.bucket_cap_mb), kCall,
              ": options.bucket_cap_mb: expected a finite size in MiB > 0, got ",
              options.bucket_cap_mb);
  DITTO_CHECK(make_inner != nullptr, kCall,
              ": make_inner: expected an optimizer factory, got "
              "an empty function");
  ranks_ = comm_.size();
  rank_ = comm_.rank();
  param_dtype_ = params_[0]->data.dtype();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    DITTO_CHECK(params_[i]->data.device() == comm_.device(), kCall, ": params[", i, "] ('",
                params_[i]->name, "'): expected a parameter on ", comm_.device().str(),
                " (the communicator's device of rank ", rank_, "), got ", params_[i]->data.str());
    // One dtype: the all_gather moves the parameters' own bytes through one buffer.
    DITTO_CHECK(params_[i]->data.dtype() == param_dtype_, kCall, ": params[", i, "] ('",
                params_[i]->name, "'): expected ", dtype_name(param_dtype_),
                " data (the dtype of params[0]; every parameter of one dtype), got ",
                params_[i]->data.str());
  }

  // The flat layout (Note [ZeRO flat shards]): block-aligned slots in the backward's order
  // (reverse parameters()), the total a multiple of N blocks.
  offset_.assign(params_.size(), 0);
  std::int64_t off = 0;
  for (std::size_t k = 0; k < params_.size(); ++k) {
    const std::size_t i = params_.size() - 1 - k;
    offset_[i] = off;
    off += round_up(params_[i]->data.numel(), kBlock);
  }
  total_ = std::max(round_up(off, ranks_ * kBlock), ranks_ * kBlock);
  shard_ = total_ / ranks_;
  // Chunks: N parts of chunk_ elements (the widest element the buffer carries is 4 bytes).
  const double cap_elems = options.bucket_cap_mb * 1024.0 * 1024.0 / 4.0 / ranks_;
  chunk_ = static_cast<std::int64_t>(std::min<double>(cap_elems, static_cast<double>(shard_)));
  chunk_ = std::max(chunk_ / kBlock * kBlock, kBlock);
  chunks_ = (shard_ + chunk_ - 1) / chunk_;

  // Each chunk's parameters (Note [ZeRO piece lists]): the chunks of N x chunk_ elements tile the
  // flat layout, so parameter i has elements in chunks [first, last] of its slot's elements.
  chunk_params_.resize(static_cast<std::size_t>(chunks_));
  chunks_of_.resize(params_.size());
  const std::int64_t span = ranks_ * chunk_;  // flat elements of every chunk but the last
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::int64_t n = params_[i]->data.numel();
    if (n == 0) continue;
    for (std::int64_t c = offset_[i] / span; c <= (offset_[i] + n - 1) / span; ++c) {
      chunk_params_[static_cast<std::size_t>(c)].push_back(i);
      chunks_of_[i].push_back(static_cast<std::size_t>(c));
    }
  }
  // This rank's segments: its pieces in shard order, a parameter's neighbouring pieces merged.
  for (std::int64_t c = 0; c < chunks_; ++c) {
    const std::int64_t len_c = part_numel(c);
    std::vector<Piece> mine;
    for_each_piece(c, rank_, rank_ + 1, [&](const Piece& pc) { mine.push_back(pc); });
    std::sort(mine.begin(), mine.end(),
              [](const Piece& x, const Piece& y) { return x.buf_off < y.buf_off; });
    for (const Piece& pc : mine) {
      const std::int64_t shard_off = c * chunk_ + (pc.buf_off - rank_ * len_c);
      if (!segments_.empty()) {
        Segment& last = *segments_.back();
        if (last.param == pc.param && last.shard_off + last.len == shard_off &&
            last.param_off + last.len == pc.param_off) {
          last.len += pc.len;
          continue;
        }
      }
      auto s = std::make_unique<Segment>();
      s->param = pc.param;
      s->param_off = pc.param_off;
      s->shard_off = shard_off;
      s->len = pc.len;
      segments_.push_back(std::move(s));
    }
  }
  for (auto& s : segments_)
    s->p.name = params_[s->param]->name + "[" + std::to_string(s->param_off) + ":" +
                std::to_string(s->param_off + s->len) + "]";
  if (segments_.empty()) {  // only padding here: one zero element that stays zero
    auto s = std::make_unique<Segment>();
    s->placeholder = true;
    s->len = 1;
    s->p.name = "(zero padding)";
    s->p.data = Tensor::zeros({1}, DType::f32, comm_.device());
    segments_.push_back(std::move(s));
  }
  if (options.overlap_comm) {
    reduce_dtype_ = nn::grad_dtype(param_dtype_, comm_.options().determinism);
    Backend& be = comm_.device().backend();
    comm_stream_ = be.create_stream(comm_.device().index);
    grads_done_ = be.create_event(comm_.device().index);
    comm_done_ = be.create_event(comm_.device().index);
  }
  refresh_segments();
  std::vector<nn::Parameter*> seg_params;
  for (auto& s : segments_) seg_params.push_back(&s->p);
  inner_ = make_inner(std::move(seg_params), lr);
  DITTO_CHECK(inner_ != nullptr, kCall, ": make_inner: returned no optimizer");
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() {
  try {
    if (comm_stream_) comm_stream_->synchronize();  // no work may outlive the buffer
  } catch (...) {  // already reported (or the run is failing anyway)
  }
}

std::int64_t ZeroRedundancyOptimizer::part_numel(std::int64_t c) const {
  return std::min(chunk_, shard_ - c * chunk_);
}

std::int64_t ZeroRedundancyOptimizer::flat_begin(int q, std::int64_t c) const {
  // Note [ZeRO flat shards]: chunk c is [c N chunk_, ...), rank q owning its q-th part.
  return c * ranks_ * chunk_ + q * part_numel(c);
}

std::pair<int, std::int64_t> ZeroRedundancyOptimizer::locate(std::int64_t f) const {
  const std::int64_t c = f / (ranks_ * chunk_), w = f - c * ranks_ * chunk_, len = part_numel(c);
  return {static_cast<int>(w / len), c * chunk_ + w % len};
}

std::vector<float> ZeroRedundancyOptimizer::to_flat(const std::vector<float>& gathered) const {
  std::vector<float> out(gathered.size());
  for (std::int64_t c = 0; c < chunks_; ++c)
    for (int q = 0; q < ranks_; ++q) {
      const auto first = gathered.begin() + q * shard_ + c * chunk_;
      std::copy(first, first + part_numel(c), out.begin() + flat_begin(q, c));
    }
  return out;
}

void ZeroRedundancyOptimizer::refresh_segments() {
  // f32 parameters: the segment's data is a view of the parameter itself, rebuilt when the
  // parameter's storage changed (Module::to, a rebinding load).
  // bf16 / f16 parameters: the segment's data is this rank's f32 master of the piece, made
  // once (exact upcast, as MasterWeights makes its masters) and from then on the truth.
  for (auto& s : segments_) {
    if (s->placeholder) continue;
    nn::Parameter& p = *params_[s->param];
    DITTO_CHECK(p.data.dtype() == param_dtype_, kCall, ": params[", s->param, "] ('", p.name,
                "'): expected ", dtype_name(param_dtype_),
                " data (its dtype when the optimizer "
                "was made), got ",
                p.data.str());
    if (p.data.dtype() != DType::f32) {
      if (s->master) continue;
      Tensor m = ops::cast(flat(p.data).narrow(s->param_off, s->len), DType::f32);
      s->p.data = p.data.dim() >= 2 ? m.view({1, s->len}) : m;
      s->master = true;
      continue;
    }
    const void* storage = p.data.data_ptr();
    if (s->bound == storage && s->p.data.defined()) continue;
    Tensor v = flat(p.data).narrow(s->param_off, s->len);
    s->p.data = p.data.dim() >= 2 ? v.view({1, s->len}) : v;
    s->bound = storage;
  }
}

void ZeroRedundancyOptimizer::set_lr(double lr) {
  check_lr(lr, "optim::ZeroRedundancyOptimizer::set_lr");
  inner_->set_lr(lr);
}

std::size_t ZeroRedundancyOptimizer::state_bytes() const {
  std::size_t masters = 0;
  for (const auto& s : segments_)
    if (s->master) masters += static_cast<std::size_t>(s->len) * sizeof(float);
  return inner_->state_bytes() + masters;
}

void ZeroRedundancyOptimizer::attach_grad_scaler(GradScaler* scaler) {
  scaler_ = scaler;
  if (!scaler_) return;
  // Each rank checks its shard only: found_inf is the max of the ranks' flags.
  scaler_->set_found_inf_reducer([this](bool local) {
    Tensor f = Tensor::from_vector(std::vector<float>{local ? 1.0f : 0.0f}, {1}, comm_.device());
    comm_.all_reduce(f, ReduceOp::max);
    return f.item() != 0.0f;
  });
}

const std::vector<nn::Parameter*>& ZeroRedundancyOptimizer::layout_params() const {
  if (param_dtype_ == DType::f32) return params_;
  if (layout_ptrs_.empty()) {  // f32 stand-ins (host, no values) of the parameters' shapes
    for (const nn::Parameter* p : params_) {
      auto q = std::make_unique<nn::Parameter>();
      q->name = p->name;
      q->data = Tensor::empty(p->data.shape(), DType::f32, Device::cpu());
      layout_ptrs_.push_back(q.get());
      layout_.push_back(std::move(q));
    }
  }
  return layout_ptrs_;
}

std::unique_ptr<Optimizer> ZeroRedundancyOptimizer::unsharded() const {
  std::unique_ptr<Optimizer> o = make_inner_(layout_params(), static_cast<float>(inner_->lr()));
  DITTO_CHECK(o != nullptr, kCall, ": make_inner: returned no optimizer");
  o->set_lr(inner_->lr());
  return o;
}

std::vector<std::size_t> ZeroRedundancyOptimizer::inner_order() const {
  std::map<const nn::Parameter*, std::size_t> index;
  for (std::size_t j = 0; j < segments_.size(); ++j) index[&segments_[j]->p] = j;
  std::vector<std::size_t> out;
  for (const nn::Parameter* p : inner_->parameters()) out.push_back(index.at(p));
  return out;
}

std::vector<std::size_t> ZeroRedundancyOptimizer::param_order(const Optimizer& o) const {
  std::map<const nn::Parameter*, std::size_t> index;
  const std::vector<nn::Parameter*>& layout = layout_params();
  for (std::size_t i = 0; i < layout.size(); ++i) index[layout[i]] = i;
  std::vector<std::size_t> out;
  for (const nn::Parameter* p : o.parameters()) out.push_back(index.at(p));
  return out;
}

namespace {
// The state keys consolidate_state_dict knows (SGD's, Adam's and AdamW's), in their
// state_dict order; "step" is a 0-dim i64 count, the others f32 of the parameter's shape.
const std::vector<std::string> kStateKeys{"step", "momentum_buffer", "exp_avg", "exp_avg_sq",
                                          "max_exp_avg_sq"};
}  // namespace

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  const char* call = "optim::ZeroRedundancyOptimizer::consolidate_state_dict";
  DITTO_CHECK(to >= 0 && to < ranks_, call, ": to: expected a rank in [0, ", ranks_, "), got ", to);
  const OptimizerState mine = inner_->state_dict();
  const std::size_t np = params_.size(), nk = kStateKeys.size();
  // state.<j> indexes inner_->parameters() (AdamW orders them by group), not segments_.
  const std::vector<std::size_t> seg_at = inner_order();
  // Agreed over the ranks (max): which keys exist, which parameters have state, their steps.
  std::vector<std::int64_t> flags(nk + 2 * np, 0);
  std::vector<std::map<std::string, const Tensor*>> per(segments_.size());
  for (const auto& [name, t] : mine.tensors) {
    auto [j, key] = split_state_name(name);
    const auto k = std::find(kStateKeys.begin(), kStateKeys.end(), key);
    DITTO_CHECK(k != kStateKeys.end(), call, ": the inner optimizer's state key '", key,
                "' is not one of SGD's, Adam's or AdamW's");
    flags[static_cast<std::size_t>(k - kStateKeys.begin())] = 1;
    const Segment& s = *segments_[seg_at[j]];
    if (s.placeholder) continue;
    per[seg_at[j]][key] = &t;
    flags[nk + s.param] = 1;
    if (key == "step") flags[nk + np + s.param] = *t.data<std::int64_t>();
  }
  Tensor agreed =
      Tensor::from_vector(flags, {static_cast<std::int64_t>(flags.size())}, comm_.device());
  comm_.all_reduce(agreed, ReduceOp::max);
  flags = agreed.to_vector<std::int64_t>();
  // Each f32 key over the flat layout: this rank's shard, all_gathered.
  std::map<std::string, std::vector<float>> gathered;
  for (std::size_t k = 1; k < nk; ++k) {
    if (!flags[k]) continue;
    const std::string& key = kStateKeys[k];
    std::vector<float> shard(static_cast<std::size_t>(shard_), 0.0f);
    for (std::size_t j = 0; j < segments_.size(); ++j) {
      auto it = per[j].find(key);
      if (it == per[j].end()) continue;
      const std::vector<float> v = it->second->to_vector<float>();
      std::copy(v.begin(), v.end(), shard.begin() + segments_[j]->shard_off);
    }
    Tensor send = Tensor::from_vector(shard, {shard_}, comm_.device());
    Tensor all = Tensor::empty({total_}, DType::f32, comm_.device());
    comm_.all_gather(send, all);
    if (rank_ == to) gathered[key] = to_flat(all.to_vector<float>());
  }
  // bf16 / f16: the f32 masters too (MasterWeights' "master.<i>"), gathered the same way.
  std::vector<float> masters;
  if (param_dtype_ != DType::f32) {
    std::vector<float> shard(static_cast<std::size_t>(shard_), 0.0f);
    for (const auto& sg : segments_) {
      if (sg->placeholder) continue;
      const std::vector<float> v = sg->p.data.to_vector<float>();
      std::copy(v.begin(), v.end(), shard.begin() + sg->shard_off);
    }
    Tensor send = Tensor::from_vector(shard, {shard_}, comm_.device());
    Tensor all = Tensor::empty({total_}, DType::f32, comm_.device());
    comm_.all_gather(send, all);
    if (rank_ == to) masters = to_flat(all.to_vector<float>());
  }
  consolidated_.reset();
  if (rank_ != to) return;
  const std::unique_ptr<Optimizer> ref = unsharded();
  const OptimizerState layout = ref->state_dict();  // type and options, no tensors
  const std::vector<std::size_t> param_at = param_order(*ref);
  auto out = std::make_unique<OptimizerState>(OptimizerState{layout.type, layout.options, {}});
  for (std::size_t pos = 0; pos < np; ++pos) {
    const std::size_t i = param_at[pos];  // state.<pos> is ref->parameters()[pos]
    if (!flags[nk + i]) continue;
    const std::string prefix = "state." + std::to_string(pos) + ".";
    if (flags[0]) {
      Tensor step = Tensor::empty({}, DType::i64, Device::cpu());
      *step.data<std::int64_t>() = flags[nk + np + i];
      out->tensors.emplace_back(prefix + "step", step);
    }
    const std::int64_t n = params_[i]->data.numel();
    for (std::size_t k = 1; k < nk; ++k) {
      if (!flags[k]) continue;
      const std::vector<float>& all = gathered[kStateKeys[k]];
      const auto first = all.begin() + offset_[i];
      out->tensors.emplace_back(prefix + kStateKeys[k],
                                Tensor::from_vector(std::vector<float>(first, first + n),
                                                    params_[i]->data.shape(), Device::cpu()));
    }
  }
  if (param_dtype_ != DType::f32) {  // MasterWeights' layout (Note [Master weights])
    out->options["master_weights"] = "f32";
    if (scaler_) put_scaler_state(*scaler_, out->options);
    for (std::size_t i = 0; i < np; ++i) {
      const auto first = masters.begin() + offset_[i];
      out->tensors.emplace_back(
          "master." + std::to_string(i),
          Tensor::from_vector(std::vector<float>(first, first + params_[i]->data.numel()),
                              params_[i]->data.shape(), Device::cpu()));
    }
  }
  consolidated_ = std::move(out);
}

OptimizerState ZeroRedundancyOptimizer::state_dict() const {
  DITTO_CHECK(consolidated_ != nullptr,
              "optim::ZeroRedundancyOptimizer::state_dict: the state "
              "is sharded over the ranks: expected consolidate_state_dict(to) on every rank "
              "first, and state_dict() on rank `to` (this is rank ",
              rank_, ")");
  return *consolidated_;
}

void ZeroRedundancyOptimizer::load_state_dict(const OptimizerState& state) {
  // The unsharded optimizer checks the state (and holds it for a moment), then this rank keeps
  // the pieces of its segments. bf16 / f16: MasterWeights' layout, its masters split off first.
  const char* call = "optim::ZeroRedundancyOptimizer::load_state_dict";
  OptimizerState plain = state;
  std::vector<const Tensor*> found(params_.size(), nullptr);
  std::map<std::string, std::string> scaler_state;
  if (param_dtype_ != DType::f32) {
    auto mw = plain.options.find("master_weights");
    DITTO_CHECK(mw != plain.options.end() && mw->second == "f32", call,
                ": state: saved without master weights (option master_weights=f32 missing; a "
                "run in f32 keeps none): cannot resume a mixed-precision run from it");
    plain.options.erase(mw);
    scaler_state = take_scaler_state(plain.options);
    DITTO_CHECK((scaler_ != nullptr) == !scaler_state.empty(), call, ": state: saved ",
                scaler_state.empty() ? "without" : "with",
                " a GradScaler's state (grad_scaler.* "
                "options), this run ",
                scaler_ ? "scales its loss (f16)" : "has none");
    if (scaler_) {  // checks before changing: a copy loads first
      GradScaler check(scaler_->options());
      check.load_state_dict(scaler_state);
    }
    plain.tensors.clear();
    const std::string mp = "master.";
    for (const auto& [name, t] : state.tensors) {
      if (name.compare(0, mp.size(), mp) != 0) {
        plain.tensors.emplace_back(name, t);
        continue;
      }
      const std::string idx = name.substr(mp.size());
      bool ok = !idx.empty() && idx.size() < 10;
      for (char c : idx) ok = ok && c >= '0' && c <= '9';
      const std::size_t i = ok ? std::stoul(idx) : 0;
      DITTO_CHECK(ok && i < params_.size(), call, ": state: unexpected tensor '", name,
                  "' (expected master.<i> with i < ", params_.size(), ")");
      DITTO_CHECK(found[i] == nullptr, call, ": state: tensor '", name, "' appears more than once");
      DITTO_CHECK(t.defined() && t.dtype() == DType::f32 && t.shape() == params_[i]->data.shape(),
                  call, ": state: tensor '", name, "': expected ",
                  shape_str(params_[i]->data.shape()), " f32 (the master of parameter ", i, " '",
                  params_[i]->name, "'), got ",
                  t.defined() ? t.str() : std::string("an undefined tensor"));
      found[i] = &t;
    }
    for (std::size_t i = 0; i < found.size(); ++i)
      DITTO_CHECK(found[i] != nullptr, call, ": state: tensor 'master.", i, "' (the master of '",
                  params_[i]->name, "') is missing");
  }
  std::unique_ptr<Optimizer> ref = unsharded();
  ref->load_state_dict(plain);
  const OptimizerState full = ref->state_dict();
  const std::vector<std::size_t> param_at = param_order(*ref);
  ref.reset();
  std::vector<std::size_t> pos_of(segments_.size());  // segment -> its state.<j> index
  const std::vector<std::size_t> seg_at = inner_order();
  for (std::size_t j = 0; j < seg_at.size(); ++j) pos_of[seg_at[j]] = j;
  const OptimizerState own = inner_->state_dict();
  OptimizerState seg{own.type, own.options, {}};
  if (auto it = state.options.find("lr"); it != state.options.end()) seg.options["lr"] = it->second;
  std::vector<std::vector<std::size_t>> segs_of(params_.size());
  for (std::size_t j = 0; j < segments_.size(); ++j)
    if (!segments_[j]->placeholder) segs_of[segments_[j]->param].push_back(j);
  for (const auto& [name, t] : full.tensors) {
    auto [pos, key] = split_state_name(name);
    for (std::size_t j : segs_of[param_at[pos]]) {
      const Segment& s = *segments_[j];
      const std::string sname = "state." + std::to_string(pos_of[j]) + "." + key;
      if (t.dim() == 0) {
        seg.tensors.emplace_back(sname, t);
      } else {
        Tensor piece = flat(t).narrow(s.param_off, s.len);
        seg.tensors.emplace_back(sname, s.p.data.dim() == 2 ? piece.view({1, s.len}) : piece);
      }
    }
  }
  inner_->load_state_dict(seg);
  if (scaler_) scaler_->load_state_dict(scaler_state);
  for (auto& sg : segments_) {
    if (!sg->master) continue;
    Tensor piece = flat(*found[sg->param]).narrow(sg->param_off, sg->len).to(comm_.device());
    flat(sg->p.data).copy_(piece);
  }
  consolidated_.reset();
}

float ZeroRedundancyOptimizer::clip(Determinism mode, const std::vector<bool>& has_grad) {
  float total = 0.0f;
  if (mode == Determinism::fast) {
    Tensor s = ops::sum_squares(grad_shard_, mode);
    comm_.all_reduce(s, ReduceOp::sum);
    total = std::sqrt(s.item());
  } else {
    // Note [ZeRO grad clip]: every rank's block chains, then clip_grad_norm_'s sums.
    Tensor mine = ops::sum_squares_blocks(grad_shard_);  // [S / kBlock]
    Tensor all = Tensor::empty({ranks_ * mine.numel()}, DType::f32, comm_.device());
    comm_.all_gather(mine, all);
    const std::vector<float> leaves = all.to_vector<float>();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (!has_grad[i]) continue;
      const std::int64_t blocks = gpt::squares_blocks(params_[i]->data.numel());
      float s = 0.0f;
      if (blocks > 0) {
        canonical::TreeStack<1, 64> tree;
        for (std::int64_t k = 0; k < blocks; ++k) {
          const auto [q, at] = locate(offset_[i] + k * kBlock);  // the block's owner and place
          float leaf[1] = {leaves[static_cast<std::size_t>(q * (shard_ / kBlock) + at / kBlock)]};
          tree.push(k, leaf);
        }
        float root[1];
        tree.result(root);
        s = root[0];
      }
      total += s;
    }
    total = std::sqrt(total);
  }
  const float coef = static_cast<float>(options_.max_grad_norm) / (total + 1e-6f);
  if (!(coef >= 1.0f)) ops::scale_(grad_shard_, coef);
  return total;
}

namespace {
/// Note [ZeRO copies]: each piece copied now, or queued for the list's one copy_multi launch.
/// Queued pieces are kept as the kernel's (src, dst, n) (Note [ZeRO piece lists]: a chunk's
/// list has a piece a rank, so no tensor is made for one): exactly the pointers and counts
/// ops::copy_multi_ would pass for the pieces' narrowed tensors, whose checks hold by
/// construction (contiguous pieces of one dtype a side, no dst overlapping another or a src).
struct CopyList {
  explicit CopyList(bool multi_tensor) : multi(multi_tensor) {}
  bool multi = false;
  DType from = DType::f32, to = DType::f32;
  std::vector<const void*> srcs;
  std::vector<void*> dsts;
  std::vector<std::int64_t> ns;
  /// Elements [dst_off, dst_off + n) of `dst` get elements [src_off, src_off + n) of `src` (both
  /// as 1-dim; every piece of a list of one src dtype and one dst dtype).
  void add(const Tensor& dst, std::int64_t dst_off, const Tensor& src, std::int64_t src_off,
           std::int64_t n) {
    if (!multi) {
      flat(dst).narrow(dst_off, n).copy_(flat(src).narrow(src_off, n));
      return;
    }
    DITTO_CHECK(dst_off >= 0 && src_off >= 0 && n >= 0 && dst_off + n <= dst.numel() &&
                    src_off + n <= src.numel(),
                kCall, ": a piece [", src_off, ", ", src_off + n, ") -> [", dst_off, ", ",
                dst_off + n, ") outside ", src.str(), " -> ", dst.str());
    if (ns.empty()) {
      from = src.dtype();
      to = dst.dtype();
    }
    // ops::copy_multi_'s dtype rule, which this list skips: one src and one dst dtype a list.
    DITTO_CHECK(src.dtype() == from && dst.dtype() == to, kCall, ": a piece ",
                dtype_name(src.dtype()), " -> ", dtype_name(dst.dtype()), " in a list of ",
                dtype_name(from), " -> ", dtype_name(to));
    srcs.push_back(static_cast<const char*>(src.data_ptr()) + src_off * dtype_size(from));
    dsts.push_back(static_cast<char*>(dst.data_ptr()) + dst_off * dtype_size(to));
    ns.push_back(n);
  }
  void flush(const Device& device) {
    if (!multi || ns.empty()) return;
    device.backend().kernels().copy_multi(current_stream(device), from, to, srcs, dsts, ns);
    srcs.clear();
    dsts.clear();
    ns.clear();
  }
};
}  // namespace

void ZeroRedundancyOptimizer::reduce_scatter_chunk(std::int64_t c,
                                                   const std::vector<bool>& has_grad) {
  // buffer = every rank's part of chunk c (padding and parameters without grad zero).
  const bool multi = ops::has_multi_tensor_kernels(comm_.device());
  CopyList copies{multi};
  const std::int64_t len_c = part_numel(c);
  Tensor send = buffer_.narrow(0, ranks_ * len_c);
  ops::fill_(send, 0.0);
  for_each_piece(c, 0, ranks_, [&](const Piece& pc) {
    if (!has_grad[pc.param]) return;
    copies.add(send, pc.buf_off, params_[pc.param]->grad, pc.param_off, pc.len);
  });
  copies.flush(comm_.device());
  Tensor dst = grad_shard_.narrow(c * chunk_, len_c);
  if (buffer_.dtype() == DType::f32) {
    comm_.reduce_scatter(send, dst, ReduceOp::sum);
  } else {  // reduced in the grad dtype (in place: NCCL's layout), then upcast exactly
    Tensor mine = send.narrow(rank_ * len_c, len_c);
    comm_.reduce_scatter(send, mine, ReduceOp::sum);
    if (multi) {  // the upcast straight into the shard: one launch, no f32 temporary
      ops::copy_multi_({dst}, {mine});
    } else {
      Tensor up = ops::cast(mine, DType::f32);
      dst.copy_(up);
      // On the communication stream: alive until it has run (freed on the host now, its memory
      // could go to the compute stream first).
      if (comm_stream_ && &current_stream(comm_.device()) == comm_stream_.get())
        in_flight_.push_back(std::move(up));
    }
  }
}

void ZeroRedundancyOptimizer::prepare_overlap() {
  if (!options_.overlap_comm) return;
  comm_stream_->synchronize();  // a step that never came (an exception) left nothing running
  in_flight_.clear();
  pending_.assign(static_cast<std::size_t>(chunks_), 0);
  for (const auto& of : chunks_of_)
    for (std::size_t c : of) ++pending_[c];
  reported_.assign(params_.size(), 0);
  packed_.assign(params_.size(), -1);
  overlap_error_.clear();
  next_chunk_ = 0;
  chunks_overlapped_ = 0;
  armed_ = true;
}

void ZeroRedundancyOptimizer::grad_ready(const nn::Parameter& p) {
  if (!armed_) return;
  const auto it = std::find(params_.begin(), params_.end(), &p);
  if (it == params_.end()) return;
  const auto i = static_cast<std::size_t>(it - params_.begin());
  if (reported_[i]) return;
  reported_[i] = 1;
  for (std::size_t c : chunks_of_[i]) --pending_[c];
  launch_ready_chunks();
}

void ZeroRedundancyOptimizer::launch_ready_chunks() {
  while (next_chunk_ < pending_.size() && pending_[next_chunk_] == 0) {
    const auto c = static_cast<std::int64_t>(next_chunk_++);
    // The shard and the buffer live from the first chunk's reduce_scatter to the end of step();
    // allocated on the compute stream (whose step() frees them after waiting for this one).
    if (!grad_shard_.defined()) {
      grad_shard_ = Tensor::empty({shard_}, DType::f32, comm_.device());
      buffer_ = Tensor::empty({ranks_ * chunk_}, reduce_dtype_, comm_.device());
    }
    // What each parameter of the chunk has now is what step() must find: a grad (packed) or none.
    std::vector<bool> has_grad(params_.size(), false);
    for_each_piece(c, 0, ranks_, [&](const Piece& pc) {
      const nn::Parameter& p = *params_[pc.param];
      bool has = p.grad.defined();
      if (has && (p.grad.dtype() != reduce_dtype_ || p.grad.numel() != p.data.numel() ||
                  p.grad.device() != p.data.device())) {
        if (overlap_error_.empty())
          overlap_error_ =
              detail::cat(kCall, ": params[", pc.param, "] ('", p.name, "'): grad: expected ",
                          shape_str(p.data.shape()), " ", dtype_name(reduce_dtype_), " on ",
                          p.data.device().str(), " (overlap_comm reduces in nn::grad_dtype), got ",
                          p.grad.str());
        has = false;
      }
      has_grad[pc.param] = has;
      // A parameter in several chunks: 2 when they found it differently (step() refuses it).
      signed char& seen = packed_[pc.param];
      seen = seen >= 0 && seen != (has ? 1 : 0) ? 2 : (has ? 1 : 0);
    });
    // The grads were produced on this thread's current stream: the communication stream waits
    // for them (DistributedDataParallel's bucket launch).
    current_stream(comm_.device()).record(*grads_done_);
    comm_stream_->wait(*grads_done_);
    StreamGuard guard(*comm_stream_);
    reduce_scatter_chunk(c, has_grad);
  }
}

void ZeroRedundancyOptimizer::finish_overlap() {
  armed_ = false;
  chunks_overlapped_ = next_chunk_;
  std::fill(pending_.begin(), pending_.end(), 0);  // parameters never reported: ready now
  launch_ready_chunks();
  comm_stream_->record(*comm_done_);
  current_stream(comm_.device()).wait(*comm_done_);
  comm_stream_->synchronize();  // rethrows the collectives' errors (Timeout, a failed peer)
  in_flight_.clear();
}

void ZeroRedundancyOptimizer::step() {
  // Overlap (Note [ZeRO overlapped reduce_scatter]): the chunks the backward did not start go
  // now, and all are waited for, before the checks (every rank issues the same collectives).
  const bool overlapped = armed_;
  if (overlapped) {
    try {
      finish_overlap();
    } catch (...) {
      grad_shard_ = Tensor();
      buffer_ = Tensor();
      throw;
    }
  } else {
    chunks_overlapped_ = 0;
  }
  struct Release {  // the shard and the buffer live during step() only (or from the backward)
    Tensor& a;
    Tensor& b;
    ~Release() {
      a = Tensor();
      b = Tensor();
    }
  } release{grad_shard_, buffer_};
  // Checks first: a rejected step runs no collective (with overlap: none after the
  // reduce_scatters) and changes nothing.
  std::vector<bool> has_grad(params_.size(), false);
  DType grad_dtype = DType::f32;
  bool any = false;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const nn::Parameter& p = *params_[i];
    if (!p.grad.defined()) continue;
    DITTO_CHECK(p.grad.shape() == p.data.shape() && p.grad.device() == p.data.device() &&
                    (p.grad.dtype() == DType::f32 || p.grad.dtype() == p.data.dtype()) &&
                    (!any || p.grad.dtype() == grad_dtype),
                kCall, ": params[", i, "] ('", p.name, "'): grad: expected ",
                shape_str(p.data.shape()), " ", any ? dtype_name(grad_dtype) : "f32", " on ",
                p.data.device().str(),
                " (the parameter's shape and device, every grad of one "
                "dtype), got ",
                p.grad.str());
    grad_dtype = p.grad.dtype();
    any = true;
    has_grad[i] = true;
  }
  if (overlapped) {
    DITTO_CHECK(overlap_error_.empty(), overlap_error_);
    for (std::size_t i = 0; i < params_.size(); ++i)
      DITTO_CHECK(packed_[i] < 0 || packed_[i] == (has_grad[i] ? 1 : 0), kCall, ": params[", i,
                  "] ('", params_[i]->name, "'): grad ", has_grad[i] ? "appeared" : "disappeared",
                  " after its chunk's reduce_scatter started (overlap_comm: grad_ready() must "
                  "report a parameter only once its grad is final for the step)");
  }
  refresh_segments();
  const Determinism mode = comm_.options().determinism;
  // Note [ZeRO copies]: one copy_multi launch per list where the backend has them.
  const bool multi = ops::has_multi_tensor_kernels(comm_.device());
  CopyList copies{multi};

  // 1. reduce_scatter, chunk by chunk (with overlap: done above).
  if (!overlapped) {
    grad_shard_ = Tensor::empty({shard_}, DType::f32, comm_.device());
    buffer_ = Tensor::empty({ranks_ * chunk_}, grad_dtype, comm_.device());
    for (std::int64_t c = 0; c < chunks_; ++c) reduce_scatter_chunk(c, has_grad);
  }

  // 2. the segments' grads: views of the reduced shard.
  for (auto& s : segments_) {
    if (s->placeholder) {
      s->p.grad = any ? Tensor::zeros({1}, DType::f32, comm_.device()) : Tensor();
      continue;
    }
    if (!has_grad[s->param]) {
      s->p.grad = Tensor();
      continue;
    }
    Tensor g = grad_shard_.narrow(s->shard_off, s->len);
    s->p.grad = s->p.data.dim() == 2 ? g.view({1, s->len}) : g;
  }
  struct ClearGrads {  // no view of the shard outlives the step
    std::vector<std::unique_ptr<Segment>>& segs;
    ~ClearGrads() {
      for (auto& s : segs) s->p.grad = Tensor();
    }
  } clear_grads{segments_};

  // 3. f16: the GradScaler's unscale_ and inf / NaN check on the shard (Note [ZeRO mixed
  // precision]); every rank agrees (all_reduce max) and a skipped step changes no parameter.
  if (scaler_) {
    std::vector<nn::Parameter*> seg_params;
    for (auto& s : segments_) seg_params.push_back(&s->p);
    if (scaler_->unscale_(seg_params, mode)) return;
  }

  // 4. the clip over the full reduced gradients.
  if (options_.max_grad_norm > 0.0) last_norm_ = clip(mode, has_grad);

  // 5. the shard's update; bf16 / f16: each master rounded once (RNE) into its piece.
  inner_->step();
  std::vector<Tensor> rounded, masters;
  for (auto& s : segments_) {
    if (!s->master || !has_grad[s->param]) continue;
    Tensor piece = flat(params_[s->param]->data).narrow(s->param_off, s->len);
    if (!multi) {
      piece.copy_(ops::cast(flat(s->p.data), param_dtype_));
      continue;
    }
    rounded.push_back(piece);  // copy_multi_ rounds f32 into bf16 / f16 (cast_multi)
    masters.push_back(flat(s->p.data));
  }
  if (multi) ops::copy_multi_(rounded, masters);  // every master into its piece in one launch
  grad_shard_ = Tensor();

  // 6. all_gather of the parameters in their dtype, chunk by chunk.
  if (ranks_ == 1) return;
  if (buffer_.dtype() != param_dtype_)
    buffer_ = Tensor::empty({ranks_ * chunk_}, param_dtype_, comm_.device());
  for (std::int64_t c = 0; c < chunks_; ++c) {
    const std::int64_t len_c = std::min(chunk_, shard_ - c * chunk_);
    Tensor recv = buffer_.narrow(0, ranks_ * len_c);
    Tensor mine = recv.narrow(rank_ * len_c, len_c);  // in place: NCCL's all_gather layout
    for_each_piece(c, rank_, rank_ + 1, [&](const Piece& pc) {
      if (!has_grad[pc.param]) return;
      copies.add(mine, pc.buf_off - rank_ * len_c, params_[pc.param]->data, pc.param_off, pc.len);
    });
    copies.flush(comm_.device());
    comm_.all_gather(mine, recv);
    const auto take = [&](const Piece& pc) {  // every other rank's pieces, in rank order
      if (!has_grad[pc.param]) return;
      copies.add(params_[pc.param]->data, pc.param_off, recv, pc.buf_off, pc.len);
    };
    for_each_piece(c, 0, rank_, take);
    for_each_piece(c, rank_ + 1, ranks_, take);
    copies.flush(comm_.device());
  }
}

}  // namespace ditto::optim
