// ditto::comm: torch.cuda.comm's helpers (broadcast, broadcast_coalesced, reduce_add,
// reduce_add_coalesced, scatter, gather) built on Tensor copies (detail::copy_block, bytes: every
// dtype) and the backend's reduction kernels (ops::sum_inputs for f32, ops::reduce_inputs for the
// other dtypes), so they work on every backend and dtype.
#include "core/comm/comm.h"

#include <limits>
#include <map>
#include <unordered_map>

#include "core/base/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"

namespace ditto::comm {
namespace {

// A device of a GPU backend (or the host when allow_cpu), in range. `what` names the argument.
void check_device(const char* call, const std::string& what, const Device& d, bool allow_cpu) {
  if (d.is_cpu()) {
    DITTO_CHECK(allow_cpu, "comm::", call, ": ", what,
                ": expected a device of a GPU backend (sim, cuda), got cpu");
    return;
  }
  Backend& b = get_backend(d.type);
  DITTO_CHECK(d.index >= 0 && d.index < b.device_count(), "comm::", call, ": ", what, ": ", d.str(),
              " is out of range (backend ", d.type, " has ", b.device_count(), " devices)");
}

// Non-empty, distinct, in-range GPU devices (the same rules as Communicator::init_all).
void check_devices(const char* call, const std::vector<Device>& devices) {
  DITTO_CHECK(!devices.empty(), "comm::", call,
              ": devices: expected at least one device, got an empty list");
  std::unordered_map<Device, std::size_t> seen;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    check_device(call, detail::cat("devices[", i, "]"), devices[i], false);
    auto [it, fresh] = seen.emplace(devices[i], i);
    DITTO_CHECK(fresh, "comm::", call, ": devices: expected distinct devices, got ",
                devices[i].str(), " twice (at positions ", it->second, " and ", i, ")");
  }
}

std::int64_t normalize_dim(const char* call, std::int64_t dim, std::int64_t ndim) {
  DITTO_CHECK(dim >= -ndim && dim < ndim, "comm::", call, ": dim: expected a dim in [", -ndim, ", ",
              ndim, ") for a ", ndim, "-dim tensor, got ", dim);
  return dim < 0 ? dim + ndim : dim;
}

// Product of sizes [from, to).
std::int64_t prod(const Shape& s, std::int64_t from, std::int64_t to) {
  std::int64_t p = 1;
  for (std::int64_t i = from; i < to; ++i) p *= s[static_cast<std::size_t>(i)];
  return p;
}

// "[*, 4]": the shape with `dim` left free.
std::string shape_with_star(const Shape& s, std::int64_t dim) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += static_cast<std::int64_t>(i) == dim ? "*" : std::to_string(s[i]);
  }
  return out + "]";
}

// Groups of indices into `tensors` (in order, per dtype), each group at most `buffer_size`
// bytes unless it is a single larger tensor (like PyTorch's _take_tensors).
std::vector<std::vector<std::size_t>> take_groups(const std::vector<Tensor>& tensors,
                                                  std::size_t buffer_size) {
  std::vector<std::vector<std::size_t>> groups;
  std::map<DType, std::pair<std::size_t, std::size_t>> open;  // dtype -> (group index, bytes)
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::size_t bytes = tensors[i].nbytes();
    auto it = open.find(tensors[i].dtype());
    if (it != open.end() && it->second.second + bytes <= buffer_size) {
      groups[it->second.first].push_back(i);
      it->second.second += bytes;
      continue;
    }
    groups.push_back({i});
    open[tensors[i].dtype()] = {groups.size() - 1, bytes};
  }
  return groups;
}

// One flat 1-dim tensor on `device` holding the listed tensors back to back (same dtype).
Tensor flatten(const std::vector<Tensor>& tensors, const std::vector<std::size_t>& group,
               const Device& device) {
  std::int64_t total = 0;
  for (std::size_t i : group) total += tensors[i].numel();
  Tensor flat = Tensor::empty({total}, tensors[group[0]].dtype(), device);
  std::size_t off = 0;
  for (std::size_t i : group) {
    const Tensor& t = tensors[i];
    detail::copy_block(flat, off, t.nbytes(), t, 0, t.nbytes(), t.nbytes(), 1);
    off += t.nbytes();
  }
  return flat;
}

// Views of `flat` shaped like the listed tensors, stored at out[i].
void unflatten(const Tensor& flat, const std::vector<Tensor>& like,
               const std::vector<std::size_t>& group, std::vector<Tensor>& out) {
  std::int64_t off = 0;
  for (std::size_t i : group) {
    out[i] = flat.narrow(off, like[i].numel()).view(like[i].shape());
    off += like[i].numel();
  }
}

}  // namespace

// ---- broadcast ------------------------------------------------------------------------------

