#!/usr/bin/env python3
"""Writes a GGUF with a real file's header (metadata, vocabulary, tensor
table) and random tensor data of a sane scale: a model of the same shapes
and block types that llama.cpp and ferrum load and run as they run the
real one, small enough to carry (header and script) to a machine the
model cannot reach, where this rebuilds it.

    random_like_gguf.py REAL.gguf --header-only HEAD   # here: ~6 MB
    random_like_gguf.py HEAD OUT.gguf                  # there

Block scales are set to 0.002 (f16), the rest of each block is random,
f32 tensors (norms) are ones. Pure Python, no numpy."""
import os
import struct
import sys

# Bytes per block and the offsets of its f16 scales, per ggml type id.
BLOCKS = {
    2: (18, [0]),  # Q4_0
    3: (20, [0, 2]),  # Q4_1
    6: (22, [0]),  # Q5_0
    7: (24, [0, 2]),  # Q5_1
    8: (34, [0]),  # Q8_0
    10: (84, [80, 82]),  # Q2_K
    11: (110, [108]),  # Q3_K
    12: (144, [0, 2]),  # Q4_K
    13: (176, [0, 2]),  # Q5_K
    14: (210, [208]),  # Q6_K
    20: (18, [0]),  # IQ4_NL
    23: (136, [0]),  # IQ4_XS
    39: (17, []),  # MXFP4: its scale is the E8M0 byte 0 (set below)
}
BLOCK_VALUES = {2: 32, 3: 32, 6: 32, 7: 32, 8: 32, 10: 256, 11: 256, 12: 256, 13: 256, 14: 256,
                20: 32, 23: 256, 39: 32}
MXFP4 = 39
F32, F16 = 0, 1


class Reader:
    def __init__(self, f):
        self.f = f

    def take(self, fmt):
        size = struct.calcsize("<" + fmt)
        return struct.unpack("<" + fmt, self.f.read(size))

    def string(self):
        (n,) = self.take("Q")
        return self.f.read(n).decode("utf-8", "replace")

    def value(self, ty):
        scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
        if ty in scalar:
            return self.take(scalar[ty])[0]
        if ty == 8:
            return self.string()
        if ty == 9:
            item, n = self.take("IQ")
            return [self.value(item) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {ty}")


def parse(path):
    """The header's length (to the data) and each tensor's (offset,
    bytes, type), offsets from the data's start."""
    with open(path, "rb") as f:
        r = Reader(f)
        magic, version = f.read(4), r.take("I")[0]
        if magic != b"GGUF" or version < 2:
            raise ValueError(f"{path}: not a GGUF v2/v3 file")
        n_tensors, n_kv = r.take("QQ")
        align = 32
        for _ in range(n_kv):
            key, ty = r.string(), r.take("I")[0]
            v = r.value(ty)
            if key == "general.alignment":
                align = v
        tensors = []
        for _ in range(n_tensors):
            r.string()
            (dims,) = r.take("I")
            shape = r.take("Q" * dims)
            ty, off = r.take("IQ")
            count = 1
            for d in shape:
                count *= d
            if ty in (F32, F16):
                nbytes = count * (4 if ty == F32 else 2)
            elif ty in BLOCKS:
                nbytes = count // BLOCK_VALUES[ty] * BLOCKS[ty][0]
            else:
                raise ValueError(f"tensor type {ty} not handled")
            tensors.append((off, nbytes, ty))
        data = (f.tell() + align - 1) // align * align
    return data, sorted(tensors), os.path.getsize(path) - data


def chunk(ty):
    """64 KB of this type's data, repeated to fill a tensor."""
    if ty == F32:
        return struct.pack("<f", 1.0) * 16384
    if ty == F16:
        return struct.pack("<e", 1.0) * 32768
    bb, scales = BLOCKS[ty]
    n = 65536 // bb
    b = bytearray(os.urandom(bb * n))
    d = struct.pack("<e", 0.002)
    for i in range(n):
        for s in scales:
            b[i * bb + s : i * bb + s + 2] = d
        if ty == MXFP4:
            b[i * bb] = 119  # 2^-9: values up to 0.023, as 0.002 times the 4-bit types' levels
    return bytes(b)


def write(head_path, out):
    """`head_path` holds the header, then a line per tensor and the data
    size (written by `--header-only`)."""
    blob = open(head_path, "rb").read()
    (head_len,) = struct.unpack("<Q", blob[:8])
    head, table = blob[8 : 8 + head_len], blob[8 + head_len :].decode().split("\n")
    size = int(table[0])
    with open(out, "wb") as f:
        f.write(head)
        pos = 0
        for line in filter(None, table[1:]):
            off, nbytes, ty = map(int, line.split())
            f.write(b"\0" * (off - pos))
            c = chunk(ty)
            left = nbytes
            while left > 0:
                f.write(c[: min(len(c), left)])
                left -= min(len(c), left)
            pos = off + nbytes
        f.write(b"\0" * (size - pos))


def main(argv):
    if len(argv) == 4 and argv[2] == "--header-only":
        data, tensors, size = parse(argv[1])
        head = open(argv[1], "rb").read(data)
        table = "\n".join([str(size)] + [f"{o} {n} {t}" for o, n, t in tensors])
        with open(argv[3], "wb") as f:
            f.write(struct.pack("<Q", len(head)) + head + table.encode())
    elif len(argv) == 3:
        write(argv[1], argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
