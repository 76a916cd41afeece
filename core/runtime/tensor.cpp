// Tensor construction, views and copies between any two devices.
#include "core/runtime/tensor.h"

#include <cstring>
#include <limits>
#include <sstream>
#include <string>

#include "core/runtime/backend.h"

namespace ditto {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

namespace {
constexpr std::int64_t kMaxInt64 = std::numeric_limits<std::int64_t>::max();

// Note [Tensors of a replaced backend]: init_backend replaces a backend's process-wide instance
// (Trainer::fit does, for its run's device count), and a tensor made before keeps the old
// instance alive through its Buffer. Its Device may then name no device of the live instance
// (sim:3 after a fit on 2 devices: "index out of range") or another one's. As a torch tensor
// stays readable while it lives, copies to and from such a tensor (to_vector, to(device),
// copy_, clone) run on the instance that owns its memory, on that device's default stream, and
// between two instances through the host. Other ops on it (ops::*, to(dtype), an optimizer's
// step) refuse with InvalidArgument naming the op (ops::internal::check_live, ops_check.h): they
// ran on the live instance, unordered with the old instance's pending work on the tensor (a
// fill still running there gave ops::add a wrong sum, no error), or on a device the live instance
// may not have. Communicators likewise refuse every call (Note [Communicators of a replaced
// backend], core/comm/communicator.cpp), and a live communicator's collectives such tensors
// (with check_live's message, detail::check_comm_tensor), and a DataParallel its forward and
// backward when its module's parameters are such tensors (data_parallel.cpp).
struct Owner {
  Backend& backend;
  Stream& stream;
  bool replaced;  // the owning instance is no longer the live one
};
Owner owner_of(const Tensor& t) {
  Backend& b = t.buffer()->backend();
  if (&b == &get_backend(t.device().type)) return {b, current_stream(t.device()), false};
  return {b, b.default_stream(t.device().index), true};
}

// Product of non-negative sizes; false when it exceeds int64 (a size of 0 makes it 0, never an
// overflow, whatever comes before it).
bool checked_product(const Shape& s, std::int64_t& out) {
  bool overflow = false;
  std::int64_t n = 1;
  for (auto d : s) {
    if (d == 0) {
      out = 0;
      return true;
    }
    if (!overflow) overflow = __builtin_mul_overflow(n, d, &n);
  }
  out = n;
  return !overflow;
}
}  // namespace

std::int64_t shape_numel(const Shape& s) {
  for (auto d : s) DITTO_CHECK(d >= 0, "shape ", shape_str(s), ": sizes must be non-negative");
  std::int64_t n = 0;
  DITTO_CHECK(checked_product(s, n), "shape ", shape_str(s), ": expected at most ", kMaxInt64,
              " elements in all, but the sizes multiply past that");
  return n;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, const Device& device) {
  // A value outside the enumeration is the caller's error (InvalidArgument naming the call), not
  // an InternalError from dtype_size (a newcomer passed DType(12)).
  DITTO_CHECK(is_valid_dtype(dtype),
              "Tensor::empty: dtype: expected one of f32, i64, f64, f16, "
              "bf16, i8, u8, i32, u32, u64, f8_e4m3, f8_e5m2, got DType value ",
              static_cast<int>(dtype));
  // The shape's checks of shape_numel, naming this call (zeros, full and from_vector come here).
  for (auto d : shape)
    DITTO_CHECK(d >= 0, "Tensor::empty: shape: expected sizes >= 0, got ", shape_str(shape));
  std::int64_t numel = 0;
  DITTO_CHECK(checked_product(shape, numel), "Tensor::empty: shape: expected at most ", kMaxInt64,
              " elements in all, got ", shape_str(shape), " (the sizes multiply past that)");
  Tensor t;
  t.numel_ = numel;
  // nbytes() must not wrap around (a wrapped count would allocate a buffer far too small).
  DITTO_CHECK(t.numel_ <= kMaxInt64 / static_cast<std::int64_t>(dtype_size(dtype)),
              "Tensor::empty: shape ", shape_str(shape), " ", dtype_name(dtype),
              ": expected at most ", kMaxInt64, " bytes, got ", t.numel_, " elements of ",
              dtype_size(dtype), " bytes");
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.buffer_ = std::make_shared<Buffer>(device, t.nbytes());
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, const Device& device) {
  Tensor t = empty(shape, dtype, device);
  if (t.numel_ == 0) return t;
  if (device.is_cpu()) {
    std::memset(t.data_ptr(), 0, t.nbytes());
  } else if (dtype == DType::f32) {
    device.backend().kernels().fill_f32(current_stream(device), t.data<float>(), 0.0f, t.numel_);
  } else {
    device.backend().kernels().fill_bits(current_stream(device), t.data_ptr(), dtype_size(dtype), 0,
                                         t.numel_);
  }
  return t;
}

namespace detail {
std::uint64_t element_bits(double value, DType t) {
  return visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const T v = convert<T>(value);
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    return bits;
  });
}
}  // namespace detail

