#!/usr/bin/env python3
"""Image files for the `kolos data prepare --images` tests, written here
with numpy and zlib only (no imaging library), and the pixels they hold.

PNG: a plain encoder (one IDAT, filter type 0) for gray, gray + alpha, RGB
and RGBA at 8 bits, and 16-bit gray, so the pixels are exactly the arrays
given. JPEG: a baseline encoder for images made of flat 8x8 blocks (every
block one value per component), quantisation 1: each block is a DC
coefficient 8 * (value - 128) and no AC, which a decoder turns back into the
value exactly; colour files store chosen Y, Cb, Cr values (4:4:4, JFIF),
whose RGB is the JFIF conversion, which libjpeg computes within 1.

    fixtures.py make DIR     folders, .npy files and DIR/expected.npz
    fixtures.py bad DIR      the bad inputs of tests/e2e/bad_input/images.sh
"""
import os
import struct
import sys
import zlib

import numpy as np


def write_png(path, pixels, bit_depth=8):
    a = np.asarray(pixels)
    if a.ndim == 2:
        a = a[..., None]
    h, w, c = a.shape
    color_type = {1: 0, 2: 4, 3: 2, 4: 6}[c]
    a = a.astype(">u2" if bit_depth == 16 else np.uint8)
    raw = b"".join(b"\0" + a[y].tobytes() for y in range(h))

    def chunk(kind, data):
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) +
                chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


# JPEG Annex K.3's luminance DC table: code lengths, then the categories.
DC_BITS = [0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]
DC_VALUES = list(range(12))
# An AC table with one symbol, end-of-block (0x00), as the code "0".
AC_BITS = [1] + [0] * 15
AC_VALUES = [0]


def huffman_codes(bits, values):
    codes, code, k = {}, 0, 0
    for length in range(1, 17):
        for _ in range(bits[length - 1]):
            codes[values[k]] = (code, length)
            code += 1
            k += 1
        code <<= 1
    return codes


class BitWriter:
    def __init__(self):
        self.out, self.acc, self.n = bytearray(), 0, 0

    def put(self, value, length):
        for i in range(length - 1, -1, -1):
            self.acc = (self.acc << 1) | ((value >> i) & 1)
            self.n += 1
            if self.n == 8:
                self.out.append(self.acc)
                if self.acc == 0xFF:
                    self.out.append(0)  # byte stuffing
                self.acc, self.n = 0, 0

    def finish(self):
        while self.n:
            self.put(1, 1)  # pad with 1 bits
        return bytes(self.out)


def write_flat_jpeg(path, blocks):
    """blocks: (H/8, W/8, C) integers 0..255, C = 1 (gray), 3 (Y, Cb, Cr) or
    4 (CMYK)."""
    blocks = np.asarray(blocks, np.int64)
    by, bx, c = blocks.shape

    def segment(marker, data):
        return struct.pack(">BBH", 0xFF, marker, len(data) + 2) + data

    out = b"\xff\xd8"
    out += segment(0xE0, b"JFIF\0\x01\x01\x00\x00\x01\x00\x01\x00\x00")
    out += segment(0xDB, b"\x00" + b"\x01" * 64)
    sof = struct.pack(">BHHB", 8, by * 8, bx * 8, c)
    for comp in range(c):
        sof += bytes([comp + 1, 0x11, 0])
    out += segment(0xC0, sof)
    out += segment(0xC4, b"\x00" + bytes(DC_BITS) + bytes(DC_VALUES))
    out += segment(0xC4, b"\x10" + bytes(AC_BITS) + bytes(AC_VALUES))
    sos = bytes([c])
    for comp in range(c):
        sos += bytes([comp + 1, 0x00])
    out += segment(0xDA, sos + b"\x00\x3f\x00")
    dc_codes, ac_codes = huffman_codes(DC_BITS, DC_VALUES), huffman_codes(AC_BITS, AC_VALUES)
    bits, previous = BitWriter(), [0] * c
    for y in range(by):
        for x in range(bx):
            for comp in range(c):
                dc = 8 * (int(blocks[y, x, comp]) - 128)
                diff, previous[comp] = dc - previous[comp], dc
                size = abs(diff).bit_length()
                bits.put(*dc_codes[size])
                if size:
                    bits.put(diff if diff >= 0 else diff + (1 << size) - 1, size)
                bits.put(*ac_codes[0])  # end of block
    with open(path, "wb") as f:
        f.write(out + bits.finish() + b"\xff\xd9")


