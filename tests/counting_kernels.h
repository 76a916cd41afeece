// A Kernels for tests that probe which kernels the ops call: every kernel of the simulator (or any
// backend) behind it, each call counted by name, and f32 scratch for a probe's own typed entries
// (the typed-kernel tests: test_rows_ex.cpp, test_optim_fused.cpp derive from it and answer the
// capability queries they test).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/runtime/backend.h"

namespace ditto::test {

class CountingKernels : public Kernels {
 public:
  CountingKernels(Backend& sim, Kernels& k) : sim_(sim), k_(k) {}

  std::map<std::string, int> calls;  ///< calls per kernel name since the last clear
  int count(const std::string& name) const {
    auto it = calls.find(name);
    return it == calls.end() ? 0 : it->second;
  }

  // ---- every kernel: the inner backend's, counted
  void cast(Stream& s, const void* x, DType from, void* y, DType to, std::int64_t n) override {
    note("cast");
    k_.cast(s, x, from, y, to, n);
  }
  void gemm(Stream& s, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
            float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
            float beta, float* C, std::int64_t ldc, Determinism mode) override {
    note("gemm");
    k_.gemm(s, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, mode);
  }
  bool has_gemm_ex(DType a_type, DType b_type, DType c_type, Determinism mode) const override {
    return k_.has_gemm_ex(a_type, b_type, c_type, mode);
  }
  void gemm_ex(Stream& s, const GemmExArgs& g) override {
    note("gemm_ex");
    k_.gemm_ex(s, g);
  }
  bool has_gemm_gelu_epilogue(DType dtype, Determinism mode) const override {
    return k_.has_gemm_gelu_epilogue(dtype, mode);
  }
  void add_bias(Stream& s, float* y, const float* bias, std::int64_t rows,
                std::int64_t cols) override {
    note("add_bias");
    k_.add_bias(s, y, bias, rows, cols);
  }
  void sum_rows(Stream& s, const float* x, std::int64_t rows, std::int64_t cols, float beta,
                float* out, Determinism mode) override {
    note("sum_rows");
    k_.sum_rows(s, x, rows, cols, beta, out, mode);
  }
  void relu(Stream& s, const float* x, float* y, std::int64_t n) override {
    note("relu");
    k_.relu(s, x, y, n);
  }
  void relu_backward(Stream& s, const float* y, const float* gy, float* gx,
                     std::int64_t n) override {
    note("relu_backward");
    k_.relu_backward(s, y, gy, gx, n);
  }
  void cross_entropy(Stream& s, const float* logits, const std::int64_t* targets, std::int64_t rows,
                     std::int64_t classes, float* losses) override {
    note("cross_entropy");
    k_.cross_entropy(s, logits, targets, rows, classes, losses);
  }
  void cross_entropy_backward(Stream& s, const float* logits, const std::int64_t* targets,
                              std::int64_t rows, std::int64_t classes, const float* grad_loss,
                              float scale, float* grad_logits) override {
    note("cross_entropy_backward");
    k_.cross_entropy_backward(s, logits, targets, rows, classes, grad_loss, scale, grad_logits);
  }
  void mse(Stream& s, const float* x, const float* t, std::int64_t rows, std::int64_t cols,
           float* losses) override {
    note("mse");
    k_.mse(s, x, t, rows, cols, losses);
  }
  void mse_backward(Stream& s, const float* x, const float* t, std::int64_t n,
                    const float* grad_loss, float scale, float* gx) override {
    note("mse_backward");
    k_.mse_backward(s, x, t, n, grad_loss, scale, gx);
  }
  void sum(Stream& s, const float* x, std::int64_t n, float scale, float* out,
           Determinism mode) override {
    note("sum");
    k_.sum(s, x, n, scale, out, mode);
  }
  void fill_f32(Stream& s, float* x, float value, std::int64_t n) override {
    note("fill_f32");
    k_.fill_f32(s, x, value, n);
  }
  void axpy(Stream& s, float alpha, const float* x, float* y, std::int64_t n) override {
    note("axpy");
    k_.axpy(s, alpha, x, y, n);
  }
  void scale(Stream& s, float alpha, float* x, std::int64_t n) override {
    note("scale");
    k_.scale(s, alpha, x, n);
  }
  void sum_inputs(Stream& s, const float* const* inputs, int n_inputs, float* out,
                  std::int64_t numel, Determinism mode) override {
    note("sum_inputs");
    k_.sum_inputs(s, inputs, n_inputs, out, numel, mode);
  }
  void sgd_step(Stream& s, float* param, const float* grad, float* momentum_buf, std::int64_t n,
                float lr, float momentum, float dampening, float weight_decay, bool nesterov,
                bool first_step) override {
    note("sgd_step");
    k_.sgd_step(s, param, grad, momentum_buf, n, lr, momentum, dampening, weight_decay, nesterov,
                first_step);
  }
  void gemm_tn_sharded(Stream& s, std::int64_t M, std::int64_t N, const float* A, std::int64_t lda,
                       const float* B, std::int64_t ldb, const std::vector<std::int64_t>& bounds,
                       float* C, std::int64_t ldc, bool accumulate) override {
    note("gemm_tn_sharded");
    k_.gemm_tn_sharded(s, M, N, A, lda, B, ldb, bounds, C, ldc, accumulate);
  }
  void sum_rows_sharded(Stream& s, const float* x, std::int64_t rows, std::int64_t cols,
                        const std::vector<std::int64_t>& bounds, float* out,
                        bool accumulate) override {
    note("sum_rows_sharded");
    k_.sum_rows_sharded(s, x, rows, cols, bounds, out, accumulate);
  }
  void sum_sharded(Stream& s, const float* x, const std::vector<std::int64_t>& bounds, float scale,
                   float* out) override {
    note("sum_sharded");
    k_.sum_sharded(s, x, bounds, scale, out);
  }
  void adam_step(Stream& s, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                 float* max_exp_avg_sq, std::int64_t n, double lr, double beta1, double beta2,
                 double eps, double weight_decay, double bias_correction1, double bias_correction2,
                 bool amsgrad) override {
    note("adam_step");
    k_.adam_step(s, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, n, lr, beta1, beta2, eps,
                 weight_decay, bias_correction1, bias_correction2, amsgrad);
  }
  void embedding_forward(Stream& s, const std::int64_t* idx, const float* wte, const float* wpe,
                         std::int64_t N, std::int64_t T, std::int64_t C, float* out) override {
    note("embedding_forward");
    k_.embedding_forward(s, idx, wte, wpe, N, T, C, out);
  }
  void embedding_backward(Stream& s, const std::int64_t* idx, const float* dy, std::int64_t N,
                          std::int64_t C, std::int64_t V, const std::vector<std::int64_t>& bounds,
                          float* grad_wte, bool accumulate) override {
    note("embedding_backward");
    k_.embedding_backward(s, idx, dy, N, C, V, bounds, grad_wte, accumulate);
  }
  void layernorm_forward(Stream& s, const float* x, const float* w, const float* b, std::int64_t N,
                         std::int64_t C, float eps, float* y, float* mean, float* rstd) override {
    note("layernorm_forward");
    k_.layernorm_forward(s, x, w, b, N, C, eps, y, mean, rstd);
  }
  void layernorm_backward(Stream& s, const float* dy, const float* x, const float* w,
                          const float* mean, const float* rstd, std::int64_t N, std::int64_t C,
                          float* dx, float* dy_xhat) override {
    note("layernorm_backward");
    k_.layernorm_backward(s, dy, x, w, mean, rstd, N, C, dx, dy_xhat);
  }
  void gelu_forward(Stream& s, const float* x, float* y, std::int64_t n) override {
    note("gelu_forward");
    k_.gelu_forward(s, x, y, n);
  }
  void gelu_backward(Stream& s, const float* x, const float* gy, float* gx,
                     std::int64_t n) override {
    note("gelu_backward");
    k_.gelu_backward(s, x, gy, gx, n);
  }
  void attention_forward(Stream& s, const float* qkv, std::int64_t B, std::int64_t T,
                         std::int64_t C, std::int64_t nh, float* y, float* stats, float p,
                         std::uint64_t seed, std::uint64_t stream, std::uint64_t index_base,
                         Determinism mode) override {
    note("attention_forward");
    k_.attention_forward(s, qkv, B, T, C, nh, y, stats, p, seed, stream, index_base, mode);
  }
  void attention_backward(Stream& s, const float* dy, const float* qkv, const float* y,
                          const float* stats, std::int64_t B, std::int64_t T, std::int64_t C,
                          std::int64_t nh, float* dqkv, float* scratch, float p, std::uint64_t seed,
                          std::uint64_t stream, std::uint64_t index_base,
                          Determinism mode) override {
    note("attention_backward");
    k_.attention_backward(s, dy, qkv, y, stats, B, T, C, nh, dqkv, scratch, p, seed, stream,
                          index_base, mode);
  }
  void dropout_forward(Stream& s, const float* x, float* y, std::int64_t n, float p,
                       std::uint64_t seed, std::uint64_t stream,
                       std::uint64_t index_base) override {
    note("dropout_forward");
    k_.dropout_forward(s, x, y, n, p, seed, stream, index_base);
  }
  void dropout_backward(Stream& s, const float* gy, float* gx, std::int64_t n, float p,
                        std::uint64_t seed, std::uint64_t stream,
                        std::uint64_t index_base) override {
    note("dropout_backward");
    k_.dropout_backward(s, gy, gx, n, p, seed, stream, index_base);
  }
  void sum_squares(Stream& s, const float* x, std::int64_t n, float* out,
                   Determinism mode) override {
    note("sum_squares");
    k_.sum_squares(s, x, n, out, mode);
  }
  void sum_squares_blocks(Stream& s, const float* x, std::int64_t n, float* out) override {
    note("sum_squares_blocks");
    k_.sum_squares_blocks(s, x, n, out);
  }
  void fill_bits(Stream& s, void* x, std::size_t elem_size, std::uint64_t bits,
                 std::int64_t n) override {
    note("fill_bits");
    k_.fill_bits(s, x, elem_size, bits, n);
  }
  void add_any(Stream& s, DType t, const void* a, const void* b, void* out,
               std::int64_t n) override {
    note("add_any");
    k_.add_any(s, t, a, b, out, n);
  }
  void scale_any(Stream& s, DType t, void* x, double alpha, std::int64_t n) override {
    note("scale_any");
    k_.scale_any(s, t, x, alpha, n);
  }
  void reduce_inputs(Stream& s, DType t, const void* const* inputs, int n_inputs, void* out,
                     std::int64_t numel, int op, Determinism mode) override {
    note("reduce_inputs");
    k_.reduce_inputs(s, t, inputs, n_inputs, out, numel, op, mode);
  }
  bool has_multi_tensor_kernels() const override { return k_.has_multi_tensor_kernels(); }
  void adam_step_multi(Stream& s, const std::vector<AdamTensor>& tensors, double lr, double beta1,
                       double beta2, double eps, double weight_decay, bool amsgrad) override {
    note("adam_step_multi");
    k_.adam_step_multi(s, tensors, lr, beta1, beta2, eps, weight_decay, amsgrad);
  }
  void sum_squares_multi(Stream& s, const std::vector<const float*>& xs,
                         const std::vector<std::int64_t>& ns, float* out,
                         Determinism mode) override {
    note("sum_squares_multi");
    k_.sum_squares_multi(s, xs, ns, out, mode);
  }
  void scale_multi(Stream& s, const std::vector<float*>& xs, const std::vector<std::int64_t>& ns,
                   float alpha) override {
    note("scale_multi");
    k_.scale_multi(s, xs, ns, alpha);
  }
  void fill_multi(Stream& s, const std::vector<float*>& xs, const std::vector<std::int64_t>& ns,
                  float value) override {
    note("fill_multi");
    k_.fill_multi(s, xs, ns, value);
  }
  void copy_multi(Stream& s, DType from, DType to, const std::vector<const void*>& srcs,
                  const std::vector<void*>& dsts, const std::vector<std::int64_t>& ns) override {
    note("copy_multi");
    k_.copy_multi(s, from, to, srcs, dsts, ns);
  }

