#!/usr/bin/env python3
"""Writes the committed seed corpora of tools/fuzz/corpus/ (except checkpoint/, which
fuzz_checkpoint writes from a real Trainer run: DITTO_FUZZ_MAKE_SEEDS=DIR). Small inputs: valid
examples from examples/data and tests/data, and truncated variants. Run from anywhere."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# CSV: option byte (fuzz_csv.cpp) + file bytes. The first 6 rows of digits.csv (65 columns).
with open(os.path.join(ROOT, "examples/data/digits.csv"), "rb") as f:
    rows = f.read().split(b"\n")[:6]
digits = b"\n".join(rows) + b"\n"
header = b",".join(b"p%d" % i for i in range(64)) + b",label\n"
write("csv", "digits6", b"\x00" + digits)
write("csv", "digits6_header", b"\x00" + header + digits)
write("csv", "digits6_header_yes", b"\x01" + header + digits)
write("csv", "digits6_crlf", b"\x02" + digits.replace(b"\n", b"\r\n"))
write("csv", "digits6_truncated", b"\x00" + digits[: len(digits) // 2])
write("csv", "regression_semicolon", b"\x0c" + b"x;y;t\n1.5;-2e3;0.25\n+3; 4 ;1e-3\n\n7;8;9\n")
write("csv", "tab_label_first", b"\x50" + b"1\t0.5\t2\n0\t1.5\t-3\n")
write("csv", "bom_header", b"\x00" + b"\xef\xbb\xbfa,b\n1,2\n")

# safetensors: python_written.safetensors (tests/data) and small files of several dtypes.
with open(os.path.join(ROOT, "tests/data/python_written.safetensors"), "rb") as f:
    py = f.read()
write("safetensors", "python_written", py)
write("safetensors", "python_written_truncated", py[: len(py) // 2])
write("safetensors", "python_written_header_only", py[: 8 + struct.unpack("<Q", py[:8])[0]])


def st(entries, metadata=None):
    header, buf = {}, b""
    for name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(buf), len(buf) + len(data)]}
        buf += data
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + buf


write("safetensors", "dtypes", st([
    ("f32", "F32", [2, 2], struct.pack("<4f", 1, -2, 0.5, 3)),
    ("i64", "I64", [3], struct.pack("<3q", 1, -1, 2**40)),
    ("bf16", "BF16", [2], b"\x80\x3f\x00\x40"),
    ("scalar", "F64", [], struct.pack("<d", 2.5)),
    ("empty", "U8", [0, 4], b""),
    ("f8", "F8_E4M3", [2], b"\x38\x40"),
], {"format": "pt", "ditto.crc32": "00000000", "ditto.step": "1"}))
write("safetensors", "empty_object", st([]))

# JSON device profiles (backend_sim/profiles.h), as tests/test_cost_model.cpp writes them.
full = {"key": "tiny", "name": "tiny GPU", "fp32_tflops": 2, "tf32_tflops": 4, "bf16_tflops": 8,
        "memory_gib": 0.5, "memory_bandwidth_gbps": 500, "launch_latency_us": 3,
        "host_bandwidth_gbps": 25, "host_latency_us": 10, "source": "a test",
        "gemm_efficiency": 0.8, "memory_efficiency": 0.9, "efficiency_source": "a guess"}
write("profile", "full", json.dumps(full, indent=1).encode())
write("profile", "minimal",
      b'{"fp32_tflops": 1, "memory_gib": 1, "memory_bandwidth_gbps": 100}')
write("profile", "missing_field", b'{"key": "bad", "fp32_tflops": 2, "memory_bandwidth_gbps": 100}')
write("profile", "wrong_type", b'{"key": 3, "fp32_tflops": 1, "memory_gib": 1, "memory_bandwidth_gbps": 100}')
write("profile", "truncated", json.dumps(full).encode()[:60])

# Text (core/data/text_source.h): byte 0 = block_size - 1, byte 1 = batch_size - 1 (| 8: step
# from byte 2), byte 2 = step, then the text. The start of shakespeare.txt (examples/data).
with open(os.path.join(ROOT, "examples/data/shakespeare.txt"), "rb") as f:
    text = f.read(600)
write("text_source", "shakespeare600_b8", b"\x07\x03\x00" + text)
write("text_source", "shakespeare600_b32_step", b"\x1f\x0b\x05" + text)
write("text_source", "shakespeare100_b4", b"\x03\x01\x00" + text[:100])
write("text_source", "too_short", b"\x07\x00\x00" + text[:20])
write("text_source", "binary", b"\x01\x00\x00" + bytes(range(256)) * 2)

# Token files (core/data/token_source.h): byte 0 = flags (1 nanogpt, 2 last file is val, 4 step
# from byte 3), byte 1 = block_size - 1, byte 2 = batch_size - 1 | vocab exponent << 3, byte 3 =
# step, then files separated by "\n--8<--\n". llm.c's header: 256 int32 (magic, version, count).
import struct
SEP = b"\n--8<--\n"
def llmc(tokens, magic=20240520, version=1, count=None):
    head = [magic, version, len(tokens) if count is None else count] + [0] * 253
    code = "<%dI" % len(tokens) if magic == 20240801 else "<%dH" % len(tokens)
    return struct.pack("<256i", *head) + struct.pack(code, *tokens)
ramp = [i % 200 for i in range(300)]
write("token_source", "llmc_one_b4", b"\x00\x0f" + bytes([3 | (7 << 3)]) + b"\x00" + llmc(ramp))
write("token_source", "llmc_three_val", b"\x06\x07" + bytes([7 | (7 << 3)]) + b"\x02" +
      SEP.join([llmc(ramp[:100]), llmc(ramp[100:200]), llmc(ramp[200:])]))
write("token_source", "llama3", b"\x00\x07" + bytes([1 | (16 << 3)]) + b"\x00" +
      llmc([70000 + i for i in range(100)], 20240801, 7))
write("token_source", "nanogpt_two", b"\x03\x07" + bytes([1 | (7 << 3)]) + b"\x00" +
      struct.pack("<300H", *ramp) + SEP + struct.pack("<100H", *ramp[:100]))
write("token_source", "bad_magic", b"\x00\x03\x00\x00" + llmc(ramp, magic=20240521))
write("token_source", "count_past_end", b"\x00\x03\x00\x00" + llmc(ramp, count=9000))
write("token_source", "token_past_vocab", b"\x00\x03" + bytes([0 | (3 << 3)]) + b"\x00" + llmc(ramp))
