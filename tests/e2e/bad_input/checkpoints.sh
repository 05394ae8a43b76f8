#!/usr/bin/env bash
# Damaged checkpoints: a short `kolos train` writes a sound one, then
# damage_checkpoint.py (h5py) makes one damaged copy per case. Each refused
# case must fail cleanly (non-zero exit, no signal, no hang) with its
# message from `kolos ckpt verify DIR` and from `kolos train --resume DIR`,
# leave its files unchanged and write no checkpoint. Damage that loads the
# same tensors (HDF5 converts the type; the index, not a shard attribute,
# gives the global shape) must still verify and resume.
#   checkpoints.sh      (environment: KOLOS, KOLOS_SOURCE_DIR)
set -uo pipefail
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
PY=/usr/bin/python3   # Debian's python3-h5py / numpy
T='/model/h\.0\.attn\.q_proj\.weight'

# case -> the message, for verify and resume alike (after "DIR/").
declare -A refused=(
  [shard_wrong_shape]="shard-0\.h5: dataset $T: shape \[16, 32\], the index expects \[32, 32\]"
  [offset_outside]="shard-0\.h5: dataset $T: offset \[64, 0\], the index maps it at \[0, 0\]"
  [offset_negative]="shard-0\.h5: dataset $T: offset \[-1, 0\], the index maps it at \[0, 0\]"
  [offset_wrong_rank]="shard-0\.h5: dataset $T: offset \[0\], the index maps it at \[0, 0\]"
  [offset_string]="shard-0\.h5: dataset $T: attribute kolos\.offset is not an integer"
  [dtype_attr_other]="shard-0\.h5: dataset $T: dtype float64 differs from the index's"
  [dtype_attr_unknown]="shard-0\.h5: dataset $T: dtype complex64 differs from the index's"
  [crc_attr_string]="shard-0\.h5: dataset $T: attribute kolos\.crc32c is not an integer"
  [crc_attr_missing]="shard-0\.h5: dataset $T: attribute kolos\.crc32c is missing"
  [shard_dataset_missing]="shard-0\.h5: dataset $T is missing"
  [vds_missing_file]="missing shard [^ ]*/shard-7\.h5 \(holds dataset $T \[32, 32\] at \[0, 0\]\)"
  [vds_missing_dataset]="index\.h5: model/h\.0\.attn\.q_proj\.weight maps to dataset /model/no_such_tensor"
  [vds_absolute_path]="index\.h5: model/h\.0\.attn\.q_proj\.weight maps to \`/nonexistent/elsewhere/shard-0\.h5\`, not a shard"
  [index_tensor_missing]="index\.h5: dataset $T is listed but missing"
  [index_not_virtual]="index\.h5: dataset $T is not a virtual dataset"
  [step_attr_string]="index\.h5: attribute step is not an integer"
  [format_future]="index\.h5: checkpoint format 2, this kolos reads format 1"
  [tensors_attr_int]="index\.h5: attribute tensors is not a fixed-length string"
  [mesh_attr_short]="index\.h5: attribute mesh \[1, 1, 1\] does not match its axes"
  [index_truncated]="cannot open [^ ]*/index\.h5 as HDF5: truncated file"
  [index_empty]="cannot open [^ ]*/index\.h5 as HDF5: file signature not found"
  [shard_truncated_header]="cannot open [^ ]*/shard-0\.h5 as HDF5: truncated file"
  [index_foreign_hdf5]="index\.h5: attribute kolos\.format is missing"
  [index_text]="cannot open [^ ]*/index\.h5 as HDF5: file signature not found"
  [step_negative]="index\.h5: attribute step is -4; it counts what the run has done and must be >= 0"
  [rng_wrong_size]="index\.h5: dataset /rng/cpu: shape \[1, 100\], expected \[1, [0-9]+\] \(one [0-9]+-byte LibTorch CPU generator state per rank"
  [rng_wrong_ranks]="index\.h5: dataset /rng/cpu: shape \[3, [0-9]+\], expected \[1, [0-9]+\]"
  [world_size_huge]="index\.h5: attribute world_size is 1099511627776, the mesh \[1, 1, 1, 1\] \(pp, dp, sp, tp\) has 1 ranks"
  [latest_outside]="latest_outside-root/latest: \`\.\./\.\./etc\` points outside the checkpoint directory [^ ]*latest_outside-root; it must name a step-N directory inside it"
  [latest_missing_target]="latest names [^ ]*/step-00000099, which holds no index\.h5"
)
accepted=(global_shape_attr_wrong shard_data_float64 index_tensor_float64)

{
  tiny_gpt_model
  cat <<'TOML'
[train]
global_batch = 8
micro_batch = 4
steps = 4
seed = 7
[log]
progress = "off"
[checkpoint]
dir = "ckpt"
TOML
} >run.toml
# One rank as an MPI singleton: no mpirun start-up per case.
timeout 120 "$KOLOS" train run.toml </dev/null >train.txt 2>&1 || { cat train.txt; fail "training failed"; }
mkdir damaged
$PY "$KOLOS_SOURCE_DIR/tests/e2e/bad_input/damage_checkpoint.py" ckpt/step-00000004 damaged ||
  fail "could not write the damaged checkpoints"

failed=0 passed=0
while IFS=$'\t' read -r name dir what; do
  if [[ " ${accepted[*]} " == *" $name "* ]]; then
    if "$KOLOS" ckpt verify "$dir" >log.txt 2>&1 </dev/null &&
      timeout 120 "$KOLOS" train run.toml --resume "$dir" --set checkpoint.dir=other \
        </dev/null >>log.txt 2>&1; then
      passed=$((passed + 1)); echo "ok: $name ($what) loads"
    else
      failed=$((failed + 1)); echo "FAILED: $name ($what) should load"; cat log.txt
    fi
    rm -rf other
    continue
  fi
  regex=${refused[$name]:-}
  [[ -n $regex ]] || fail "$name: no expected message in checkpoints.sh"
  before=$(find "$dir" -type f -exec md5sum {} + | sort)
  if (expect_failure "$regex" -- "$KOLOS" ckpt verify "$dir" </dev/null &&
    expect_failure "$regex" -- "$KOLOS" train run.toml --resume "$dir" \
      --set checkpoint.dir=other </dev/null &&
    [[ $(find "$dir" -type f -exec md5sum {} + | sort) == "$before" ]] &&
    [[ ! -e other ]]) >"$name.log" 2>&1; then
    passed=$((passed + 1)); echo "ok: $name ($what)"
  else
    failed=$((failed + 1)); echo "FAILED: $name ($what)"; cat "$name.log"
  fi
  rm -rf other
done <damaged/cases.tsv
total=$((passed + failed))
echo "$passed of $total damaged checkpoints handled as expected (${#refused[@]} refused, ${#accepted[@]} loading)"
[[ $failed -eq 0 ]] || fail "$failed of $total damaged checkpoints"
[[ ${#refused[@]} -ge 20 && $total -eq $((${#refused[@]} + ${#accepted[@]})) ]] ||
  fail "$total cases run, ${#refused[@]} refused expected"
echo "PASS: damaged checkpoints"
