// Tensor: shape, dtype, device and a contiguous view into a shared Buffer.
//
// Tensors are always contiguous and row-major, of any DType (core/runtime/dtype.h: f32, i64, f64,
// f16, bf16, i8, u8, i32, u32, u64, f8_e4m3, f8_e5m2). Copies between any two devices (host
// included) go through copy_() / to(); they move bytes, so every dtype travels unchanged;
// device<->device copies are ordered after pending work on both devices' current streams, like
// PyTorch's cross-device copy_. Conversion between dtypes: to(DType) (torch's .to(dtype)), with
// the elementwise convert<To> of core/numerics/float_formats.h (Note [Small float conversions]).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/runtime/buffer.h"
#include "core/runtime/dtype.h"

namespace ditto {

using Shape = std::vector<std::int64_t>;

/// "[3, 4]".
std::string shape_str(const Shape& s);
/// Product of the sizes (1 for a 0-dim shape). Throws InvalidArgument for a negative size or a
/// product past 2^63 - 1.
std::int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  /// An undefined tensor (defined() == false).
  Tensor() = default;

  /// Uninitialised tensor. Throws InvalidArgument (negative size, more than 2^63 - 1 elements or
  /// bytes) or OutOfMemory.
  static Tensor empty(const Shape& shape, DType dtype, const Device& device);
  /// Tensor filled with zeros (any dtype: all-zero bytes, which is +0 for every float type).
  static Tensor zeros(const Shape& shape, DType dtype, const Device& device);
  /// f32 tensor filled with `value`.
  static Tensor full(const Shape& shape, float value, const Device& device);
  /// Tensor of `dtype` filled with `value` converted once on the host with convert<T> (torch.full
  /// with a dtype; float -> int truncates, saturates, NaN -> 0; RNE to the small floats).
  static Tensor full(const Shape& shape, double value, DType dtype, const Device& device);
  /// Copy of host data into a new tensor on `device`, its dtype that of T (float, double,
  /// std::int64_t, std::int32_t, std::int8_t, std::uint8_t, std::uint32_t, std::uint64_t,
  /// float16, bfloat16, float8_e4m3, float8_e5m2). values.size() must equal the shape's numel
  /// (InvalidArgument otherwise).
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            const Device& device = Device::cpu());
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                            const Device& device = Device::cpu());
  static Tensor from_vector(const std::vector<std::int64_t>& values, const Shape& shape,
                            const Device& device = Device::cpu());

  bool defined() const { return buffer_ != nullptr; }
  const Shape& shape() const { return shape_; }
  std::int64_t dim() const { return static_cast<std::int64_t>(shape_.size()); }
  /// Size along `d` (negative counts from the end). Throws InvalidArgument when out of range.
  std::int64_t size(std::int64_t d) const;
  std::int64_t numel() const { return numel_; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  const Device& device() const;

  /// Raw device pointer to the first element (meaningful to the owning backend only).
  void* data_ptr() const;
  /// Typed pointer; throws InvalidArgument when T does not match dtype().
  template <typename T>
  T* data() const {
    DITTO_CHECK(dtype_of<T>() == dtype_, "Tensor::data: expected dtype ", dtype_name(dtype_),
                ", asked for ", dtype_name(dtype_of<T>()));
    return static_cast<T*>(data_ptr());
  }

  /// Copy to `device`; returns *this (sharing storage) when already there, like Tensor.to().
  Tensor to(const Device& device) const;
  /// torch's .to(dtype): *this (sharing storage) when dtype() == dtype, else a new tensor on the
  /// same device with every element converted by convert<To> (Note [Small float conversions]);
  /// on a device through Kernels::cast (ops::cast), on the host directly.
  Tensor to(DType dtype) const;
  /// .to(device, dtype): converted where the source lives, then copied (*this when nothing
  /// changes).
  Tensor to(const Device& device, DType dtype) const;
  /// torch's .to(device, copy=True) when copy is true: always a new tensor on `device` with the
  /// same contents, copied once from wherever this one lives (clone() when already there);
  /// copy = false is to(device). For host snapshots of device state (optimizer state_dicts),
  /// where .to(cpu).clone() copied a device tensor twice.
  Tensor to(const Device& device, bool copy) const;
  /// A new tensor with the same contents on the same device.
  Tensor clone() const;
  /// Copy `src` (same shape and dtype, any device) into this tensor.
  void copy_(const Tensor& src);
  /// Host copy of the contents (blocks). T must match dtype() (InvalidArgument otherwise; use
  /// to(dtype) first to convert). Instantiated for every host type of from_vector.
  template <typename T>
  std::vector<T> to_vector() const;
  /// Value of a one-element f32 tensor (blocks).
  float item() const;
  /// Value of a one-element tensor of dtype_of<T>() (blocks); InvalidArgument otherwise.
  template <typename T>
  T item() const {
    DITTO_CHECK(defined() && numel_ == 1 && dtype_ == dtype_of<T>(),
                "Tensor::item: expected a "
                "one-element ",
                dtype_name(dtype_of<T>()), " tensor, got ", str());
    return to_vector<T>()[0];
  }

  /// View of rows [start, start + length) along dim 0 (shares storage).
  Tensor narrow(std::int64_t start, std::int64_t length) const;
  /// Same storage, new shape with the same numel (one size may be -1).
  Tensor view(const Shape& shape) const;

  /// "[3, 4] f32 on sim:1" (for error messages).
  std::string str() const;

  /// Byte offset of this view into its buffer.
  std::size_t offset_bytes() const { return offset_; }
  const std::shared_ptr<Buffer>& buffer() const { return buffer_; }

 private:
  std::shared_ptr<Buffer> buffer_;
  std::size_t offset_ = 0;
  Shape shape_;
  std::int64_t numel_ = 0;
  DType dtype_ = DType::f32;
};

namespace detail {
/// Strided block copy between any two devices: `rows` rows of `row_bytes`, from src (pitch
/// src_pitch bytes, starting at byte src_off of its view) to dst (pitch dst_pitch, dst_off).
/// Device-to-device copies of one backend are ordered after pending work on both devices'
/// current streams; host copies block.
void copy_block(const Tensor& dst, std::size_t dst_off, std::size_t dst_pitch, const Tensor& src,
                std::size_t src_off, std::size_t src_pitch, std::size_t row_bytes,
                std::size_t rows);
/// y[i] = convert<to>(x[i]) for n host elements (Note [Small float conversions]): Tensor::to on
/// the host and the simulator's cast kernel. x and y do not overlap unless from == to.
void cast_on_host(const void* x, DType from, void* y, DType to, std::int64_t n);
/// The bytes of convert<T>(value) for T the host type of `t`, in the low dtype_size(t) bytes
/// (little endian): what Kernels::fill_bits writes for Tensor::full and ops::fill_.
std::uint64_t element_bits(double value, DType t);
}  // namespace detail

}  // namespace ditto
