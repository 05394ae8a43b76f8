#!/usr/bin/env bash
# Bad image data: inputs `kolos data prepare --images` refuses (folders of
# PNG/JPEG images, .npy arrays) and images files the image source refuses
# (data.path and eval.path), each cleanly (non-zero exit, no signal, no
# hang) with a message naming the file and what is wrong. The inputs are
# written by tests/e2e/images/fixtures.py (`bad`). More of the image
# source's cases (a foreign or non-HDF5 file, a missing dataset, labels
# outside model.classes, channels that differ) are in tests/e2e/vit.
#   images.sh   (environment: KOLOS, KOLOS_SOURCE_DIR, KOLOS_VENV)
set -uo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
python=${KOLOS_VENV:-$KOLOS_SOURCE_DIR/.cache/torch-venv}/bin/python
"$python" -c 'import numpy, h5py' || fail "no numpy/h5py in $python: run scripts/install-venv.sh"
"$python" "$KOLOS_SOURCE_DIR/tests/e2e/images/fixtures.py" bad . || fail "fixtures.py bad failed"

failed=0 passed=0
# run_case NAME REGEX CMD...: one case, counted, never exits.
run_case() {
  local name=$1 regex=$2; shift 2
  if (expect_failure "$regex" -- "$@") >"$name.log" 2>&1; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAILED: $name"; cat "$name.log"
  fi
}
prepare=("$KOLOS" data prepare -o out.h5 --images)

# Folders.
run_case mixed_size 'data error: mixed_size/b/2\.png: image of 16x16x3 \(H x W x C\), but the first image, mixed_size/a/1\.png, is 8x8x3' \
  "${prepare[@]}" mixed_size
run_case mixed_channels 'mixed_channels/a/2\.png: image of 8x8x1 \(H x W x C\), but the first image, mixed_channels/a/1\.png, is 8x8x3' \
  "${prepare[@]}" mixed_channels
run_case not_square 'not_square/a/1\.png: images of 8x12 \(H x W\) are not square' "${prepare[@]}" not_square
run_case empty_folder '--images empty: the folder has no class subfolders' "${prepare[@]}" empty
run_case empty_class 'class folder empty_class/b holds no images' "${prepare[@]}" empty_class
run_case text_file 'text_file/a/notes\.txt: not a PNG or JPEG image' "${prepare[@]}" text_file
run_case loose_file 'loose_file/README\.png: a file directly in the images folder' "${prepare[@]}" loose_file
run_case truncated_png 'cut_png/a/2\.png: not a readable PNG image: the file ends early \(truncated\)' \
  "${prepare[@]}" cut_png
run_case truncated_jpeg 'cut_jpeg/a/1\.jpg: not a readable JPEG image: Premature end of JPEG file' \
  "${prepare[@]}" cut_jpeg
run_case corrupt_png 'corrupt_png/a/1\.png: not a readable PNG image: IDAT: ' "${prepare[@]}" corrupt_png
run_case cmyk_jpeg 'cmyk/a/1\.jpg: a CMYK JPEG; convert it to RGB or grayscale first' "${prepare[@]}" cmyk
run_case missing_folder '--images missing: no such file or folder' "${prepare[@]}" missing
run_case npy_without_labels '--images x\.npy: not a folder; .*--labels Y\.npy' "${prepare[@]}" x.npy
run_case folder_with_labels 'usage error: .*--labels goes with --images X\.npy' \
  "${prepare[@]}" mixed_size --labels y.npy

# .npy arrays.
run_case npy_float_images "float_images\.npy: images of dtype '<f4'; expected uint8" \
  "${prepare[@]}" float_images.npy --labels y.npy
run_case npy_int16_images "int16_images\.npy: images of dtype '<i2'; expected uint8" \
  "${prepare[@]}" int16_images.npy --labels y.npy
run_case npy_float_labels "float_labels\.npy: labels of dtype '<f8'; expected int64, int32 or uint8" \
  "${prepare[@]}" x.npy --labels float_labels.npy