Tensor Tensor::full(const Shape& shape, double value, DType dtype, const Device& device) {
  if (dtype == DType::f32) return full(shape, static_cast<float>(value), device);
  Tensor t = empty(shape, dtype, device);
  if (t.numel_ == 0) return t;
  const std::uint64_t bits = detail::element_bits(value, dtype);
  const std::size_t size = dtype_size(dtype);
  if (device.is_cpu()) {
    char* p = static_cast<char*>(t.data_ptr());
    for (std::int64_t i = 0; i < t.numel_; ++i) std::memcpy(p + i * size, &bits, size);
  } else {
    device.backend().kernels().fill_bits(current_stream(device), t.data_ptr(), size, bits,
                                         t.numel_);
  }
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, const Device& device) {
  Tensor t = empty(shape, DType::f32, device);
  if (t.numel_ == 0) return t;
  if (device.is_cpu()) {
    float* p = t.data<float>();
    for (std::int64_t i = 0; i < t.numel_; ++i) p[i] = value;
  } else {
    device.backend().kernels().fill_f32(current_stream(device), t.data<float>(), value, t.numel_);
  }
  return t;
}

namespace {
template <typename T>
Tensor from_host_values(const std::vector<T>& values, const Shape& shape, const Device& device) {
  std::int64_t n = shape_numel(shape);
  DITTO_CHECK(static_cast<std::int64_t>(values.size()) == n, "Tensor::from_vector: expected ", n,
              " values for shape ", shape_str(shape), ", got ", values.size());
  Tensor t = Tensor::empty(shape, dtype_of<T>(), device);
  if (n == 0) return t;
  if (device.is_cpu())
    std::memcpy(t.data_ptr(), values.data(), t.nbytes());
  else
    device.backend().copy_from_host(current_stream(device), t.data_ptr(), values.data(),
                                    t.nbytes());
  return t;
}
}  // namespace

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, const Device& device) {
  return from_host_values(values, shape, device);
}
Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape,
                           const Device& device) {
  return from_host_values(values, shape, device);
}
Tensor Tensor::from_vector(const std::vector<std::int64_t>& values, const Shape& shape,
                           const Device& device) {
  return from_host_values(values, shape, device);
}

std::int64_t Tensor::size(std::int64_t d) const {
  std::int64_t nd = dim();
  DITTO_CHECK(d >= -nd && d < nd, "Tensor::size: dim ", d, " out of range for a ", nd,
              "-dim tensor");
  return shape_[static_cast<std::size_t>(d < 0 ? d + nd : d)];
}

const Device& Tensor::device() const {
  static const Device cpu = Device::cpu();
  return buffer_ ? buffer_->device() : cpu;
}

void* Tensor::data_ptr() const {
  DITTO_CHECK(defined(), "Tensor::data_ptr: tensor is undefined");
  return static_cast<char*>(buffer_->data()) + offset_;
}

Tensor Tensor::to(const Device& device) const {
  DITTO_CHECK(defined(), "Tensor::to: tensor is undefined");
  if (device == this->device()) return *this;
  Tensor t = empty(shape_, dtype_, device);
  t.copy_(*this);
  return t;
}

Tensor Tensor::to(const Device& device, bool copy) const {
  DITTO_CHECK(defined(), "Tensor::to: tensor is undefined");
  return copy && device == this->device() ? clone() : to(device);
}

Tensor Tensor::clone() const {
  DITTO_CHECK(defined(), "Tensor::clone: tensor is undefined");
  Tensor t = empty(shape_, dtype_, device());
  t.copy_(*this);
  return t;
}

