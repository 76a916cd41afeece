// io::safetensors: serializer and validating parser (Note [safetensors layout] in
// core/io/safetensors.h), on nlohmann-json.
#include "core/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/base/error.h"
#include "core/io/file.h"

namespace ditto::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; ditto writes host memory as is");

namespace {

// The reference implementation refuses larger headers (safetensors' MAX_HEADER_SIZE).
constexpr std::uint64_t kMaxHeaderBytes = kMaxSafetensorsHeaderBytes;

// Element size of every dtype of the format that has whole-byte elements; 0 for unknown.
std::size_t known_dtype_size(const std::string& d) {
  static const std::map<std::string, std::size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"F64", 8}, {"I64", 8}, {"U64", 8},     {"C64", 8}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw ParseError(::ditto::detail::cat(source, ": ", what));
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  std::uint64_t begin, end;
  bool held = true;  // false: a dtype ditto cannot hold, skipped (SafetensorsReadOptions)
};

}  // namespace

std::string quoted_name(const std::string& name) {
  std::string out = "'";
  for (const char c : name) {
    const auto b = static_cast<unsigned char>(c);
    if (b == '\\') {
      out += "\\\\";
    } else if (b < 0x20 || b == 0x7f) {
      static const char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[b >> 4];
      out += hex[b & 0xf];
    } else {
      out += c;
    }
  }
  return out + "'";
}