run_case npy_label_count 'three_labels\.npy: 3 labels, but x\.npy holds 5 images' \
  "${prepare[@]}" x.npy --labels three_labels.npy
run_case npy_negative_label 'negative_labels\.npy: label \[2\] = -2 is negative' \
  "${prepare[@]}" x.npy --labels negative_labels.npy
run_case npy_labels_2d 'labels_2d\.npy: labels of 2 dimensions' "${prepare[@]}" x.npy --labels labels_2d.npy
run_case npy_images_2d 'images_2d\.npy: images of 2 dimensions; expected N x H x W x C or N x H x W' \
  "${prepare[@]}" images_2d.npy --labels y.npy
run_case npy_fortran 'fortran\.npy: the array is stored in Fortran \(column-major\) order' \
  "${prepare[@]}" fortran.npy --labels y.npy
run_case npy_not_square 'wide\.npy: images of 8x12 \(H x W\) are not square' "${prepare[@]}" wide.npy --labels y.npy
run_case npy_truncated "cut\.npy: shape \(5, 8, 8\) of dtype '\|u1' needs 320 bytes of data, the file has 310 \(truncated\?\)" \
  "${prepare[@]}" cut.npy --labels y.npy
run_case npy_not_npy 'not\.npy: not a NumPy \.npy file' "${prepare[@]}" not.npy --labels y.npy
run_case npy_missing 'cannot open \.npy file nope\.npy: No such file or directory' \
  "${prepare[@]}" nope.npy --labels y.npy
run_case no_output_dir 'cannot create no/such/dir/out\.h5\.tmp\.[0-9]+ \(temporary file for no/such/dir/out\.h5\)' \
  "$KOLOS" data prepare --images x.npy --labels y.npy -o no/such/dir/out.h5

# A refused input leaves an existing output as it was, and no temporary file.
"$KOLOS" data prepare --images x.npy --labels y.npy -o out.h5 >/dev/null || fail "preparing out.h5 failed"
before=$(sha256sum out.h5)
run_case keeps_output 'three_labels\.npy: 3 labels' "${prepare[@]}" x.npy --labels three_labels.npy
run_case keeps_output_folder 'cut_png/a/2\.png: not a readable PNG' "${prepare[@]}" cut_png
[[ $(sha256sum out.h5) == "$before" ]] || { failed=$((failed + 1)); echo "FAILED: out.h5 changed"; }
if ls ./*.tmp.* 2>/dev/null; then failed=$((failed + 1)); echo "FAILED: a temporary file was left"; fi

# Images files the image source refuses (model.image_size = 8, channels 1).
train=("$KOLOS" train "$KOLOS_SOURCE_DIR/examples/vit-digits.toml" --set train.steps=1)
# train_case NAME REGEX DATA EVAL: a step reading DATA, evaluating on EVAL,
# fails matching REGEX.
train_case() {
  run_case "$1" "$2" "${train[@]}" --set data.path=\""$3"\" --set eval.path=\""$4"\"
}
train_case damaged_h5 'data\.path: "damaged\.h5": HDF5 could not open it \(damaged\?\)' damaged.h5 good.h5
train_case other_size 'data\.path: "big\.h5": dataset `images` holds 16x16 images, but model\.image_size = 8' big.h5 good.h5
train_case short_labels 'data\.path: "short_labels\.h5": dataset `labels` has shape \[3\]; expected \[5\]' short_labels.h5 good.h5
train_case float_pixels 'data\.path: "float_pixels\.h5": dataset `images` must hold uint8 pixels' float_pixels.h5 good.h5
train_case flat_images 'data\.path: "flat\.h5": dataset `images` has shape \[5 x 64\]; expected N x H x W x C' flat.h5 good.h5
train_case eval_other_size 'eval\.path: "big\.h5": dataset `images` holds 16x16 images, but model\.image_size = 8' good.h5 big.h5
train_case eval_damaged 'eval\.path: "damaged\.h5": HDF5 could not open it \(damaged\?\)' good.h5 damaged.h5

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]] || fail "$failed bad-image case(s) not refused as expected"
echo "PASS"
