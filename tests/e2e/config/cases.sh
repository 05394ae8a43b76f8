#!/usr/bin/env bash
# Configuration cases (see CMakeLists.txt):  cases.sh CASE
set -uo pipefail
case_name=$1
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
src=$KOLOS_SOURCE_DIR

case "$case_name" in
  shipped_configs)
    # The TOML blocks of the docs, one file each, named after where they are.
    python3 - "$src" <<'PY' || fail "could not extract the docs' TOML blocks"
import pathlib, re, sys
src = pathlib.Path(sys.argv[1])
for doc in [src / "README.md", *sorted((src / "docs").glob("*.md"))]:
    text = doc.read_text()
    for m in re.finditer(r"^```toml\n(.*?)^```", text, re.S | re.M):
        line = text[: m.start()].count("\n") + 2
        name = f"{doc.relative_to(src)}:{line}".replace("/", "_")
        pathlib.Path(f"{name}.toml").write_text(m.group(1))
PY
    files=()
    while IFS= read -r f; do files+=("$f"); done < <(
      # (examples/clusters holds the planner's cluster files: planner_cluster_test
      # loads them)
      cd "$src" && find examples k8s launchers -name '*.toml' -not -path 'examples/clusters/*' | sort)
    [[ ${#files[@]} -ge 5 ]] || fail "found only ${#files[@]} shipped TOML files"
    blocks=(*.toml)
    [[ ${#blocks[@]} -ge 8 ]] || fail "found only ${#blocks[@]} TOML blocks in the docs"
    failed=0
    for f in "${files[@]/#/$src/}" "${blocks[@]}"; do
      if timeout 60 "$KOLOS" check "$f" >out.txt 2>err.txt; then
        echo "ok: $(cat out.txt)"
      else
        echo "FAILED: $f"; cat err.txt; failed=$((failed + 1))
      fi
    done
    echo "$(( ${#files[@]} + ${#blocks[@]} - failed )) passed, $failed failed (shipped TOML)"
    [[ $failed -eq 0 ]] || fail "$failed shipped TOML file(s) do not pass kolos check"
    ;;
  plugin_keys)
    # A plugin's unknown key: file:line:col, the plugin's valid keys, a suggestion.
    printf '[parallel]\npipeline = { size = 2, schedul = "zb" }\n' >pp.toml
    expect_failure 'pp.toml:2:[0-9]+: unknown key .parallel.pipeline.schedul.; valid keys in \[parallel.pipeline\] \(pipeline plugin .pipeline.\): size, schedule, microbatches, chunks, balance, layers_per_stage\. Did you mean .schedule.\?' \
      -- "$KOLOS" check pp.toml
    # An invalid value of a plugin's key, with what is valid.
    printf '[parallel]\ntensor = { size = 8, mode = "2.5d", depth = 0 }\n' >tp.toml
    expect_failure 'tp.toml:2:[0-9]+: parallel.tensor.depth: 0 is out of range; it must be >= 1' \
      -- "$KOLOS" check tp.toml
    # A key of another mode's plugin is refused by the plugin that runs.
    printf '[parallel]\ntensor = { size = 4, mode = "2d", depth = 2 }\n' >tp2.toml
    expect_failure 'unknown key .parallel.tensor.depth.; valid keys in \[parallel.tensor\] \(layers plugin .tp2d.\): size, mode' \
      -- "$KOLOS" check tp2.toml
    # zero3's key under zero1.
    printf '[parallel]\nzero = { stage = 1, reshard_after_forward = false }\n' >z.toml
    expect_failure 'z.toml:2:[0-9]+: unknown key .parallel.zero.reshard_after_forward.; valid keys in \[parallel.zero\] \(gradients plugin .zero1.\): stage' \
      -- "$KOLOS" check z.toml -n 2
    # Keys no plugin reads are refused: a schedule with no pipeline, a
    # sequence mode at sequence size 1, a mode at tensor size 1.
    printf '[parallel]\npipeline = { size = 1, schedule = "zb" }\n' >p1.toml
    expect_failure 'unknown key .parallel.pipeline.schedule.; valid keys in \[parallel.pipeline\] \(the built-in pipeline .single-stage.\): size' \
      -- "$KOLOS" check p1.toml
    printf '[parallel]\nsequence = { size = 1, mode = "ulysses" }\n' >s.toml
    expect_failure 'parallel.sequence.mode: "ulysses" has no effect: parallel.sequence.size = 1 splits no sequence' \
      -- "$KOLOS" check s.toml
    printf '[parallel]\ntensor = { size = 1, mode = "2d" }\n' >t1.toml
    expect_failure 'parallel.tensor.mode: "2d" has no effect' -- "$KOLOS" check t1.toml
    # A plugin that does not exist for a role, and keys the precision ignores, fail at once.
    printf '[plugins]\nplanner = "autoplann"\n' >m.toml
    expect_failure 'plugins.planner.*autoplann' -- "$KOLOS" check m.toml
    # The memory plugin owns [memory]: its keys, with a "did you mean".
    printf '[memory]\ncompute_budget = "1GiB"\nplacment = "auto"\n' >mem.toml
    expect_failure 'mem.toml:3:1: unknown key .memory.placment.; valid keys in \[memory\] \(memory plugin .chunks.\): placement, compute_budget, offload, nvme_dir, chunk_size.*Did you mean .placement.\?' \
      -- "$KOLOS" check mem.toml
    printf '[train]\nprecision = "bf16"\nloss_scale_init = 8.0\n' >bf.toml
    expect_failure 'bf.toml:3:[0-9]+: train.loss_scale_init: loss scaling applies to precision = "fp16" only' \
      -- "$KOLOS" check bf.toml
    # `kolos run` makes the same checks before it starts any rank.
    expect_failure 'unknown key .parallel.pipeline.schedul.' -- "$KOLOS" run -n 2 pp.toml
    grep -q "mpirun" err.txt && fail "kolos run started mpirun for a config that fails its checks"
    # A valid config passes and says what it would run.
    printf '[parallel]\ntensor = { size = 8, mode = "2.5d", depth = 2 }\n[train]\nmicro_batch = 4\nglobal_batch = 8\n' >ok.toml
    timeout 60 "$KOLOS" check ok.toml >out.txt 2>err.txt || { cat err.txt; fail "ok.toml"; }
    grep -q "ok for 8 ranks: mesh pp=1 dp=1 sp=1 tp=8 | layers tp2p5d" out.txt || fail "$(cat out.txt)"
    ;;
  *)
    fail "unknown case $case_name"
    ;;
esac