std::vector<Tensor> broadcast(const Tensor& tensor, const std::vector<Device>& devices) {
  DITTO_CHECK(tensor.defined(), "comm::broadcast: tensor: expected a defined tensor");
  check_devices("broadcast", devices);
  std::vector<Tensor> out;
  out.reserve(devices.size());
  for (const Device& d : devices) out.push_back(tensor.to(d));  // own device: shares storage
  return out;
}

std::vector<std::vector<Tensor>> broadcast_coalesced(const std::vector<Tensor>& tensors,
                                                     const std::vector<Device>& devices,
                                                     std::size_t buffer_size) {
  check_devices("broadcast_coalesced", devices);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    DITTO_CHECK(tensors[i].defined(), "comm::broadcast_coalesced: tensors[", i,
                "]: expected a defined tensor");
    DITTO_CHECK(tensors[i].device() == devices[0], "comm::broadcast_coalesced: tensors[", i,
                "]: expected a tensor on devices[0] = ", devices[0].str(), ", got ",
                tensors[i].str());
  }
  std::vector<std::vector<Tensor>> out(devices.size(), std::vector<Tensor>(tensors.size()));
  out[0] = tensors;
  if (tensors.empty()) return out;
  for (const auto& group : take_groups(tensors, buffer_size)) {
    if (group.size() == 1) {  // travels alone, no packing
      for (std::size_t d = 1; d < devices.size(); ++d)
        out[d][group[0]] = tensors[group[0]].to(devices[d]);
      continue;
    }
    Tensor flat = flatten(tensors, group, devices[0]);
    for (std::size_t d = 1; d < devices.size(); ++d)
      unflatten(flat.to(devices[d]), tensors, group, out[d]);
  }
  return out;
}

// ---- reduce_add -----------------------------------------------------------------------------

namespace {
// reduce_add's and reduce_add_coalesced's `mode`.
void check_reduce_mode(const char* call, Determinism mode) {
  DITTO_CHECK(is_valid_determinism(mode), call,
              ": mode: expected Determinism::fast or Determinism::bitwise, got value ",
              static_cast<int>(mode));
}
// Input `name` of `call`: defined, and of the dtype and shape of `like` (named `like_name`).
void check_input_like(const char* call, const std::string& name, const Tensor& t,
                      const std::string& like_name, const Tensor& like) {
  DITTO_CHECK(t.defined(), call, ": ", name, ": expected a defined tensor");
  DITTO_CHECK(t.dtype() == like.dtype(), call, ": ", name, ": expected dtype ",
              dtype_name(like.dtype()), " (like ", like_name, "), got ", t.str());
  DITTO_CHECK(t.shape() == like.shape(), call, ": ", name, ": expected shape ",
              shape_str(like.shape()), " (like ", like_name, "), got ", t.str());
}
}  // namespace

Tensor reduce_add(const std::vector<Tensor>& inputs, std::optional<Device> destination,
                  Determinism mode) {
  DITTO_CHECK(!inputs.empty(), "comm::reduce_add: inputs: expected at least one tensor, got an "
                               "empty list");
  check_reduce_mode("comm::reduce_add", mode);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    const std::string name = ::ditto::detail::cat("inputs[", i, "]");
    DITTO_CHECK(t.defined(), "comm::reduce_add: ", name, ": expected a defined tensor");
    DITTO_CHECK(!t.device().is_cpu(), "comm::reduce_add: ", name,
                ": expected a tensor on a device of a GPU backend, got ", t.str());
    check_input_like("comm::reduce_add", name, t, "inputs[0]", inputs[0]);
  }
  const Device dest = destination.value_or(inputs[0].device());
  check_device("reduce_add", "destination", dest, true);
  // The host cannot run kernels: sum on the first input's device, then copy to the host.
  const Device where = dest.is_cpu() ? inputs[0].device() : dest;
  Tensor out = Tensor::empty(inputs[0].shape(), inputs[0].dtype(), where);
  if (out.numel() > 0) {
    std::vector<Tensor> local;
    local.reserve(inputs.size());
    for (const Tensor& t : inputs) local.push_back(t.to(where));
    // f32 keeps the sum_inputs kernel (its bits and speed); every other dtype reduces with
    // Note [Reductions over ranks] (Acc, the canonical tree in bitwise mode, one rounding).
    if (out.dtype() == DType::f32)
      ops::sum_inputs(local, out, mode);
    else
      ops::reduce_inputs(local, out, /*sum*/ 0, mode);
  }
  return dest.is_cpu() ? out.to(dest) : out;
}