void Tensor::copy_(const Tensor& src) {
  DITTO_CHECK(defined() && src.defined(), "Tensor::copy_: both tensors must be defined");
  DITTO_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_, "Tensor::copy_: expected src ",
              shape_str(shape_), " ", dtype_name(dtype_), ", got ", src.str());
  if (numel_ == 0) return;
  detail::copy_block(*this, 0, nbytes(), src, 0, src.nbytes(), nbytes(), 1);
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  DITTO_CHECK(defined(), "Tensor::to_vector: tensor is undefined");
  DITTO_CHECK(dtype_of<T>() == dtype_, "Tensor::to_vector: tensor is ", dtype_name(dtype_),
              ", asked for ", dtype_name(dtype_of<T>()));
  std::vector<T> out(static_cast<std::size_t>(numel_));
  if (numel_ == 0) return out;
  if (device().is_cpu()) {
    std::memcpy(out.data(), data_ptr(), nbytes());
  } else {  // on the instance that owns it (Note [Tensors of a replaced backend])
    const Owner o = owner_of(*this);
    o.backend.copy_to_host(o.stream, out.data(), data_ptr(), nbytes());
  }
  return out;
}

// Every host type of the DType table (dtype.h).
#define DITTO_TENSOR_HOST_TYPE(T)                                                             \
  template Tensor Tensor::from_vector<T>(const std::vector<T>&, const Shape&, const Device&); \
  template std::vector<T> Tensor::to_vector<T>() const;
DITTO_TENSOR_HOST_TYPE(float)
DITTO_TENSOR_HOST_TYPE(std::int64_t)
DITTO_TENSOR_HOST_TYPE(double)
DITTO_TENSOR_HOST_TYPE(float16)
DITTO_TENSOR_HOST_TYPE(bfloat16)
DITTO_TENSOR_HOST_TYPE(std::int8_t)
DITTO_TENSOR_HOST_TYPE(std::uint8_t)
DITTO_TENSOR_HOST_TYPE(std::int32_t)
DITTO_TENSOR_HOST_TYPE(std::uint32_t)
DITTO_TENSOR_HOST_TYPE(std::uint64_t)
DITTO_TENSOR_HOST_TYPE(float8_e4m3)
DITTO_TENSOR_HOST_TYPE(float8_e5m2)
#undef DITTO_TENSOR_HOST_TYPE

namespace detail {
void cast_on_host(const void* x, DType from, void* y, DType to, std::int64_t n) {
  visit_dtype(from, [&](auto from_tag) {
    using From = decltype(from_tag);
    visit_dtype(to, [&](auto to_tag) {
      using To = decltype(to_tag);
      const From* src = static_cast<const From*>(x);
      To* dst = static_cast<To*>(y);
      for (std::int64_t i = 0; i < n; ++i) dst[i] = convert<To>(src[i]);
    });
  });
}
}  // namespace detail

Tensor Tensor::to(DType dtype) const {
  DITTO_CHECK(defined(), "Tensor::to: tensor is undefined");
  DITTO_CHECK(is_valid_dtype(dtype),
              "Tensor::to: dtype: expected one of f32, i64, f64, f16, "
              "bf16, i8, u8, i32, u32, u64, f8_e4m3, f8_e5m2, got DType value ",
              static_cast<int>(dtype));
  if (dtype == dtype_) return *this;
  DITTO_CHECK(device().is_cpu() || &buffer_->backend() == &get_backend(device().type),
              "Tensor::to: ", str(), " was made on an instance of backend ", device().type,
              " that init_backend has since re-initialised; only its copies run (to_vector, "
              "to(device), copy_): clone() copies it to the live instance first");
  Tensor t = empty(shape_, dtype, device());
  if (numel_ == 0) return t;
  if (device().is_cpu())
    detail::cast_on_host(data_ptr(), dtype_, t.data_ptr(), dtype, numel_);
  else
    device().backend().kernels().cast(current_stream(device()), data_ptr(), dtype_, t.data_ptr(),
                                      dtype, numel_);
  return t;
}

Tensor Tensor::to(const Device& device, DType dtype) const {
  DITTO_CHECK(defined(), "Tensor::to: tensor is undefined");
  return to(dtype).to(device);
}

float Tensor::item() const {
  DITTO_CHECK(defined() && numel_ == 1 && dtype_ == DType::f32,
              "Tensor::item: expected a one-element f32 tensor, got ", str());
  return to_vector<float>()[0];
}

