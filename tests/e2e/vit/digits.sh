#!/usr/bin/env bash
# ViT on the digits, end to end (see CMakeLists.txt).
#   digits.sh   (environment: KOLOS, KOLOS_SOURCE_DIR, KOLOS_VENV)
set -uo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
python=${KOLOS_VENV:-$KOLOS_SOURCE_DIR/.cache/torch-venv}/bin/python
"$python" -c 'import sklearn, h5py' ||
  fail "no scikit-learn/h5py in $python: run scripts/install-venv.sh"
# The accuracy this short run reliably reaches on the held-out fifth.
min_accuracy=0.95

"$python" "$KOLOS_SOURCE_DIR/scripts/digits-to-h5.py" -o digits || fail "digits-to-h5.py failed"
"$KOLOS" run -n 2 "$KOLOS_SOURCE_DIR/examples/vit-digits.toml" \
  --set data.path=\"digits/digits-train.h5\" --set eval.path=\"digits/digits-test.h5\" \
  --set log.metrics=\"metrics.jsonl\" >run.log 2>&1 || { cat run.log; fail "kolos run failed"; }
grep "^eval step" run.log
accuracy=$("$python" - <<'PY'
import json
evals = [r for r in map(json.loads, open("metrics.jsonl")) if "eval_accuracy" in r]
print(evals[-1]["eval_accuracy"])
PY
) || fail "no eval_accuracy in metrics.jsonl"
echo "held-out accuracy $accuracy (needs >= $min_accuracy)"
"$python" -c "import sys; sys.exit(0 if $accuracy >= $min_accuracy else 1)" ||
  fail "held-out accuracy $accuracy < $min_accuracy"

# Bad input: each refused with a message naming the file and the dataset or key.
"$python" - <<'PY'
import h5py, numpy as np
with h5py.File("foreign.h5", "w") as f:
    f.create_dataset("weights", data=np.zeros(3))
with h5py.File("no_labels.h5", "w") as f:
    f.create_dataset("images", data=np.zeros((4, 8, 8, 1), np.uint8))
with h5py.File("bad_label.h5", "w") as f:
    f.create_dataset("images", data=np.zeros((4, 8, 8, 1), np.uint8))
    f.create_dataset("labels", data=np.array([0, 1, 10, 2]))
with h5py.File("rgb.h5", "w") as f:
    f.create_dataset("images", data=np.zeros((4, 8, 8, 3), np.uint8))
    f.create_dataset("labels", data=np.array([0, 1, 2, 3]))
open("not_hdf5.h5", "w").write("hello")
PY
train=("$KOLOS" train "$KOLOS_SOURCE_DIR/examples/vit-digits.toml" --set train.steps=1)
expect_failure 'data\.path: "foreign\.h5": has no dataset `images`' -- "${train[@]}" --set data.path=\"foreign.h5\"
expect_failure 'data\.path: "no_labels\.h5": has no dataset `labels`' -- "${train[@]}" --set data.path=\"no_labels.h5\"
expect_failure 'dataset `labels`\[2\] = 10 is outside \[0, model\.classes = 10\)' -- "${train[@]}" --set data.path=\"bad_label.h5\"
expect_failure 'dataset `images` holds 3 channels, but model\.channels = 1' -- "${train[@]}" --set data.path=\"rgb.h5\"
expect_failure 'data\.path: "not_hdf5\.h5": cannot be opened as an HDF5 file' -- "${train[@]}" --set data.path=\"not_hdf5.h5\"
expect_failure 'data\.path: "missing\.h5": cannot be opened as an HDF5 file' -- "${train[@]}" --set data.path=\"missing.h5\"
expect_failure 'eval\.path: "rgb\.h5": dataset `images` holds 3 channels' -- "${train[@]}" --set data.path=\"digits/digits-train.h5\" --set eval.path=\"rgb.h5\"
echo "PASS"