std::vector<Tensor> reduce_add_coalesced(const std::vector<std::vector<Tensor>>& inputs,
                                         std::optional<Device> destination, std::size_t buffer_size,
                                         Determinism mode) {
  DITTO_CHECK(!inputs.empty(), "comm::reduce_add_coalesced: inputs: expected one list of tensors "
                               "per device, got an empty list");
  check_reduce_mode("comm::reduce_add_coalesced", mode);
  const std::vector<Tensor>& first = inputs[0];
  for (std::size_t d = 0; d < inputs.size(); ++d) {
    DITTO_CHECK(inputs[d].size() == first.size(), "comm::reduce_add_coalesced: inputs[", d,
                "]: expected ", first.size(), " tensors (like inputs[0]), got ", inputs[d].size());
    for (std::size_t i = 0; i < inputs[d].size(); ++i) {
      const Tensor& t = inputs[d][i];
      check_input_like("comm::reduce_add_coalesced",
                       ::ditto::detail::cat("inputs[", d, "][", i, "]"), t,
                       ::ditto::detail::cat("inputs[0][", i, "]"), first[i]);
      DITTO_CHECK(t.device() == inputs[d][0].device(), "comm::reduce_add_coalesced: inputs[", d,
                  "][", i, "]: expected a tensor on ", inputs[d][0].device().str(),
                  " (each list on one device), got ", t.str());
    }
  }
  std::vector<Tensor> out(first.size());
  if (first.empty()) return out;
  for (const auto& group : take_groups(first, buffer_size)) {
    std::vector<Tensor> per_device;
    per_device.reserve(inputs.size());
    if (group.size() == 1) {
      for (const auto& list : inputs) per_device.push_back(list[group[0]]);
      out[group[0]] = reduce_add(per_device, destination, mode);
      continue;
    }
    for (const auto& list : inputs) per_device.push_back(flatten(list, group, list[0].device()));
    unflatten(reduce_add(per_device, destination, mode), first, group, out);
  }
  return out;
}

// ---- scatter / gather -----------------------------------------------------------------------

namespace {
// ceil(size / n) for size >= 0, n >= 1, without size + n - 1 (which overflows near INT64_MAX).
std::int64_t ceil_part(std::int64_t size, std::int64_t n) { return size / n + (size % n != 0); }
}  // namespace

std::vector<std::int64_t> chunk_sizes(std::int64_t size, std::int64_t n) {
  DITTO_CHECK(n >= 1, "comm::chunk_sizes: n: expected at least 1 part, got ", n);
  DITTO_CHECK(size >= 0, "comm::chunk_sizes: size: expected a non-negative size, got ", size);
  if (size == 0) return std::vector<std::int64_t>(static_cast<std::size_t>(n), 0);  // torch.chunk
  const std::int64_t split = ceil_part(size, n);
  std::vector<std::int64_t> out;
  // start + the part taken <= size: no overflow near INT64_MAX (start += split wrapped there and
  // the loop never ended, tester hB 5).
  for (std::int64_t start = 0; start < size;) {
    const std::int64_t part = std::min(split, size - start);
    out.push_back(part);
    start += part;
  }
  return out;
}

std::pair<std::int64_t, std::int64_t> chunk_range(std::int64_t size, std::int64_t n,
                                                  std::int64_t i) {
  DITTO_CHECK(n >= 1, "comm::chunk_range: n: expected at least 1 part, got ", n);
  DITTO_CHECK(size >= 0, "comm::chunk_range: size: expected a non-negative size, got ", size);
  DITTO_CHECK(i >= 0 && i < n, "comm::chunk_range: i: expected a part in 0..", n - 1, ", got ", i);
  if (size == 0) return {0, 0};
  const std::int64_t split = ceil_part(size, n);  // chunk_sizes' part, >= 1
  // k * split, or size once that passes it: k <= size / split keeps the product <= size (i *
  // split wrapped to negative bounds near INT64_MAX, tester hB 5).
  const auto bound = [&](std::int64_t k) { return k <= size / split ? k * split : size; };
  return {bound(i), bound(i + 1)};
}