Tensor Tensor::narrow(std::int64_t start, std::int64_t length) const {
  DITTO_CHECK(defined() && dim() >= 1,
              "Tensor::narrow: expected a tensor with at least 1 dim, got ", str());
  std::int64_t end = 0;
  const bool end_fits = !__builtin_add_overflow(start, length, &end);
  DITTO_CHECK(start >= 0 && length >= 0 && end_fits && end <= shape_[0], "Tensor::narrow: rows [",
              start, ", ", end_fits ? std::to_string(end) : detail::cat(start, " + ", length),
              ") out of range for ", str());
  Tensor t = *this;
  std::int64_t row = shape_[0] == 0 ? 0 : numel_ / shape_[0];
  t.offset_ += static_cast<std::size_t>(start * row) * dtype_size(dtype_);
  t.shape_[0] = length;
  t.numel_ = row * length;
  return t;
}

Tensor Tensor::view(const Shape& shape) const {
  DITTO_CHECK(defined(), "Tensor::view: tensor is undefined");
  Shape s = shape;
  std::int64_t known = 1, infer = -1;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      DITTO_CHECK(infer < 0, "Tensor::view: only one size may be -1, got ", shape_str(shape));
      infer = static_cast<std::int64_t>(i);
    } else {
      DITTO_CHECK(s[i] >= 0, "Tensor::view: invalid size in ", shape_str(shape));
    }
  }
  {
    Shape given;
    for (auto d : s)
      if (d != -1) given.push_back(d);
    DITTO_CHECK(checked_product(given, known), "Tensor::view: shape ", shape_str(shape),
                ": expected at most ", kMaxInt64,
                " elements in all, but the sizes multiply past "
                "that");
  }
  if (infer >= 0) {
    DITTO_CHECK(known > 0 && numel_ % known == 0, "Tensor::view: cannot view ", str(), " as ",
                shape_str(shape));
    s[static_cast<std::size_t>(infer)] = numel_ / known;
    known *= s[static_cast<std::size_t>(infer)];
  }
  DITTO_CHECK(known == numel_, "Tensor::view: shape ", shape_str(shape), " has ", known,
              " elements, tensor ", str(), " has ", numel_);
  Tensor t = *this;
  t.shape_ = s;
  return t;
}

std::string Tensor::str() const {
  if (!defined()) return "undefined tensor";
  return shape_str(shape_) + " " + dtype_name(dtype_) + " on " + device().str();
}

