"""Reads and writes the safetensors format (and HF's sharded index) with numpy alone.

The format is an 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and
byte range, then the raw little-endian bytes. It is small enough to read here, which keeps bertjax's
install free of torch and of the `safetensors` package (tests cross-check against both).
"""

import json
import os
import struct

import ml_dtypes
import numpy as np

from bertjax.core.errors import UserError

DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in DTYPES.items()}
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def read_file(path: str) -> dict:
  """name -> np.ndarray of one .safetensors file (a copy: the file is not kept open)."""
  with open(path, "rb") as f:
    data = f.read()
  if len(data) < 8:
    raise UserError(f"{path} is not a safetensors file (too short); re-download or re-export it")
  (n,) = struct.unpack("<Q", data[:8])
  try:
    header = json.loads(data[8:8 + n])
  except (ValueError, UnicodeDecodeError) as e:
    raise UserError(f"{path} is not a safetensors file ({e}); re-download or re-export it") from e
  body = memoryview(data)[8 + n:]
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    if info["dtype"] not in DTYPES:
      raise UserError(f"{path}: tensor {name} has dtype {info['dtype']}, which bertjax cannot read; convert it to F32")
    begin, end = info["data_offsets"]
    array = np.frombuffer(body[begin:end], dtype=np.dtype(DTYPES[info["dtype"]]).newbyteorder("<"))
    out[name] = array.reshape(info["shape"]).copy()
  return out


def write_file(path: str, tensors: dict, metadata: dict | None = None) -> None:
  """Writes name -> array as one .safetensors file (header padded to 8 bytes, as the reference writer does)."""
  header, offset, chunks = {}, 0, []
  for name in sorted(tensors):
    array = np.ascontiguousarray(tensors[name])
    if array.dtype not in _NAMES:
      raise ValueError(f"cannot write {name}: dtype {array.dtype} has no safetensors name")
    raw = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    header[name] = dict(dtype=_NAMES[array.dtype], shape=list(array.shape), data_offsets=[offset, offset + len(raw)])
    offset += len(raw)
    chunks.append(raw)
  if metadata:
    header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for raw in chunks:
      f.write(raw)
  os.replace(tmp, path)


def _read_torch_bin(path: str) -> dict:
  """A pytorch_model.bin, only when torch happens to be installed (bertjax does not require it)."""
  try:
    import torch
  except ImportError as e:
    raise UserError(f"{path} is a PyTorch pickle and torch is not installed; install torch or convert the "
                    "checkpoint to model.safetensors") from e
  state = torch.load(path, map_location="cpu", weights_only=True)
  return {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in state.items()}


def read_dir(hf_dir: str) -> dict:
  """All tensors of an HF checkpoint directory: model.safetensors, its sharded index, or pytorch_model.bin."""
  if os.path.isfile(os.path.join(hf_dir, SINGLE)):
    return read_file(os.path.join(hf_dir, SINGLE))
  index = os.path.join(hf_dir, INDEX)
  if os.path.isfile(index):
    with open(index) as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for name in files:
      out.update(read_file(os.path.join(hf_dir, name)))
    return out
  if os.path.isfile(os.path.join(hf_dir, "pytorch_model.bin")):
    return _read_torch_bin(os.path.join(hf_dir, "pytorch_model.bin"))
  raise UserError(f"no model.safetensors, {INDEX} or pytorch_model.bin in {hf_dir!r}; point --hf_dir at an HF "
                  "checkpoint directory")