std::vector<Tensor> scatter(const Tensor& tensor, const std::vector<Device>& devices,
                            const std::optional<std::vector<std::int64_t>>& chunk_sizes_in,
                            std::int64_t dim_in) {
  DITTO_CHECK(tensor.defined(), "comm::scatter: tensor: expected a defined tensor");
  DITTO_CHECK(tensor.dim() >= 1, "comm::scatter: tensor: expected at least 1 dim, got ",
              tensor.str());
  check_devices("scatter", devices);
  const std::int64_t dim = normalize_dim("scatter", dim_in, tensor.dim());
  const std::int64_t size = tensor.size(dim);
  std::vector<std::int64_t> sizes;
  if (chunk_sizes_in) {
    sizes = *chunk_sizes_in;
    DITTO_CHECK(sizes.size() == devices.size(), "comm::scatter: chunk_sizes: expected ",
                devices.size(), " entries (one per device), got ", sizes.size());
    std::int64_t total = 0;
    bool overflow = false;  // the sum passed INT64_MAX (it wrapped to "got -3", tester hB 5)
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      DITTO_CHECK(sizes[i] >= 0, "comm::scatter: chunk_sizes[", i,
                  "]: expected a non-negative size, got ", sizes[i]);
      overflow = overflow || __builtin_add_overflow(total, sizes[i], &total);
    }
    DITTO_CHECK(!overflow && total == size,
                "comm::scatter: chunk_sizes: expected entries adding up to ", size,
                " (size of dim ", dim, "), got ",
                overflow ? detail::cat("a sum over ", std::numeric_limits<std::int64_t>::max())
                         : detail::cat(total));
  } else {
    sizes = chunk_sizes(size, static_cast<std::int64_t>(devices.size()));
  }

  const Shape& shape = tensor.shape();
  const std::int64_t outer = prod(shape, 0, dim);
  const std::size_t inner_bytes =
      static_cast<std::size_t>(prod(shape, dim + 1, tensor.dim())) * dtype_size(tensor.dtype());
  const std::size_t src_pitch = static_cast<std::size_t>(size) * inner_bytes;
  std::vector<Tensor> out;
  out.reserve(sizes.size());
  std::int64_t start = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::int64_t c = sizes[i];
    if (dim == 0 && devices[i] == tensor.device()) {
      out.push_back(tensor.narrow(start, c));  // a view, as PyTorch returns for the own device
    } else {
      Shape s = shape;
      s[static_cast<std::size_t>(dim)] = c;
      Tensor t = Tensor::empty(s, tensor.dtype(), devices[i]);
      const std::size_t row = static_cast<std::size_t>(c) * inner_bytes;
      detail::copy_block(t, 0, row, tensor, static_cast<std::size_t>(start) * inner_bytes,
                         src_pitch, row, static_cast<std::size_t>(outer));
      out.push_back(std::move(t));
    }
    start += c;
  }
  return out;
}

Tensor gather(const std::vector<Tensor>& tensors_in, std::int64_t dim_in,
              std::optional<Device> destination) {
  DITTO_CHECK(!tensors_in.empty(), "comm::gather: tensors: expected at least one tensor, got an "
                                   "empty list");
  for (std::size_t i = 0; i < tensors_in.size(); ++i)
    DITTO_CHECK(tensors_in[i].defined(), "comm::gather: tensors[", i,
                "]: expected a defined tensor");
  // 0-dim tensors gathered along dim 0 become a vector (PyTorch warns and does the same).
  bool all_scalars = dim_in == 0;
  for (const Tensor& t : tensors_in) all_scalars = all_scalars && t.dim() == 0;
  std::vector<Tensor> scalars_as_vectors;
  if (all_scalars)
    for (const Tensor& t : tensors_in) scalars_as_vectors.push_back(t.view({1}));
  const std::vector<Tensor>& tensors = all_scalars ? scalars_as_vectors : tensors_in;

  const Tensor& t0 = tensors[0];
  DITTO_CHECK(t0.dim() >= 1,
              "comm::gather: tensors[0]: expected at least 1 dim (0-dim tensors "
              "only along dim 0), got ",
              t0.str());
  const std::int64_t dim = normalize_dim("gather", dim_in, t0.dim());
  std::int64_t total = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    DITTO_CHECK(t.dtype() == t0.dtype(), "comm::gather: tensors[", i, "]: expected dtype ",
                dtype_name(t0.dtype()), " (like tensors[0]), got ", t.str());
    bool same = t.dim() == t0.dim();
    for (std::int64_t k = 0; same && k < t0.dim(); ++k) same = k == dim || t.size(k) == t0.size(k);
    DITTO_CHECK(same, "comm::gather: tensors[", i, "]: expected shape ",
                shape_with_star(t0.shape(), dim), " (like tensors[0] in every dim but ", dim,
                "), got ", t.str());
    total += t.size(dim);
  }
  const Device dest = destination.value_or(tensors_in[0].device());
  check_device("gather", "destination", dest, true);

  Shape shape = t0.shape();
  shape[static_cast<std::size_t>(dim)] = total;
  Tensor out = Tensor::empty(shape, t0.dtype(), dest);
  const std::int64_t outer = prod(shape, 0, dim);
  const std::size_t inner_bytes =
      static_cast<std::size_t>(prod(shape, dim + 1, t0.dim())) * dtype_size(t0.dtype());
  const std::size_t dst_pitch = static_cast<std::size_t>(total) * inner_bytes;
  std::int64_t start = 0;
  for (const Tensor& t : tensors) {
    const std::size_t row = static_cast<std::size_t>(t.size(dim)) * inner_bytes;
    detail::copy_block(out, static_cast<std::size_t>(start) * inner_bytes, dst_pitch, t, 0, row,
                       row, static_cast<std::size_t>(outer));
    start += t.size(dim);
  }
  return out;
}

}  // namespace ditto::comm
