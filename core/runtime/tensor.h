// Tensor: shape, dtype, device and a contiguous view into a shared Buffer.
//
// v0 tensors are always contiguous and row-major: f32 data and i64 class labels. Copies between
// any two devices (host included) go through copy_() / to(); device<->device copies are ordered
// after pending work on both devices' current streams, like PyTorch's cross-device copy_.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/runtime/buffer.h"
#include "core/runtime/dtype.h"
#include "core/runtime/error.h"

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
  /// Tensor filled with zeros (f32 or i64).
  static Tensor zeros(const Shape& shape, DType dtype, const Device& device);
  /// f32 tensor filled with `value`.
  static Tensor full(const Shape& shape, float value, const Device& device);
  /// Copy of host data into a new tensor on `device`. values.size() must equal the shape's numel.
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
  /// A new tensor with the same contents on the same device.
  Tensor clone() const;
  /// Copy `src` (same shape and dtype, any device) into this tensor.
  void copy_(const Tensor& src);
  /// Host copy of the contents (blocks). T must match dtype().
  template <typename T>
  std::vector<T> to_vector() const;
  /// Value of a one-element f32 tensor (blocks).
  float item() const;

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
}  // namespace detail

}  // namespace ditto
