"""ditto's params_checksum for the Python tools: FNV-1a 64 over the arrays' bytes, in order (what
`final: ... params_checksum=` prints over the parameters; tools/gpt2_fixtures.py and
tools/safetensors_interop.py import it), every NaN hashed as its dtype's canonical NaN, all bits
but the sign set (Note [NaN bits] in core/runtime/nan_bits.h: a NaN's sign and payload are the
hardware's choice; arrays without NaNs hash their bytes as they are)."""
import numpy as np

# numpy float dtype -> (unsigned view, canonical NaN bits): every bit but the sign.
_CANONICAL = {np.dtype(np.float16): (np.uint16, 0x7FFF), np.dtype(np.float32): (np.uint32, 0x7FFFFFFF),
              np.dtype(np.float64): (np.uint64, 0x7FFFFFFFFFFFFFFF)}


def canonical_nans(a):
    """A copy of numpy array `a` with every NaN replaced by its dtype's canonical NaN (f16, f32,
    f64; other dtypes come back as they are)."""
    a = np.ascontiguousarray(a)
    if a.dtype.newbyteorder("=") not in _CANONICAL:
        return a
    view, bits = _CANONICAL[a.dtype.newbyteorder("=")]
    nan = np.isnan(a)
    if not nan.any():
        return a
    out = a.copy()
    out.view(np.dtype(view).newbyteorder(a.dtype.byteorder))[nan] = bits
    return out


def bf16_canonical_nans(bits):
    """bf16 values as their 16-bit patterns (a numpy int16 / uint16 array) with every NaN replaced
    by bf16's canonical NaN 0x7fff."""
    u = np.ascontiguousarray(bits).view(np.uint16).copy()
    u[(u & 0x7FFF) > 0x7F80] = 0x7FFF
    return u.view(np.asarray(bits).dtype)


def fnv1a(arrays):
    """FNV-1a 64 over the arrays (numpy arrays, or bytes taken as they are) in order; NaNs of f16,
    f32, f64 arrays hashed as canonical_nans has them (bf16 passed as bits: bf16_canonical_nans
    first)."""
    h = 1469598103934665603
    for a in arrays:
        data = a if isinstance(a, (bytes, bytearray)) else canonical_nans(a).tobytes()
        for b in data:
            h ^= b
            h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h
