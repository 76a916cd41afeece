// ditto::comm: the helpers of torch.cuda.comm, with the same names and semantics, on any backend.
//
// Each result is ordered on the current streams of the devices involved (no host blocking unless
// a host tensor is involved). Devices given as Device values; the host (Device::cpu()) is allowed
// where noted. Errors: InvalidArgument naming the function, the argument, what was expected and
// what came (empty device lists, repeated devices, devices out of range, shape/dtype mismatches,
// chunk sizes of the wrong count or sum).
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "core/numerics/determinism.h"
#include "core/runtime/tensor.h"

namespace ditto::comm {

/// torch.cuda.comm.broadcast: one copy of `tensor` (any dtype: bytes are copied) per device, in the
/// order of `devices`; the entry for the tensor's own device is `tensor` itself (shared storage),
/// as in PyTorch.
std::vector<Tensor> broadcast(const Tensor& tensor, const std::vector<Device>& devices);

/// torch.cuda.comm.broadcast_coalesced: broadcast several tensors (any dtypes, mixed in one
/// call), packed into flat buffers of at most `buffer_size` bytes, one dtype per buffer as torch
/// packs them (a larger tensor travels alone). All tensors must be on devices[0]. Returns
/// result[d][i] = tensors[i] on devices[d] (devices[0]'s are the inputs).
std::vector<std::vector<Tensor>> broadcast_coalesced(const std::vector<Tensor>& tensors,
                                                     const std::vector<Device>& devices,
                                                     std::size_t buffer_size = 10485760);

/// torch.cuda.comm.reduce_add: elementwise sum of `inputs` (one per device, same shape and
/// dtype, any dtype) placed on `destination` (default: the first input's device; the host is
/// allowed). Floats sum in their accumulator (f32 for f16 / bf16 / fp8, f64 for f64) and round
/// once to the dtype; integers wrap (as torch's integer addition); Note [Reductions over ranks]
/// (core/numerics/reduce_math.h). bitwise: canonical tree over the input index (Note [Canonical
/// tree]), so f16 / bf16 sums are the same bits as a bitwise all_reduce over the same inputs.
Tensor reduce_add(const std::vector<Tensor>& inputs, std::optional<Device> destination = {},
                  Determinism mode = Determinism::fast);

/// torch.cuda.comm.reduce_add_coalesced: inputs[d] is device d's list of tensors (same count,
/// shapes and dtypes on every device; dtypes may differ within a list); returns the sums
/// (reduce_add's arithmetic) on `destination`, flattening into buffers of at most `buffer_size`
/// bytes holding one dtype each.
std::vector<Tensor> reduce_add_coalesced(const std::vector<std::vector<Tensor>>& inputs,
                                         std::optional<Device> destination = {},
                                         std::size_t buffer_size = 10485760,
                                         Determinism mode = Determinism::fast);

/// torch.cuda.comm.scatter: split `tensor` (any dtype) along `dim` and place chunk i on
/// devices[i]. Without chunk_sizes it splits like torch.chunk: chunks of ceil(size / n), so fewer
/// chunks than devices can come back (and the result is shorter). With chunk_sizes: one entry per
/// device, each >= 0, adding up to the size along dim (zero-size chunks are returned as empty
/// tensors).
std::vector<Tensor> scatter(const Tensor& tensor, const std::vector<Device>& devices,
                            const std::optional<std::vector<std::int64_t>>& chunk_sizes = {},
                            std::int64_t dim = 0);

/// torch.cuda.comm.gather: concatenate `tensors` (any dtype, all one) along `dim` onto
/// `destination` (default: the first tensor's device; the host is allowed). All other dimensions
/// and dtypes must match. 0-dim tensors gathered along dim 0 become a vector with one entry each
/// (PyTorch warns).
Tensor gather(const std::vector<Tensor>& tensors, std::int64_t dim = 0,
              std::optional<Device> destination = {});

/// The chunk sizes torch.chunk would give for `size` over `n` parts (may be fewer than n).
std::vector<std::int64_t> chunk_sizes(std::int64_t size, std::int64_t n);

/// Rows [begin, end) of part `i` of `n` when `size` rows are split as chunk_sizes(size, n) does
/// (torch.chunk, DataParallel's scatter in fast mode: parts of ceil(size / n) rows, the last
/// shorter); a part past the last chunk is empty ([size, size)). DistributedDataParallel::
/// local_rows splits a batch over the ranks with it in fast mode. Throws InvalidArgument for
/// size < 0, n < 1 or i outside 0..n-1.
std::pair<std::int64_t, std::int64_t> chunk_range(std::int64_t size, std::int64_t n,
                                                  std::int64_t i);

}  // namespace ditto::comm
