"""A safetensors file's tensors as numpy arrays mapped from the file, bfloat16 included.

`safetensors.numpy` cannot make a bfloat16 array (numpy has no such type), and the
decoder LLMs are published in bfloat16. The format is a little-endian u64 header size,
a JSON header ({name: {"dtype", "shape", "data_offsets"}}), then the bytes; here each
tensor is a view of a read-only memory map of the file (ml_dtypes' bfloat16 for "BF16"),
so nothing is read until it is used and a tensor converted one at a time never holds the
whole file twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from collections.abc import Iterator

import ml_dtypes
import numpy as np

from dualjax.errors import PretrainedError

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
          "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
          "BOOL": np.bool_}


def read(path: str) -> dict[str, np.ndarray]:
    """{name: array} of the file at `path`; PretrainedError naming it when it is cut
    short, not safetensors, or holds a dtype numpy cannot take."""
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > size - 8:
                raise ValueError(f"a header of {length} bytes in a file of {size}")
            header = json.loads(f.read(length))
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise PretrainedError(f"{path}: not a whole safetensors file ({e}); copy or download "
                              "it again") from None
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + length) if size > 8 + length \
        else np.zeros(0, np.uint8)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise PretrainedError(f"{path}: tensor {name} is {info.get('dtype')}, which dualjax "
                                  f"does not read ({', '.join(DTYPES)})")
        start, end = info["data_offsets"]
        if end > data.size:
            raise PretrainedError(f"{path}: not a whole safetensors file (tensor {name} ends at "
                                  f"byte {end} of {data.size}); copy or download it again")
        out[name] = data[start:end].view(dtype).reshape(info["shape"])
    return out


def without_prefix(tensors: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The tensors under `prefix` ("model." of a causal or masked LM checkpoint, whose
    head no embedding reads) with it taken off; all of them when none has it (a bare
    model, as embedders save it)."""
    if any(k.startswith(prefix) for k in tensors):
        return {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}
    return dict(tensors)


@contextlib.contextmanager
def by_name(path: str, family: str, layers: int) -> Iterator[None]:
    """Reading a model's tensors by name: a missing one (KeyError) or one of another
    shape than config.json's sizes (ValueError, from a reshape) as one PretrainedError
    naming the file."""
    try:
        yield
    except KeyError as e:
        raise PretrainedError(f"{path}: no tensor {e.args[0]} (a {family} of {layers} "
                              "layers?)") from None
    except ValueError as e:
        raise PretrainedError(f"{path}: a tensor does not fit the sizes in config.json: "
                              f"{e}") from None