namespace detail {

namespace {

/// A staging buffer of `bytes` on `device` used by work on stream `s`. A Buffer is allocated and
/// freed in the order of the device's default stream (Backend::allocate / deallocate: the cuda
/// backend's cudaMallocAsync / cudaFreeAsync); when `s` is another stream, `s` first waits for
/// the default stream (the allocation is ready there), and before the free the default stream
/// waits for `s`, so the block is not reused while `s` may still read it (stream order, no host
/// wait). Before, a strided host-to-device copy on a side stream freed its staging buffer on the
/// default stream while the side stream's copy out of it could still be running.
class Staging {
 public:
  Staging(const Device& device, std::size_t bytes, Stream& s)
      : buf_(device, bytes), s_(s), default_(buf_.backend().default_stream(device.index)) {
    if (&s_ != &default_) order(default_, s_);
  }
  ~Staging() {
    if (&s_ == &default_) return;
    try {
      order(s_, default_);
    } catch (...) {  // cannot order the free: wait for s instead
      try {
        s_.synchronize();
      } catch (...) {  // the stream's own error surfaces at its next synchronisation
      }
    }
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  void* data() const { return buf_.data(); }

 private:
  /// `after` waits for everything enqueued on `before` so far.
  void order(Stream& before, Stream& after) {
    auto e = buf_.backend().create_event(buf_.device().index);
    before.record(*e);
    after.wait(*e);
  }
  Buffer buf_;
  Stream& s_;
  Stream& default_;
};

// Host -> device: rows x row_bytes contiguous at `packed` (host) to dp (row pitch dst_pitch) of
// `dst`, on its owner's stream (owner_of): one copy when `dense` (dst_pitch == row_bytes), else
// through a staging buffer and a 2-D copy (a tensor of a replaced instance: one copy a row).
void upload_rows(const Tensor& dst, char* dp, std::size_t dst_pitch, const char* packed,
                 std::size_t row_bytes, std::size_t rows, bool dense) {
  const Device& dd = dst.device();
  const Owner o = owner_of(dst);
  Backend& b = o.backend;
  Stream& s = o.stream;
  if (dense) return b.copy_from_host(s, dp, packed, rows * row_bytes);
  if (o.replaced) {
    for (std::size_t r = 0; r < rows; ++r)
      b.copy_from_host(s, dp + r * dst_pitch, packed + r * row_bytes, row_bytes);
    return;
  }
  Staging staging(dd, rows * row_bytes, s);
  b.copy_from_host(s, staging.data(), packed, rows * row_bytes);
  b.copy_2d(s, dp, dst_pitch, staging.data(), row_bytes, row_bytes, rows);
}

// Device -> host: the rows at sp (row pitch src_pitch) of `src` to `packed` (host, rows x
// row_bytes contiguous), the reverse of upload_rows.
void download_rows(const Tensor& src, const char* sp, std::size_t src_pitch, char* packed,
                   std::size_t row_bytes, std::size_t rows, bool dense) {
  const Device& sd = src.device();
  const Owner o = owner_of(src);
  Backend& b = o.backend;
  Stream& s = o.stream;
  if (dense) return b.copy_to_host(s, packed, sp, rows * row_bytes);
  if (o.replaced) {
    for (std::size_t r = 0; r < rows; ++r)
      b.copy_to_host(s, packed + r * row_bytes, sp + r * src_pitch, row_bytes);
    return;
  }
  Staging staging(sd, rows * row_bytes, s);
  b.copy_2d(s, staging.data(), row_bytes, sp, src_pitch, row_bytes, rows);
  b.copy_to_host(s, packed, staging.data(), rows * row_bytes);
}

}  // namespace

void copy_block(const Tensor& dst, std::size_t dst_off, std::size_t dst_pitch, const Tensor& src,
                std::size_t src_off, std::size_t src_pitch, std::size_t row_bytes,
                std::size_t rows) {
  if (rows == 0 || row_bytes == 0) return;
  const Device& dd = dst.device();
  const Device& sd = src.device();
  char* dp = static_cast<char*>(dst.data_ptr()) + dst_off;
  const char* sp = static_cast<const char*>(src.data_ptr()) + src_off;
  const bool dense = dst_pitch == row_bytes && src_pitch == row_bytes;

  if (dd.is_cpu() && sd.is_cpu()) {
    for (std::size_t r = 0; r < rows; ++r)
      std::memmove(dp + r * dst_pitch, sp + r * src_pitch, row_bytes);
    return;
  }
  if (sd.is_cpu()) {  // host -> device
    if (dense) return upload_rows(dst, dp, dst_pitch, sp, row_bytes, rows, true);
    std::vector<char> packed(rows * row_bytes);
    for (std::size_t r = 0; r < rows; ++r)
      std::memcpy(packed.data() + r * row_bytes, sp + r * src_pitch, row_bytes);
    return upload_rows(dst, dp, dst_pitch, packed.data(), row_bytes, rows, false);
  }
  if (dd.is_cpu()) {  // device -> host
    if (dense) return download_rows(src, sp, src_pitch, dp, row_bytes, rows, true);
    std::vector<char> packed(rows * row_bytes);
    download_rows(src, sp, src_pitch, packed.data(), row_bytes, rows, false);
    for (std::size_t r = 0; r < rows; ++r)
      std::memcpy(dp + r * dst_pitch, packed.data() + r * row_bytes, row_bytes);
    return;
  }
  // Across backends, or from or to a tensor of a replaced instance (Note [Tensors of a replaced
  // backend]): through the host, staged on both sides.
  if (dd.type != sd.type || owner_of(dst).replaced || owner_of(src).replaced) {
    std::vector<char> packed(rows * row_bytes);
    download_rows(src, sp, src_pitch, packed.data(), row_bytes, rows, false);
    return upload_rows(dst, dp, dst_pitch, packed.data(), row_bytes, rows, false);
  }
  // Same backend, device -> device: order after both devices' pending work, copy on the
  // destination's stream, and make the source's stream wait for the copy (so the source is not
  // overwritten or freed while it is read).
  Backend& b = dd.backend();
  Stream& ds = current_stream(dd);
  if (dd == sd) {
    b.copy_2d(ds, dp, dst_pitch, sp, src_pitch, row_bytes, rows);
    return;
  }
  Stream& ss = current_stream(sd);
  auto before = b.create_event(sd.index);
  ss.record(*before);
  ds.wait(*before);
  b.copy_2d(ds, dp, dst_pitch, sp, src_pitch, row_bytes, rows);
  auto after = b.create_event(dd.index);
  ds.record(*after);
  ss.wait(*after);
}

}  // namespace detail
}  // namespace ditto
