// io::safetensors: read and write the safetensors format (Hugging Face), so that parameters ditto
// saves load with `safetensors.torch.load_file` / `safe_open` and files written by PyTorch load
// in ditto.
//
// Note [safetensors layout]
// (https://github.com/huggingface/safetensors, "Format")
//   bytes [0, 8)        N: unsigned 64-bit little-endian, the size of the header
//   bytes [8, 8 + N)    the header: UTF-8 JSON, one object:
//                         {"<tensor name>": {"dtype": "F32", "shape": [2, 3],
//                                            "data_offsets": [begin, end]}, ...,
//                          "__metadata__": {"<key>": "<string value>", ...}}   (optional)
//                       starting with '{', possibly padded at the end with spaces (0x20); ditto
//                       pads it to a multiple of 8 bytes so that the buffer is 8-byte aligned
//   bytes [8 + N, end)  the byte buffer: each tensor's elements, row-major, little-endian, at
//                       [begin, end) relative to the start of the buffer; the tensors cover the
//                       buffer exactly, without gaps or overlaps.
// ditto holds F32, I64, F64, F16, BF16, I8, U8, I32, U32, U64, F8_E4M3 and F8_E5M2 tensors (the
// names of the format, as safetensors.torch maps torch.float32 ... torch.float8_e5m2); the reader
// knows every dtype of the format (for the size checks) and refuses the others (BOOL, I16, U16,
// F8_E8M0, C64) with a ParseError naming the tensor and the dtype (or, asked to, skips them:
// SafetensorsReadOptions). A 0-dim tensor
// has "shape": [] and one element; a tensor with a 0 size has begin == end.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/runtime/tensor.h"

namespace ditto::io {

/// Tensors with their names, in order, and the string-to-string "__metadata__".
struct SafetensorsData {
  std::vector<std::pair<std::string, Tensor>> tensors;  ///< host tensors, in buffer order
  std::map<std::string, std::string> metadata;
  /// With SafetensorsReadOptions::skip_unheld_dtypes: the tensors of a dtype of the format that
  /// ditto cannot hold (BOOL, I16, ...), validated but not read, as {name, safetensors dtype}.
  std::vector<std::pair<std::string, std::string>> skipped;

  /// The tensor called `name`, or nullptr.
  const Tensor* find(const std::string& name) const;
};

/// A tensor name (or metadata key) as messages show it: in single quotes, a backslash and every
/// control byte (below 0x20, and 0x7f) escaped as \\ and \xNN, other bytes (UTF-8) as they are;
/// so a name holding a NUL or a newline is shown whole ('wte.weight\x00x'), not cut short.
std::string quoted_name(const std::string& name);

/// "F32", "I64", "BF16", ...: the safetensors name of a ditto dtype (the table of dtype.h).
const char* safetensors_dtype(DType t);
/// The ditto dtype of a safetensors dtype name into `out`; false for a name ditto cannot hold.
bool dtype_from_safetensors(const std::string& name, DType& out);

/// The bytes of a safetensors file holding `tensors` (any device; copied to the host, blocks) in
/// the given order, and `metadata` (omitted when empty). Throws InvalidArgument for an empty or
/// repeated name, the name "__metadata__", or an undefined tensor, naming it.
std::string safetensors_serialize(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata = {});

/// How safetensors_parse / load_safetensors treat what ditto cannot hold.
struct SafetensorsReadOptions {
  /// false (the default): a tensor of a dtype ditto cannot hold is refused (ParseError); true: it
  /// is validated as any other (shape, offsets, tiling) and listed in SafetensorsData::skipped
  /// instead of read (e.g. the BOOL attention-mask buffers of some GPT-2 files).
  bool skip_unheld_dtypes = false;
};

/// Parse the bytes of a safetensors file. `source` (a file name) starts every message. Validates
/// everything (Note [safetensors layout]) and throws ParseError naming source, tensor and field:
/// a file shorter than 8 bytes, a header length past the file's end (or over 100,000,000 bytes,
/// the reference implementation's limit), a header that is not a JSON object, a repeated key, an
/// entry that is not {dtype, shape, data_offsets}, an unknown dtype or one ditto cannot hold, a
/// negative or non-integer size, offsets out of the buffer, overlapping, leaving a gap or not
/// covering it, a byte length other than numel x dtype size, a metadata value that is not a string.
SafetensorsData safetensors_parse(std::string_view bytes, const std::string& source,
                                  const SafetensorsReadOptions& options = {});

/// Write a safetensors file atomically (io::write_file_atomic: temporary file, fsync, rename).
/// Throws what safetensors_serialize and write_file_atomic throw.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// Read and parse a safetensors file (like safetensors.torch.load_file plus its metadata).
/// Bounded (Note [Bounded reads] in core/io/file.h): the file must be a regular file; its header
/// (at most 100,000,000 bytes) is read first, and the file's size must match the end of the
/// header's data_offsets before the tensor bytes are read. Throws ParseError for a file that
/// cannot be read, is not a regular file ("io::load_safetensors: '/dev/zero' is a character
/// device, expected a regular file"), has a size other than its header describes, or is
/// malformed (safetensors_parse).
SafetensorsData load_safetensors(const std::string& path,
                                 const SafetensorsReadOptions& options = {});

}  // namespace ditto::io