def flat_pixels(blocks, color):
    """The pixels a flat-block JPEG decodes to (colour: JFIF's YCbCr -> RGB)."""
    b = np.asarray(blocks, np.float64)
    if color:
        y, cb, cr = b[..., 0], b[..., 1] - 128, b[..., 2] - 128
        b = np.stack([y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb], -1)
    b = np.clip(np.rint(b), 0, 255).astype(np.uint8)
    return b.repeat(8, axis=0).repeat(8, axis=1)


def make(out):
    """Two folders (RGB and gray), each with classes `ant` and `bee` of PNG
    and JPEG images, and .npy arrays; DIR/expected.npz holds what the
    prepared files must contain."""
    rng = np.random.default_rng(7)
    expected = {}
    for name, color in (("rgb", True), ("gray", False)):
        images, labels, jpeg = [], [], []
        c = 3 if color else 1
        for label, cls in enumerate(("ant", "bee")):  # sorted: ant = 0, bee = 1
            os.makedirs(f"{out}/{name}/{cls}", exist_ok=True)
            # Sorted by file name: a.png, b.jpg, c.png.
            png1 = rng.integers(0, 256, (16, 16, c), dtype=np.uint8)
            write_png(f"{out}/{name}/{cls}/a.png", png1)
            blocks = rng.integers(16, 240, (2, 2, c))
            write_flat_jpeg(f"{out}/{name}/{cls}/b.jpg", blocks)
            flat = flat_pixels(blocks, color)
            png2 = rng.integers(0, 256, (16, 16, c), dtype=np.uint8)
            write_png(f"{out}/{name}/{cls}/c.png", png2)
            images += [png1, flat, png2]
            labels += [label] * 3
            jpeg += [False, True, False]
        # Skipped: hidden files and folders.
        open(f"{out}/{name}/ant/.DS_Store", "wb").write(b"\0\1junk")
        os.makedirs(f"{out}/{name}/.cache", exist_ok=True)
        open(f"{out}/{name}/.cache/x.txt", "w").write("not an image")
        expected[f"{name}_images"] = np.stack(images)
        expected[f"{name}_labels"] = np.array(labels, np.int64)
        expected[f"{name}_jpeg"] = np.array(jpeg)
    # A 16-bit gray PNG alone: scaled to 8 bits (v * 255 / 65535, rounded).
    os.makedirs(f"{out}/deep/only", exist_ok=True)
    deep = rng.integers(0, 65536, (8, 8), dtype=np.uint16)
    write_png(f"{out}/deep/only/x.png", deep, bit_depth=16)
    expected["deep_images"] = np.rint(deep / 257.0).astype(np.uint8)[None, ..., None]
    # .npy: 8x8 gray images in the digits' shape, int32 labels 0..9; and
    # N x H x W x C uint8 with uint8 labels.
    x = rng.integers(0, 256, (40, 8, 8), dtype=np.uint8)
    y = (np.arange(40) % 10).astype(np.int32)
    np.save(f"{out}/x.npy", x)
    np.save(f"{out}/y.npy", y)
    expected["npy_images"], expected["npy_labels"] = x[..., None], y.astype(np.int64)
    x4 = rng.integers(0, 256, (6, 4, 4, 3), dtype=np.uint8)
    y4 = np.array([2, 0, 1, 2, 0, 1], np.uint8)
    np.save(f"{out}/x4.npy", x4)
    np.save(f"{out}/y4.npy", y4)
    expected["npy4_images"], expected["npy4_labels"] = x4, y4.astype(np.int64)
    np.savez(f"{out}/expected.npz", **expected)