const Tensor* SafetensorsData::find(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

const char* safetensors_dtype(DType t) {
#define DITTO_SAFETENSORS_NAME(e, T, st) st,
  static constexpr const char* kNames[kNumDTypes] = {DITTO_DTYPES(DITTO_SAFETENSORS_NAME)};
#undef DITTO_SAFETENSORS_NAME
  if (!is_valid_dtype(t)) ::ditto::detail::unknown_dtype("safetensors_dtype", t);
  return kNames[static_cast<int>(t)];
}

bool dtype_from_safetensors(const std::string& name, DType& out) {
  for (DType t : kAllDTypes)
    if (name == safetensors_dtype(t)) {
      out = t;
      return true;
    }
  return false;
}

std::string safetensors_serialize(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> host;
  host.reserve(tensors.size());
  std::set<std::string> names;
  std::uint64_t offset = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    DITTO_CHECK(!name.empty(), "io::safetensors_serialize: tensors[", i,
                "]: expected a non-empty name");
    DITTO_CHECK(name != "__metadata__", "io::safetensors_serialize: tensors[", i,
                "]: the name '__metadata__' is reserved for the metadata");
    DITTO_CHECK(names.insert(name).second, "io::safetensors_serialize: tensors[", i, "] ('", name,
                "'): the name appears more than once");
    DITTO_CHECK(t.defined(), "io::safetensors_serialize: tensors[", i, "] ('", name,
                "'): expected a defined tensor");
    host.push_back(t.device().is_cpu() ? t : t.to(Device::cpu()));
    const std::uint64_t end = offset + t.nbytes();
    header[name] = {{"dtype", safetensors_dtype(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string json;
  try {
    json = header.dump();  // compact; non-ASCII names stay UTF-8
  } catch (const nlohmann::json::type_error& e) {
    // Invalid UTF-8 in a tensor name or a metadata key or value (JSON text must be UTF-8): a
    // ditto error, not nlohmann's exception escaping to a caller that catches ditto::Error.
    throw InvalidArgument(::ditto::detail::cat(
        "io::safetensors_serialize: tensors / metadata: expected names, keys and values in valid "
        "UTF-8 (the safetensors header is JSON), got invalid UTF-8 (",
        e.what(), ")"));
  }
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + json.size() + offset);
  const std::uint64_t n = json.size();
  for (int b = 0; b < 8; ++b) out.push_back(static_cast<char>((n >> (8 * b)) & 0xff));
  out += json;
  for (const Tensor& t : host)
    if (t.nbytes() > 0) out.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  return out;
}

namespace {
// A JSON value for an error message: scalars as written (cut at 80 characters), arrays and
// objects by kind and size. dump() of a value nested 100,000 deep recursed until the stack
// overflowed (safetensors-info crashed with SIGSEGV instead of a ParseError; a newcomer found it),
// and a long value made a message of hundreds of kilobytes.
std::string brief(const nlohmann::json& v) {
  if (v.is_array()) return ::ditto::detail::cat("an array of ", v.size(), " elements");
  if (v.is_object()) return ::ditto::detail::cat("an object with ", v.size(), " keys");
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}
// brief() for a shape: its sizes when it is a flat array of numbers, else brief().
std::string brief_shape(const nlohmann::json& sh) {
  if (!sh.is_array() || sh.size() > 16) return brief(sh);
  for (const auto& d : sh)
    if (!d.is_number()) return brief(sh);
  return sh.dump();
}
}  // namespace

SafetensorsData safetensors_parse(std::string_view bytes, const std::string& source,
                                  const SafetensorsReadOptions& options) {
  using nlohmann::json;
  if (bytes.size() < 8)
    bad(source, ::ditto::detail::cat("file too short: ", bytes.size(),
                                     " bytes, expected at least 8 (the header length)"));
  std::uint64_t n = 0;
  for (int b = 0; b < 8; ++b) n |= std::uint64_t(static_cast<unsigned char>(bytes[b])) << (8 * b);
  if (n > bytes.size() - 8)
    bad(source, ::ditto::detail::cat("header length: ", n, " bytes, but only ", bytes.size() - 8,
                                     " bytes follow it (truncated file?)"));
  if (n > kMaxHeaderBytes)
    bad(source,
        ::ditto::detail::cat("header length: ", n, " bytes, expected at most ", kMaxHeaderBytes));
  const std::string_view text = bytes.substr(8, n);
  if (text.empty() || text[0] != '{')
    bad(source, "header: expected a JSON object starting with '{'");
  const std::uint64_t buffer_size = bytes.size() - 8 - n;
  const char* buffer = bytes.data() + 8 + n;

  // Repeated keys: JSON allows them, safetensors does not (which one would count?).
  std::vector<std::set<std::string>> open_objects;
  std::string repeated;
  json header = json::parse(
      text.begin(), text.end(),
      [&](int /*depth*/, json::parse_event_t ev, json& parsed) {
        if (ev == json::parse_event_t::object_start)
          open_objects.emplace_back();
        else if (ev == json::parse_event_t::object_end && !open_objects.empty())
          open_objects.pop_back();
        else if (ev == json::parse_event_t::key && !open_objects.empty() && repeated.empty() &&
                 !open_objects.back().insert(parsed.get<std::string>()).second)
          repeated = parsed.get<std::string>();
        return true;
      },
      /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object())
    bad(source, "header: not a well-formed JSON object (or not UTF-8)");
  if (!repeated.empty())
    bad(source, "header: key " + quoted_name(repeated) + " appears more than once");

  SafetensorsData out;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) bad(source, "__metadata__: expected an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          bad(source, "__metadata__: key " + quoted_name(m.key()) +
                          ": expected a string value, got " + brief(m.value()));
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor " + quoted_name(name);
    if (!v.is_object()) bad(source, where + ": expected an object {dtype, shape, data_offsets}");
    for (auto f = v.begin(); f != v.end(); ++f)
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
        bad(source,
            where + ": unexpected field '" + f.key() + "' (expected dtype, shape, data_offsets)");
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!v.contains(field)) bad(source, where + ": missing field '" + field + "'");
    // dtype
    if (!v["dtype"].is_string()) bad(source, where + ": dtype: expected a string such as \"F32\"");
    const std::string dt = v["dtype"].get<std::string>();
    const std::size_t esize = known_dtype_size(dt);
    if (esize == 0) bad(source, where + ": dtype: unknown dtype '" + dt + "'");
    DType dtype = DType::f32;
    const bool held = dtype_from_safetensors(dt, dtype);
    if (!held && options.skip_unheld_dtypes) out.skipped.emplace_back(name, dt);
    if (!held && !options.skip_unheld_dtypes)
      bad(source, where + ": dtype: " + dt + " is a safetensors dtype ditto cannot hold " +
                      "(expected one of F32, I64, F64, F16, BF16, I8, U8, I32, U32, U64, " +
                      "F8_E4M3, F8_E5M2)");
    // shape
    const json& sh = v["shape"];
    if (!sh.is_array())
      bad(source, where + ": shape: expected an array of sizes, got " + brief(sh));
    Shape shape;
    std::uint64_t numel = 1;
    bool overflow = false;
    for (const json& s : sh) {
      if (!s.is_number_unsigned())
        bad(source, where + ": shape: expected non-negative integer sizes, got " + brief_shape(sh));
      const std::uint64_t d = s.get<std::uint64_t>();
      if (d > std::uint64_t(std::numeric_limits<std::int64_t>::max()))
        overflow = true;
      else if (d != 0 && numel > std::uint64_t(std::numeric_limits<std::int64_t>::max()) / d)
        overflow = true;
      else
        numel *= d;
      shape.push_back(static_cast<std::int64_t>(d));
    }
    if (overflow)
      bad(source, where + ": shape: " + brief_shape(sh) + " has more than 2^63 - 1 elements");
    // data_offsets
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      bad(source, where + ": data_offsets: expected [begin, end] (non-negative integers), got " +
                      brief(off));
    const std::uint64_t begin = off[0].get<std::uint64_t>(), end = off[1].get<std::uint64_t>();
    if (begin > end || end > buffer_size)
      bad(source, ::ditto::detail::cat(where, ": data_offsets: expected begin <= end <= ",
                                       buffer_size, " (the buffer size), got [", begin, ", ", end,
                                       "]", end > buffer_size ? " (truncated file?)" : ""));
    if (numel > std::numeric_limits<std::uint64_t>::max() / esize || end - begin != numel * esize)
      bad(source, ::ditto::detail::cat(where, ": data_offsets: [", begin, ", ", end, "] hold ",
                                       end - begin, " bytes, but shape ", sh.dump(), " x ", dt,
                                       " needs ", numel, " x ", esize, " bytes"));
    entries.push_back({name, dtype, std::move(shape), begin, end, held});
  }

  // The tensors must tile the buffer: sorted by offset, each starts where the previous ended.
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t at = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < at)
      bad(source, ::ditto::detail::cat("tensor ", quoted_name(e.name), ": data_offsets: [", e.begin,
                                       ", ", e.end, "] overlap tensor ", quoted_name(prev->name),
                                       " ending at ", at));
    if (e.begin > at)
      bad(source, ::ditto::detail::cat("tensor ", quoted_name(e.name), ": data_offsets: begin ",
                                       e.begin, " leaves a gap in the buffer after byte ", at));
    at = e.end;
    prev = &e;
  }
  if (at != buffer_size)
    bad(source, ::ditto::detail::cat("buffer: the tensors cover ", at,
                                     " bytes, but the buffer "
                                     "after the header has ",
                                     buffer_size, " bytes"));

  out.tensors.reserve(entries.size());
  for (const Entry& e : entries) {
    if (!e.held) continue;
    Tensor t = Tensor::empty(e.shape, e.dtype, Device::cpu());
    if (e.end > e.begin) std::memcpy(t.data_ptr(), buffer + e.begin, e.end - e.begin);
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  write_file_atomic(path, safetensors_serialize(tensors, metadata));
}

