#!/usr/bin/env bash
# `kolos data prepare --images`, end to end (see CMakeLists.txt).
#   prepare.sh   (environment: KOLOS, KOLOS_SOURCE_DIR, KOLOS_VENV)
set -uo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
python=${KOLOS_VENV:-$KOLOS_SOURCE_DIR/.cache/torch-venv}/bin/python
"$python" -c 'import numpy, h5py' || fail "no numpy/h5py in $python: run scripts/install-venv.sh"
here=$KOLOS_SOURCE_DIR/tests/e2e/images

"$python" "$here/fixtures.py" make in || fail "fixtures.py make failed"
prepare() { "$KOLOS" data prepare "$@" || fail "kolos data prepare $* failed"; }
prepare --images in/rgb -o rgb.h5 | tee rgb.log
grep -q "wrote 6 images of 16x16x3 and 2 classes (0 = ant, 1 = bee) to rgb.h5" rgb.log ||
  fail "unexpected summary: $(cat rgb.log)"
prepare --images in/gray -o gray.h5
prepare --images in/deep -o deep.h5
prepare --images in/x.npy --labels in/y.npy -o npy.h5 | tee npy.log
grep -q "wrote 40 images of 8x8x1 and 10 classes to npy.h5" npy.log ||
  fail "unexpected summary: $(cat npy.log)"
prepare --images in/x4.npy --labels in/y4.npy -o npy4.h5
# Writing again replaces the file whole, through a temporary file.
prepare --images in/rgb -o rgb.h5
ls ./*.tmp.* 2>/dev/null && fail "a temporary file was left behind"

# The files hold exactly the source pixels (a flat-block JPEG within 1 of
# the JFIF colour conversion, fixtures.py) and labels, in sorted order, with
# the datasets' types and the class names.
"$python" - <<'PY' || fail "the prepared files differ from their sources"
import h5py, numpy as np
want = np.load("in/expected.npz")
def check(path, name, names=None):
    with h5py.File(path, "r") as f:
        images, labels = f["images"], f["labels"]
        assert images.dtype == np.uint8 and labels.dtype == np.int64, (path, images.dtype, labels.dtype)
        got, lab = images[()], labels[()]
        assert got.shape == want[f"{name}_images"].shape, (path, got.shape)
        if f"{name}_jpeg" in want:
            jpeg = want[f"{name}_jpeg"]
            assert (got[~jpeg] == want[f"{name}_images"][~jpeg]).all(), f"{path}: PNG pixels differ"
            diff = np.abs(got[jpeg].astype(int) - want[f"{name}_images"][jpeg])
            assert diff.max() <= 1, f"{path}: JPEG pixels off by {diff.max()}"
        else:
            assert (got == want[f"{name}_images"]).all(), f"{path}: pixels differ"
        if f"{name}_labels" in want:
            assert (lab == want[f"{name}_labels"]).all(), (path, lab)
        if names is None:
            assert "class_names" not in labels.attrs, path
        else:
            assert list(labels.attrs["class_names"]) == names, (path, labels.attrs["class_names"])
    print(f"{path}: {got.shape} {got.dtype}, labels {lab.tolist()}: as written")
check("rgb.h5", "rgb", ["ant", "bee"])
check("gray.h5", "gray", ["ant", "bee"])
check("deep.h5", "deep", ["only"])
check("npy.h5", "npy")
check("npy4.h5", "npy4")
PY

# The image source reads them: a ViT trains 2 steps on each, with the folder's
# file as its own [eval] file too.
train=("$KOLOS" train "$KOLOS_SOURCE_DIR/examples/vit-digits.toml" --set train.steps=2 --set log.every=1)
"${train[@]}" --set data.path=\"npy.h5\" --set eval.path=\"npy.h5\" >npy-train.log 2>&1 ||
  { cat npy-train.log; fail "training on npy.h5 failed"; }
"${train[@]}" --set data.path=\"rgb.h5\" --set eval.path=\"rgb.h5\" --set model.image_size=16 \
  --set model.channels=3 --set model.classes=2 >rgb-train.log 2>&1 ||
  { cat rgb-train.log; fail "training on rgb.h5 failed"; }
grep -h "^eval step\|done:" npy-train.log rgb-train.log
grep -q '^eval step 2: .* 40 held-out samples' npy-train.log || fail "npy.h5 was not read as 40 images"
grep -q '^eval step 2: .* 6 held-out samples' rgb-train.log || fail "rgb.h5 was not read as 6 images"
echo "PASS"