 protected:
  // Ranks on threads of one process (ZeRO's, OptimFused) share the counts.
  void note(const char* name) {
    const std::lock_guard<std::mutex> lock(note_mutex_);
    ++calls[name];
  }
  std::mutex note_mutex_;

  // f32 scratch on the stream's device for one typed call of a probe (its casts uncounted: the
  // probe's own), freed after the stream's work.
  struct Scratch {
    CountingKernels& p;
    Stream& s;
    std::vector<std::pair<void*, std::size_t>> held;
    Scratch(CountingKernels& pk, Stream& st) : p(pk), s(st) {}
    ~Scratch() {
      s.synchronize();
      for (auto& [ptr, bytes] : held) p.sim_.deallocate(s.device().index, ptr, bytes);
    }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    float* f32(std::int64_t n) {
      const std::size_t bytes = static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * 4;
      void* ptr = p.sim_.allocate(s.device().index, bytes);
      held.emplace_back(ptr, bytes);
      return static_cast<float*>(ptr);
    }
    const float* in(DType t, const void* x, std::int64_t n) {
      float* f = f32(n);
      p.k_.cast(s, x, t, f, DType::f32, n);
      return f;
    }
    void out(const float* f, DType t, void* y, std::int64_t n) {
      p.k_.cast(s, f, DType::f32, y, t, n);
    }
  };

