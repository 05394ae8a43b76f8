#!/usr/bin/env python3
"""scikit-learn's bundled digits as kolos image files (data.kind = "images").

The 1797 8x8 grayscale digits (pixel values 0..16, scaled to 0..255 and
rounded) are shuffled with --seed and split into OUT/digits-train.h5 and
OUT/digits-test.h5 (--test-fraction of them held out). Each file holds
`images` (N x 8 x 8 x 1 uint8) and `labels` (N int64, 0..9), the layout the
image source reads (docs/data.md).

    .cache/torch-venv/bin/python scripts/digits-to-h5.py -o data/

Needs numpy, h5py and scikit-learn (scripts/install-venv.sh installs them).
"""
import argparse
import os
import sys

import h5py
import numpy as np
from sklearn.datasets import load_digits


def write(path, images, labels):
    tmp = path + ".tmp"
    with h5py.File(tmp, "w") as f:
        f.create_dataset("images", data=images, dtype="uint8")
        f.create_dataset("labels", data=labels, dtype="int64")
    os.replace(tmp, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--out", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    parser.add_argument("--test-fraction", type=float, default=0.2,
                        help="share held out as the test file (default 0.2)")
    args = parser.parse_args()
    if not 0 < args.test_fraction < 1:
        sys.exit("digits-to-h5: --test-fraction must be in (0, 1)")
    digits = load_digits()
    images = np.rint(digits.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)[..., None]
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(args.seed).permutation(len(labels))
    images, labels = images[order], labels[order]
    test = int(round(len(labels) * args.test_fraction))
    os.makedirs(args.out, exist_ok=True)
    train_path = os.path.join(args.out, "digits-train.h5")
    test_path = os.path.join(args.out, "digits-test.h5")
    write(train_path, images[test:], labels[test:])
    write(test_path, images[:test], labels[:test])
    print(f"digits-to-h5: {len(labels) - test} images -> {train_path}, "
          f"{test} images -> {test_path} (8x8x1 uint8, 10 classes)")


if __name__ == "__main__":
    main()
