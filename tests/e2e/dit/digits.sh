#!/usr/bin/env bash
# DiT on the digits, end to end (see CMakeLists.txt).
#   digits.sh   (environment: KOLOS, KOLOS_SOURCE_DIR, KOLOS_VENV)
set -uo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
python=${KOLOS_VENV:-$KOLOS_SOURCE_DIR/.cache/torch-venv}/bin/python
"$python" -c 'import sklearn, h5py, numpy' ||
  fail "no scikit-learn/h5py/numpy in $python: run scripts/install-venv.sh"
example=$KOLOS_SOURCE_DIR/examples/dit-digits.toml

"$python" "$KOLOS_SOURCE_DIR/scripts/digits-to-h5.py" -o digits || fail "digits-to-h5.py failed"
# The example, shrunk to a short run.
small=(--set model.layers=2 --set model.hidden=64 --set train.steps=120 --set train.global_batch=64
  --set train.micro_batch=32 --set optim.warmup_steps=10 --set eval.every=60 --set eval.samples=128
  --set data.path=\"digits/digits-train.h5\" --set eval.path=\"digits/digits-test.h5\"
  --set checkpoint.dir=\"ck\" --set log.metrics=\"metrics.jsonl\")
"$KOLOS" run -n 2 "$example" "${small[@]}" >run.log 2>&1 || { cat run.log; fail "kolos run failed"; }
grep "^eval step" run.log
"$python" - <<'PY' || fail "the diffusion loss did not fall, or [eval] reported wrongly"
import json
rows = [json.loads(line) for line in open("metrics.jsonl")]
steps = [r for r in rows if "loss" in r and "step" in r]
evals = [r for r in rows if "eval_loss" in r]
first = sum(r["loss"] for r in steps[:5]) / 5
last = sum(r["loss"] for r in steps[-5:]) / 5
print(f"mean loss of the first 5 steps {first:.4f}, of the last 5 {last:.4f}; eval losses",
      [round(r["eval_loss"], 4) for r in evals])
assert len(steps) == 120, len(steps)
assert last < 0.5 * first, (first, last)
assert len(evals) == 2 and all(0 < r["eval_loss"] < first for r in evals), evals
assert not any("eval_accuracy" in r for r in evals), "a diffusion model has no accuracy"
PY

# A PNG grid: 3 rows (classes) x 4 columns of 64x64 tiles (8x8 pixels drawn 8x8) and 1-pixel gaps.
"$KOLOS" sample ck --classes 0,3,7 --per-class 4 --steps 20 --cfg-scale 2 -o grid.png ||
  fail "kolos sample failed"
"$KOLOS" sample ck --classes 9 --per-class 2 --steps 10 --sampler ddpm --seed 5 -o ddpm.png ||
  fail "kolos sample --sampler ddpm failed"
"$python" - <<'PY' || fail "the PNG grid is not what was asked for"
import struct, zlib
def read_png(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0]
        if kind == b"IHDR": header = struct.unpack(">IIBBBBB", body)
        if kind == b"IDAT": idat += body
        pos += 12 + n
    width, height, depth, color = header[:4]
    raw = zlib.decompress(idat)
    assert len(raw) == height * (1 + width), (len(raw), width, height)  # gray, 8 bits
    return width, height, depth, color
w, h, depth, color = read_png("grid.png")
print(f"grid.png: {w}x{h}, {depth}-bit, color type {color}")
assert (w, h, depth, color) == (4 * 64 + 3, 3 * 64 + 2, 8, 0), (w, h, depth, color)
assert read_png("ddpm.png")[:2] == (2 * 64 + 1, 64)
PY

# A checkpoint written under another layout (tp1d over 2 ranks): read whole, resharded.
"$KOLOS" run -n 2 "$example" "${small[@]}" --set train.steps=2 --set parallel.tensor.size=2 \
  --set checkpoint.dir=\"cktp\" --set log.metrics=\"\" >tp.log 2>&1 || { cat tp.log; fail "tp1d run failed"; }
"$KOLOS" sample cktp --classes 4 --per-class 1 --steps 3 -o tp.png || fail "kolos sample of a tp1d checkpoint failed"
[[ -s tp.png ]] || fail "no tp.png"

# A resumed run draws what the straight run drew (the noise keys follow the
# global sample index): its step-4 loss is the straight run's.
quick=("${small[@]}" --set train.steps=4 --set checkpoint.every=2 --set log.progress=\"lines\"
  --set log.metrics=\"\" --set eval.every=0)
"$KOLOS" train "$example" "${quick[@]}" --set checkpoint.dir=\"ckr\" >straight.log 2>&1 ||
  { cat straight.log; fail "4-step run failed"; }
rm -rf ckr/step-00000004 && echo step-00000002 >ckr/latest
"$KOLOS" train "$example" "${quick[@]}" --set checkpoint.dir=\"ckr\" --resume ckr >resumed.log 2>&1 ||
  { cat resumed.log; fail "resumed run failed"; }
straight=$(grep -o '^step 4/4 loss [0-9.]*' straight.log)
resumed=$(grep -o '^step 4/4 loss [0-9.]*' resumed.log)
echo "straight: $straight; resumed from step 2: $resumed"
[[ -n $straight && $straight == "$resumed" ]] || fail "the resumed run differs: $straight vs $resumed"

# Refusals, each naming what is wrong.
sample=("$KOLOS" sample ck -o bad.png)
expect_failure "class 10 is outside the model's classes 0\.\.9 \(model\.classes = 10\)" -- "${sample[@]}" --classes 1,10
expect_failure '--classes `1,,2`: expected class numbers' -- "${sample[@]}" --classes 1,,2
expect_failure '--classes `-1`: expected an integer' -- "${sample[@]}" --classes -1
expect_failure '--steps `0`: expected an integer in 1\.\.' -- "${sample[@]}" --classes 1 --steps 0
expect_failure '--steps 5000: at most the model.s 1000 \(model\.diffusion_steps\)' -- "${sample[@]}" --classes 1 --steps 5000
expect_failure '--sampler `euler`: expected ddim or ddpm' -- "${sample[@]}" --classes 1 --sampler euler
expect_failure '--cfg-scale `x`: expected a finite number' -- "${sample[@]}" --classes 1 --cfg-scale x
expect_failure '--per-class `0`' -- "${sample[@]}" --classes 1 --per-class 0
expect_failure 'missing --classes' -- "${sample[@]}"
expect_failure 'missing -o' -- "$KOLOS" sample ck --classes 1
expect_failure 'nope' -- "$KOLOS" sample nope --classes 1 -o bad.png
# Guidance needs the null class, which class_dropout = 0 never trains.
"$KOLOS" train "$example" "${small[@]}" --set train.steps=1 --set model.class_dropout=0.0 \
  --set checkpoint.dir=\"ck0\" --set log.metrics=\"\" >/dev/null 2>&1 || fail "1-step run failed"
expect_failure 'model\.class_dropout = 0.*--cfg-scale 1' -- "$KOLOS" sample ck0 --classes 1 --cfg-scale 3 -o bad.png
# Not a dit: a vit checkpoint.
"$KOLOS" train "$KOLOS_SOURCE_DIR/examples/vit-digits.toml" --set train.steps=1 \
  --set data.path=\"digits/digits-train.h5\" --set eval.path=\"digits/digits-test.h5\" \
  --set checkpoint.dir=\"vit\" >/dev/null 2>&1 || fail "1-step vit run failed"
expect_failure 'model\.name = "vit" is not a diffusion model' -- "$KOLOS" sample vit --classes 1 -o bad.png
[[ ! -e bad.png ]] || fail "a refused request wrote bad.png"
# Sequence parallelism: refused when the config is checked.
expect_failure 'parallel\.sequence\.size = 2: model\.name = "dit" attends bidirectionally' -- \
  "$KOLOS" check "$example" -n 2 --set parallel.sequence.size=2
echo "PASS"
