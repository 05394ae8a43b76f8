#!/usr/bin/env bash
# Do a DiT's samples look like their class? Trains examples/dit-digits.toml
# on scikit-learn's digits (2 ranks), draws 20 samples of each class with
# `kolos sample`, and has a ViT trained on the digits' training file
# (examples/vit-digits.toml) classify them through its [eval]: prints the
# fraction classified as their conditioning class and exits 1 below
# MIN_ACCURACY (default 0.5; chance is 0.1). Minutes on 2 CPU cores, so not
# part of ctest (tests/e2e/dit runs a short version of the same pipeline).
#
#   scripts/dit-digits-check.sh [WORKDIR]
#   environment: KOLOS (build/bin/kolos), KOLOS_VENV (.cache/torch-venv),
#                DIT_STEPS (the example's 3000), CFG_SCALE (2), MIN_ACCURACY (0.5)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kolos=${KOLOS:-$root/build/bin/kolos}
python=${KOLOS_VENV:-$root/.cache/torch-venv}/bin/python
work=${1:-/tmp/kolos-dit-check}
steps=${DIT_STEPS:-3000}
cfg=${CFG_SCALE:-2}
min_accuracy=${MIN_ACCURACY:-0.5}
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
mkdir -p "$work"
cd "$work"
rm -rf dit samples.png samples.h5 vit.jsonl

"$python" "$root/scripts/digits-to-h5.py" -o digits
data=(--set data.path=\"digits/digits-train.h5\" --set eval.path=\"digits/digits-test.h5\")
echo "dit-digits-check: training the DiT for $steps steps (log: $work/dit.log)"
"$kolos" run -n 2 "$root/examples/dit-digits.toml" "${data[@]}" --set train.steps="$steps" \
  --set checkpoint.dir=\"dit\" --set log.progress=\"lines\" >dit.log 2>&1 || { tail -20 dit.log; exit 2; }
grep '^eval step' dit.log | tail -1
"$kolos" sample dit --classes 0,1,2,3,4,5,6,7,8,9 --per-class 20 --scale 1 --cfg-scale "$cfg" \
  -o samples.png
"$kolos" sample dit --classes 0,1,2,3,4,5,6,7,8,9 --per-class 8 --cfg-scale "$cfg" -o grid.png

# The 10 x 20 grid of 8x8 tiles (1-pixel gaps) as an images file.
"$python" - <<'PY'
import struct, zlib
import h5py
import numpy as np

data = open("samples.png", "rb").read()
pos, idat = 8, b""
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        width, height, depth, color = struct.unpack(">IIBB", body[:10])
        assert (depth, color) == (8, 0), "expected an 8-bit gray PNG"
    if kind == b"IDAT":
        idat += body
    pos += 12 + n
raw = zlib.decompress(idat)
grid = np.zeros((height, width), np.uint8)
prev = np.zeros(width, np.int64)
for y in range(height):
    row = raw[y * (width + 1):(y + 1) * (width + 1)]
    kind, line = row[0], np.frombuffer(row[1:], np.uint8).astype(np.int64)
    cur = np.zeros(width, np.int64)
    for x in range(width):  # PNG's per-row filters
        a = cur[x - 1] if x else 0
        b = prev[x]
        c = prev[x - 1] if x else 0
        if kind == 0: p = 0
        elif kind == 1: p = a
        elif kind == 2: p = b
        elif kind == 3: p = (a + b) // 2
        else:
            pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
            p = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
        cur[x] = (line[x] + p) & 255
    grid[y], prev = cur, cur
tiles = [grid[r * 9:r * 9 + 8, c * 9:c * 9 + 8] for r in range(10) for c in range(20)]
with h5py.File("samples.h5", "w") as f:
    f.create_dataset("images", data=np.array(tiles)[..., None])
    f.create_dataset("labels", data=np.repeat(np.arange(10), 20))
PY

echo "dit-digits-check: training the ViT classifier (log: $work/vit.log)"
"$kolos" run -n 2 "$root/examples/vit-digits.toml" --set data.path=\"digits/digits-train.h5\" \
  --set eval.path=\"samples.h5\" --set eval.samples=200 --set eval.every=0 \
  --set log.metrics=\"vit.jsonl\" >vit.log 2>&1 || { tail -20 vit.log; exit 2; }
accuracy=$("$python" -c '
import json
rows = [json.loads(l) for l in open("vit.jsonl")]
print([r for r in rows if "eval_accuracy" in r][-1]["eval_accuracy"])')
echo "dit-digits-check: $accuracy of 200 DiT samples (cfg scale $cfg, $steps steps) classified" \
  "as their class (needs >= $min_accuracy; chance 0.1); the grid: $work/grid.png"
"$python" -c "import sys; sys.exit(0 if $accuracy >= $min_accuracy else 1)"
