"""Small safetensors reader/writer for the ONNX CLI tests (no numpy here): tensors as
(dtype, shape, flat list of values)."""
import json
import struct

FORMATS = {"F32": "f", "I64": "q", "I32": "i", "I8": "b", "F16": "e"}


def read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        fmt = FORMATS[info["dtype"]]
        count = (b - a) // struct.calcsize(fmt)
        out[name] = (info["dtype"], info["shape"], list(struct.unpack("<%d%s" % (count, fmt), raw[8 + n + a:8 + n + b])))
    return out


def write(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, values) in tensors.items():
        blob = struct.pack("<%d%s" % (len(values), FORMATS[dtype]), *values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def select(tensors, prefix):
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