namespace {

// Where the tensors of a parsed header end in the buffer: the largest data_offsets end (0 for
// none); -1 when the header is not a JSON object (safetensors_parse says what is wrong).
std::int64_t buffer_end(std::string_view header) {
  const nlohmann::json h = nlohmann::json::parse(header.begin(), header.end(), nullptr,
                                                 /*allow_exceptions=*/false);
  if (h.is_discarded() || !h.is_object()) return -1;
  std::uint64_t end = 0;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__" || !it.value().is_object()) continue;
    auto off = it.value().find("data_offsets");
    if (off != it.value().end() && off->is_array() && off->size() == 2 &&
        (*off)[1].is_number_unsigned())
      end = std::max(end, (*off)[1].get<std::uint64_t>());
  }
  return end > std::uint64_t(std::numeric_limits<std::int64_t>::max())
             ? std::numeric_limits<std::int64_t>::max()
             : static_cast<std::int64_t>(end);
}

}  // namespace

SafetensorsData load_safetensors(const std::string& path, const SafetensorsReadOptions& options) {
  // Note [Bounded reads]: a regular file; the header (at most kMaxSafetensorsHeaderBytes) is read
  // first and the file's size checked against its data_offsets before the buffer is read.
  try {
    InputFile in(path, std::numeric_limits<std::uint64_t>::max(), "io::load_safetensors");
    std::string bytes;
    if (in.size() < 8) {
      in.read_rest(bytes);
      return safetensors_parse(bytes, path, options);  // "file too short"
    }
    in.read(bytes, 8);
    std::uint64_t n = 0;
    for (int b = 0; b < 8; ++b)
      n |= std::uint64_t(static_cast<unsigned char>(bytes[static_cast<std::size_t>(b)])) << (8 * b);
    if (n > kMaxHeaderBytes)
      bad(path,
          ::ditto::detail::cat("header length: ", n, " bytes, expected at most ", kMaxHeaderBytes));
    if (n > in.size() - 8)
      bad(path, ::ditto::detail::cat("header length: ", n, " bytes, but only ", in.size() - 8,
                                     " bytes follow it (truncated file?)"));
    in.read(bytes, n);
    const std::int64_t end = buffer_end(std::string_view(bytes).substr(8));
    if (end < 0) return safetensors_parse(bytes, path, options);  // the header's own error
    const std::uint64_t buffer_size = in.size() - 8 - n;
    if (static_cast<std::uint64_t>(end) != buffer_size)
      bad(path, ::ditto::detail::cat(
                    "buffer: the header's data_offsets end at byte ", end,
                    ", but the buffer after the header has ", buffer_size, " bytes",
                    static_cast<std::uint64_t>(end) > buffer_size ? " (truncated file?)" : ""));
    in.read(bytes, buffer_size);
    return safetensors_parse(bytes, path, options);
  } catch (const ParseError&) {
    throw;
  } catch (const Error& e) {
    throw ParseError(e.what());
  }
}

}  // namespace ditto::io
