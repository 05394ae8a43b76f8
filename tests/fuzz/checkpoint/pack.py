"""Packs a checkpoint directory of one writing rank as a fuzz_checkpoint
input, or unpacks an input (a crash) into a directory for h5dump / kolos.

    pack.py STEP_DIR OUT_FILE        (index.h5 + shard-0.h5 -> OUT_FILE)
    pack.py --unpack INPUT OUT_DIR   (INPUT -> OUT_DIR/index.h5, shard-0.h5)

An input is [4 bytes: n, little-endian] [n bytes: index.h5] [the rest:
shard-0.h5], as fuzz_checkpoint.cpp reads it (n past the end: all index).
"""
import os
import struct
import sys

if sys.argv[1] == "--unpack":
    data = open(sys.argv[2], "rb").read()
    out = sys.argv[3]
    os.makedirs(out, exist_ok=True)
    n = min(struct.unpack("<I", data[:4])[0], len(data) - 4) if len(data) >= 4 else 0
    open(os.path.join(out, "index.h5"), "wb").write(data[4:4 + n])
    if len(data) > 4 + n:
        open(os.path.join(out, "shard-0.h5"), "wb").write(data[4 + n:])
    print(out, n, "+", max(0, len(data) - 4 - n), "bytes")
else:
    step_dir, out = sys.argv[1], sys.argv[2]
    index = open(os.path.join(step_dir, "index.h5"), "rb").read()
    shard = open(os.path.join(step_dir, "shard-0.h5"), "rb").read()
    with open(out, "wb") as f:
        f.write(struct.pack("<I", len(index)) + index + shard)
    print(out, len(index), "+", len(shard), "bytes")
