"""ditto's params_checksum for the Python tools: FNV-1a 64 over the arrays' bytes, in order (what
`final: ... params_checksum=` prints over the parameters; tools/gpt2_fixtures.py and
tools/safetensors_interop.py import it)."""
import numpy as np


def fnv1a(arrays):
    h = 1469598103934665603
    for a in arrays:
        for b in np.ascontiguousarray(a).tobytes():
            h ^= b
            h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h