  Backend& sim_;
  Kernels& k_;
};

// Another backend's devices under the name `name`, with kernels K (a CountingKernels built from
// that backend and its kernels): the probe backend a typed-kernel test registers.
template <class K>
class ProbeBackend final : public Backend {
 public:
  ProbeBackend(std::string name, std::shared_ptr<Backend> inner)
      : name_(std::move(name)), b_(std::move(inner)), k_(*b_, b_->kernels()) {}
  K& probe() { return k_; }

  std::string name() const override { return name_; }
  int device_count() const override { return b_->device_count(); }
  DeviceProperties properties(int index) const override { return b_->properties(index); }
  MemoryStats memory_stats(int index) const override { return b_->memory_stats(index); }
  void reset_peak_memory(int index) override { b_->reset_peak_memory(index); }
  void* allocate(int index, std::size_t bytes) override { return b_->allocate(index, bytes); }
  void deallocate(int index, void* ptr, std::size_t bytes) noexcept override {
    b_->deallocate(index, ptr, bytes);
  }
  Stream& default_stream(int index) override { return b_->default_stream(index); }
  std::unique_ptr<Stream> create_stream(int index) override { return b_->create_stream(index); }
  std::unique_ptr<Event> create_event(int index) override { return b_->create_event(index); }
  void copy_from_host(Stream& s, void* dst, const void* src, std::size_t bytes) override {
    b_->copy_from_host(s, dst, src, bytes);
  }
  void copy_to_host(Stream& s, void* dst, const void* src, std::size_t bytes) override {
    b_->copy_to_host(s, dst, src, bytes);
  }
  void copy_2d(Stream& s, void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
               std::size_t row_bytes, std::size_t rows) override {
    b_->copy_2d(s, dst, dst_pitch, src, src_pitch, row_bytes, rows);
  }
  Kernels& kernels() override { return k_; }
  std::shared_ptr<CommunicatorImpl> create_communicator(const std::vector<int>& devices,
                                                        const CommOptions& options) override {
    return b_->create_communicator(devices, options);
  }

 private:
  std::string name_;
  std::shared_ptr<Backend> b_;
  K k_;
};

// Registers and initialises backend `name`: the "sim" backend's devices (initialised already)
// with probe kernels K, and returns those kernels (the typed-kernel suites' SetUpTestSuite).
template <class K>
K& register_probe_backend(const std::string& name) {
  // The simulator instance is taken here: the factory runs under the registry's lock.
  std::shared_ptr<Backend> sim = get_backend_ptr("sim");
  register_backend(name, [name, sim](const BackendOptions&) {
    return std::make_shared<ProbeBackend<K>>(name, sim);
  });
  init_backend(name);
  return static_cast<K&>(get_backend(name).kernels());
}

}  // namespace ditto::test