def bad(out):
    """The bad inputs: folders and .npy files `kolos data prepare` refuses,
    and images files the image source refuses."""
    import h5py

    rng = np.random.default_rng(3)

    def folder(name, files):
        for path, writer in files.items():
            os.makedirs(os.path.dirname(f"{out}/{name}/{path}"), exist_ok=True)
            writer(f"{out}/{name}/{path}")

    def png(shape):
        return lambda p: write_png(p, rng.integers(0, 256, shape, dtype=np.uint8))

    folder("mixed_size", {"a/1.png": png((8, 8, 3)), "b/2.png": png((16, 16, 3))})
    folder("mixed_channels", {"a/1.png": png((8, 8, 3)), "a/2.png": png((8, 8))})
    folder("not_square", {"a/1.png": png((8, 12, 3))})
    os.makedirs(f"{out}/empty", exist_ok=True)
    folder("empty_class", {"a/1.png": png((8, 8))})
    os.makedirs(f"{out}/empty_class/b", exist_ok=True)
    folder("text_file", {"a/1.png": png((8, 8)), "a/notes.txt": lambda p: open(p, "w").write("hi")})
    folder("loose_file", {"a/1.png": png((8, 8)), "README.png": png((8, 8))})
    folder("cut_png", {"a/1.png": png((8, 8)), "a/2.png": png((32, 32, 3))})
    data = open(f"{out}/cut_png/a/2.png", "rb").read()
    open(f"{out}/cut_png/a/2.png", "wb").write(data[: len(data) // 2])
    folder("cut_jpeg", {"a/1.jpg": lambda p: write_flat_jpeg(p, rng.integers(0, 256, (4, 4, 3)))})
    data = open(f"{out}/cut_jpeg/a/1.jpg", "rb").read()
    open(f"{out}/cut_jpeg/a/1.jpg", "wb").write(data[: len(data) - 12])
    # Four components and no Adobe marker: libjpeg reads CMYK.
    folder("cmyk", {"a/1.jpg": lambda p: write_flat_jpeg(p, rng.integers(0, 256, (1, 1, 4)))})
    folder("corrupt_png", {"a/1.png": png((8, 8))})
    data = bytearray(open(f"{out}/corrupt_png/a/1.png", "rb").read())
    data[45] ^= 0xFF  # in IDAT's data (8 signature + 25 IHDR + 8 length and type bytes)
    open(f"{out}/corrupt_png/a/1.png", "wb").write(bytes(data))

    x = rng.integers(0, 256, (5, 8, 8), dtype=np.uint8)
    np.save(f"{out}/x.npy", x)
    np.save(f"{out}/y.npy", np.arange(5))
    np.save(f"{out}/float_images.npy", x.astype(np.float32))
    np.save(f"{out}/int16_images.npy", x.astype(np.int16))
    np.save(f"{out}/float_labels.npy", np.arange(5, dtype=np.float64))
    np.save(f"{out}/three_labels.npy", np.arange(3))
    np.save(f"{out}/negative_labels.npy", np.array([0, 1, -2, 1, 0]))
    np.save(f"{out}/labels_2d.npy", np.zeros((5, 1), np.int64))
    np.save(f"{out}/images_2d.npy", x.reshape(5, 64))
    np.save(f"{out}/fortran.npy", np.asfortranarray(x))
    np.save(f"{out}/wide.npy", rng.integers(0, 256, (5, 8, 12), dtype=np.uint8))
    data = open(f"{out}/x.npy", "rb").read()
    open(f"{out}/cut.npy", "wb").write(data[:-10])
    open(f"{out}/not.npy", "w").write("a text file")

    # Images files the image source refuses.
    images = rng.integers(0, 256, (5, 8, 8, 1), dtype=np.uint8)
    with h5py.File(f"{out}/good.h5", "w") as f:
        f.create_dataset("images", data=images)
        f.create_dataset("labels", data=np.arange(5) % 10)
    with h5py.File(f"{out}/big.h5", "w") as f:
        f.create_dataset("images", data=np.zeros((5, 16, 16, 1), np.uint8))
        f.create_dataset("labels", data=np.arange(5))
    with h5py.File(f"{out}/short_labels.h5", "w") as f:
        f.create_dataset("images", data=images)
        f.create_dataset("labels", data=np.arange(3))
    with h5py.File(f"{out}/float_pixels.h5", "w") as f:
        f.create_dataset("images", data=images.astype(np.float32))
        f.create_dataset("labels", data=np.arange(5))
    with h5py.File(f"{out}/flat.h5", "w") as f:
        f.create_dataset("images", data=images.reshape(5, 64))
        f.create_dataset("labels", data=np.arange(5))
    data = open(f"{out}/good.h5", "rb").read()
    open(f"{out}/damaged.h5", "wb").write(data[: len(data) // 2])


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("make", "bad"):
        sys.exit("usage: fixtures.py make|bad DIR")
    {"make": make, "bad": bad}[sys.argv[1]](sys.argv[2])
