#!/usr/bin/env bash
# The planner role through the `kolos` command (see CMakeLists.txt):
#   cases.sh CASE      (environment: KOLOS, KOLOS_SOURCE_DIR)
set -uo pipefail
case_name=$1
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
PY=/usr/bin/python3
export KOLOS_CACHE_DIR=$work/cache
config=$KOLOS_SOURCE_DIR/bench/planner/gpt-check.toml
cp "$config" gpt.toml

# `plan` calibrates this machine for 4 ranks and leaves the file in
# KOLOS_SHARED_CALIBRATION; `auto` and `predict` (run after it) start from
# that copy instead of calibrating again. Without it they calibrate.
if [[ -n ${KOLOS_SHARED_CALIBRATION:-} && ($case_name == auto || $case_name == predict) ]] &&
  compgen -G "$KOLOS_SHARED_CALIBRATION/*-n4.toml" >/dev/null; then
  mkdir -p cache/calibration
  cp "$KOLOS_SHARED_CALIBRATION"/*-n4.toml cache/calibration/
fi

# The JSON line of a `kolos plan --json` output.
plan_json() { grep '^{' "$1" | tail -1; }

case "$case_name" in
  plan)
    [[ -z ${KOLOS_SHARED_CALIBRATION:-} ]] || rm -rf "$KOLOS_SHARED_CALIBRATION"
    timeout 600 "$KOLOS" plan gpt.toml -n 4 >plan.txt 2>plan.err ||
      { cat plan.txt plan.err; fail "kolos plan failed"; }
    cat plan.err plan.txt
    grep -q "calibrating this machine for 4 ranks" plan.err || fail "no calibration was announced"
    ls cache/calibration/*-n4.toml >/dev/null || fail "no calibration file in the cache"
    # The six reference runs (data parallel at the config's micro-batch 4
    # and at 1, tensor 1d over 4 and in pairs, tensor 2d, ring attention)
    # each left their figure and their line; the pair of data-parallel
    # runs set the fixed cost per block and micro-batch.
    cal=$(ls cache/calibration/*-n4.toml)
    head -1 "$cal"
    head -1 "$cal" | grep -qE "; reference pp 1 dp 4 sp 1 tp 1 M=4 mb 1 zero0 none: .*\(M=1 and M=4, measured [0-9.]+ and [0-9.]+ s: block_fixed [0-9.e+-]+ ms per block and micro-batch" ||
      fail "the calibration has no fixed cost fitted from the two data-parallel runs"
    for ref in "; reference pp 1 dp 4" "; group reference pp 1 dp 1 sp 1 tp 4(1d)" \
      "; group reference pp 1 dp 2 sp 1(megatron) tp 2(1d)" \
      "; grid reference pp 1 dp 1 sp 1 tp 4(2d)" "; ring reference pp 1 dp 1 sp 4(ring)"; do
      head -1 "$cal" | grep -qF "$ref" || fail "the calibration has no '$ref' run"
    done
    # Tensor 1d over 4 sets the group row of 4, the pairs' run the row of 2,
    # each where its wait is more than the small all-reduce's: each row is
    # at least its reference's figure.
    $PY - "$cal" <<'PY' || fail "the group sync rows or block_fixed are not the references' fits"
import re, sys, tomllib
text = open(sys.argv[1]).read()
waits = {int(g): float(us) * 1e-6 for g, us in
         re.findall(r"group reference [^;]* tp ([0-9]+)\(1d\)[^;]*, ([0-9.e+-]+) us per collective", text)}
rows = {r["group"]: r["seconds"] for r in tomllib.loads(text)["calibration"]["sync"]
        if r.get("pattern", "group") == "group"}
# The line prints the wait to 5 significant digits (1015.1 us for 1015.096).
assert set(waits) == {2, 4} and {2, 4} <= set(rows), (waits, rows)
assert all(rows[g] >= waits[g] * (1 - 1e-4) for g in (2, 4)), (waits, rows)
print(f"group waits {waits}; group rows {rows}")
# The last fit of the fixed cost (the data-parallel pair, fitted again after
# tensor 1d) is the file's block_fixed.
fixed = float(re.findall(r"block_fixed ([0-9.e+-]+) ms per block", text)[-1]) * 1e-3
got = tomllib.loads(text)["calibration"]["block_fixed"]
assert abs(got - fixed) <= 1e-6 * max(1.0, fixed) + 1e-9, (got, fixed)
print(f"block_fixed {got * 1e3:.2f} ms per block and micro-batch")
PY
    grep -q '^pattern = "grid"' "$cal" || fail "no grid sync row in the calibration"
    grep -q '^pattern = "ring"' "$cal" || fail "no ring sync row in the calibration"
    if [[ -n ${KOLOS_SHARED_CALIBRATION:-} ]]; then
      mkdir -p "$KOLOS_SHARED_CALIBRATION" && cp "$cal" "$KOLOS_SHARED_CALIBRATION/"
    fi
    grep -q "the best as a run: --set parallel.auto=false" plan.txt || fail "no best run printed"
    grep -q "Dropped" plan.txt || fail "no drop reasons printed"
    # Cached now: a second plan does not calibrate again, and agrees.
    timeout 300 "$KOLOS" plan gpt.toml -n 4 --json >plan.json 2>plan2.err ||
      { cat plan2.err; fail "kolos plan --json failed"; }
    ! grep -q calibrating plan2.err || fail "calibrated again with a cached calibration"
    plan_json plan.json >p.json
    $PY - p.json <<'PY' || fail "the JSON plans are not as expected"
import json, sys
r = json.load(open(sys.argv[1]))
plans = r["plans"]
top = r["top"]
assert 3 <= top <= 10 and top <= len(plans) <= top + 8, (top, len(plans))
# After the top, the best plan of each layout the top lacks, once each.
layouts = {p["layout"] for p in plans[:top]}
for p in plans[top:]:
    assert p["layout"] not in layouts, p
    layouts.add(p["layout"])
steps = [p["step_s"] for p in plans]
assert all(s > 0 for s in steps) and all(p["memory_bytes"] > 0 for p in plans), plans
assert steps[0] <= min(steps) * 1.011, steps   # best first, within the 1% tie
assert len({tuple(p["overrides"]) for p in plans}) == len(plans), "duplicate plans"
assert r["dropped"], "no drop reasons"
with open("runs.txt", "w") as out:
    for p in plans[:3]:
        out.write(" ".join("--set '" + o + "'" for o in p["overrides"]) + "\n")
PY
    # Every plan offered is a run kolos accepts.
    while read -r sets; do
      eval "timeout 120 \"$KOLOS\" check gpt.toml -n 4 $sets" >check.txt 2>&1 ||
        { cat check.txt; fail "kolos check refuses a plan it was offered: $sets"; }
      echo "accepted: $(head -1 check.txt)"
    done <runs.txt
    # A mode the config fixes (under auto, without a size) holds in every plan.
    timeout 120 "$KOLOS" plan gpt.toml -n 4 --json --set parallel.auto=true \
      --set parallel.tensor.mode=\"2d\" >fixed.json 2>&1 || { cat fixed.json; fail "a fixed mode failed"; }
    plan_json fixed.json | $PY -c '
import json, sys
plans = json.load(sys.stdin)["plans"]
assert plans and all("(2d)" in p["describe"] for p in plans), plans
' || fail "a plan without the fixed tensor mode was offered"
    # --predict: the config's own layout, no search.
    timeout 120 "$KOLOS" plan gpt.toml -n 4 --predict --json --set parallel.tensor.size=2 \
      --set train.micro_batch=4 >predict.json 2>&1 || { cat predict.json; fail "--predict failed"; }
    plan_json predict.json | $PY -c '
import json, sys
r = json.load(sys.stdin)
assert len(r["plans"]) == 1, r
p = r["plans"][0]
assert "tp 2(1d)" in p["describe"] and "dp 2" in p["describe"] and "mb 4" in p["describe"], p
' || fail "--predict did not describe the config's layout"
    # With the memory role on, the plans say its tier traffic is not predicted.
    timeout 120 "$KOLOS" plan gpt.toml -n 4 --predict --set memory.compute_budget=\"2MiB\" \
      >memory.txt 2>&1 || { cat memory.txt; fail "plan with [memory] failed"; }
    grep -q "the memory role (chunks) is on: its traffic .* is not in these predictions" \
      memory.txt || { cat memory.txt; fail "no note on the memory role's traffic"; }
    # A cluster file: 1024 GPUs, no calibration of this machine needed.
    rm -rf cache
    timeout 300 "$KOLOS" plan gpt.toml -n 1024 --set train.global_batch=1024 \
      --cluster "$KOLOS_SOURCE_DIR/examples/clusters/a100-80gb-ib.toml" >cluster.txt 2>&1 ||
      { cat cluster.txt; fail "planning for the cluster file failed"; }
    grep -q "a100" cluster.txt || fail "the cluster is not named"
    [[ ! -d cache ]] || fail "a cluster plan calibrated this machine"
    echo "ok: plans ranked, cached calibration reused, every plan accepted, cluster planned"
    ;;

  auto)
    # The finalists are tried first (bounded to 20 s here): the trained run
    # must still be exactly the chosen layout's, untouched by the trials.
    timeout 600 "$KOLOS" run -n 4 gpt.toml --set parallel.auto=true --set train.steps=4 \
      --set planner.tune_seconds=20 --set planner.tune_steps=3 \
      --set log.metrics=auto.jsonl >auto.txt 2>&1 || { cat auto.txt; fail "the auto run failed"; }
    cat auto.txt
    grep -q "kolos: parallel.auto: .* predicted .* s/step" auto.txt || fail "the plan was not printed"
    head -1 auto.jsonl | $PY -c '
import json, sys
h = json.load(sys.stdin)["header"]["plan"]
assert h["predicted_step_s"] > 0 and h["overrides"][0] == "parallel.auto=false", h
t = h["tuning"]
assert len(t["finalists"]) >= 3 and t["pick"] >= 0, t
assert t["finalists"][t["pick"]]["describe"] == h["describe"], (t, h["describe"])
open("sets.txt", "w").write(" ".join(h["overrides"]))
' || fail "the metrics file has no plan header"
    # The same layout set by hand trains the same losses.
    args=()
    for o in $(cat sets.txt); do args+=(--set "$o"); done
    timeout 600 "$KOLOS" run -n 4 gpt.toml "${args[@]}" --set train.steps=4 \
      --set log.metrics=hand.jsonl >hand.txt 2>&1 || { cat hand.txt; fail "the hand-set run failed"; }
    $PY - <<'PY' || fail "the auto run and the hand-set run differ"
import json
auto = [json.loads(l)["loss"] for l in open("auto.jsonl") if '"step"' in l]
hand = [json.loads(l)["loss"] for l in open("hand.jsonl") if '"step"' in l]
assert len(auto) == 4 and auto == hand, (auto, hand)
print("losses", auto)
PY
    echo "ok: the auto run chose, said and recorded its plan, and matches it set by hand"
    ;;

  predict)
    "$KOLOS_SOURCE_DIR/bench/run_planner_check.sh" --build "$(dirname "$(dirname "$KOLOS")")" \
      --plans small --steps 2 --warmup 1 --tune 0 --final 1 --out results >check.txt 2>&1 ||
      { cat check.txt; fail "the prediction check failed to run"; }
    cat check.txt
    grep -q "^plans measured: 4" check.txt || fail "not every plan was measured"
    grep -q "^Spearman rank correlation: " check.txt || fail "no correlation printed"
    grep -q "^chosen plan: " check.txt || fail "the chosen plan was not measured"
    [[ $(grep -c "(head to head, round 1)" check.txt) == 3 ]] ||
      fail "the choice and the two fastest other plans were not measured head to head"
    grep -q "^chosen plan: .*chosen/best [0-9.]* (head to head, 1 round; goal" check.txt ||
      fail "chosen/best was not taken from the head-to-head round"
    echo "ok: four plans predicted and measured, the choice head to head with the two fastest"
    ;;

  refusals)
    # The calibration every case below would otherwise start: not needed for refusals.
    expect_failure "parallel.tensor.size = 3: parallel.auto = true finds no plan" -- \
      "$KOLOS" plan gpt.toml -n 4 --cluster "$KOLOS_SOURCE_DIR/examples/clusters/a100-80gb-ib.toml" \
      --set parallel.tensor.size=3
    expect_failure "model.name = \"llama\": the planner's cost model describes GPT only" -- \
      "$KOLOS" run -n 2 gpt.toml --set parallel.auto=true --set model.name=\"llama\"
    sed '/^peak_flops/d' "$KOLOS_SOURCE_DIR/examples/clusters/a100-80gb-ib.toml" >bad-cluster.toml
    expect_failure "bad-cluster.toml:[0-9]+: \[cluster\] has no .peak_flops." -- \
      "$KOLOS" plan gpt.toml -n 8 --cluster bad-cluster.toml
    expect_failure "no plan fits: .memory: exceeds device memory. removed the last" -- \
      "$KOLOS" plan gpt.toml -n 8 --cluster "$KOLOS_SOURCE_DIR/examples/clusters/a100-80gb-ib.toml" \
      --set model.layers=4096 --set model.hidden=16384 --set model.heads=128
    expect_failure "unknown key .planner.clustr.; valid keys in \[planner\] \(planner plugin .autoplan.\): cluster, calibration, top" -- \
      "$KOLOS" check gpt.toml -n 2 --set planner.clustr=\"x.toml\"
    expect_failure "parallel.auto = true on 2 hosts needs a cluster file" -- \
      env KOLOS_SIMULATED_HOSTS=a,a,b,b "$KOLOS" run -n 4 gpt.toml --set parallel.auto=true
    # An engine handed an unresolved plan refuses it (a library user's mistake).
    [[ ! -d cache ]] || fail "a refusal calibrated this machine"
    echo "ok: every refusal clear"
    ;;

  tune)
    # Finalists on 2 ranks, from a test-only calibration whose feedback row
    # is deliberately wrong for one family (tensor 1d: a ratio of 0.05, 0.47
    # of the model's time once weighed against it),
    # so the planner predicts a tp 2(1d) plan far ahead. No calibration runs
    # and no timing is asserted: KOLOS_TEST_TUNE_STEP_S gives each finalist
    # its "measured" step (tune.h): tensor 1d the slowest (0.2 s), plain
    # data parallelism the fastest (0.005 s), every other 0.012 s (about
    # what the model predicts for them).
    cat >tiny.toml <<'TOML'
[model]
layers = 2
hidden = 64
heads = 4
seq_len = 32
vocab = 128
[data]
kind = "synthetic"
[train]
global_batch = 8
micro_batch = 4
recompute = "none"
steps = 2
[parallel.zero]
stage = 0
[log]
progress = "off"
TOML
    cal=$KOLOS_SOURCE_DIR/tests/e2e/planner/tune-calibration.toml
    # The hooks live only in the test copy of libkolos_tune (lib/faults of
    # the build tree); preloaded, it replaces the library kolos links
    # (same soname), in the launcher, mpirun and every rank.
    hooks=$KOLOS_FAULT_LIB_DIR/libkolos_tune.so
    [[ -f $hooks ]] || fail "no test copy of the tune library at $hooks"
    export KOLOS_TEST_TUNE_STEP_S="tp 2(1d)=0.2;dp 2 sp 1 tp 1=0.005;zero=0.012"
    cp "$cal" cal.toml
    timeout 300 env LD_PRELOAD="$hooks" "$KOLOS" run -n 2 tiny.toml --set parallel.auto=true --set planner.calibration=\"cal.toml\" \
      --set planner.top=6 --set log.metrics=auto.jsonl >auto.txt 2>&1 || { cat auto.txt; fail "the auto run failed"; }
    cat auto.txt
    grep -q "kolos: parallel.auto: [0-9]* finalists, the best 3 prediction(s) and every plan within 2 combined standard deviations" auto.txt ||
      fail "the finalists were not announced"
    grep -Eq "kolos: parallel.auto: picked #[0-9]+, the fastest measured: .* tuning took [0-9.]+ s \(bound 45 s\)" auto.txt ||
      fail "the pick and the tuning time were not printed"
    head -1 auto.jsonl | $PY -c '
import json, sys
h = json.load(sys.stdin)["header"]["plan"]
t = h["tuning"]
f = t["finalists"]
assert len(f) >= 3, f
wrong = "tp=1d sp=none zero=0 pp=none"
assert f[0]["family"] == wrong, f[0]            # the model predicts the wrong family best
measured = [x for x in f if not x["skipped"]]
assert len(measured) == len(f), f               # every finalist ran
assert all(x["passes"] == 1 for x in f), f      # none within 10% of the fastest: one pass each
fastest = min(measured, key=lambda x: x["measured_step_s"])
assert f[t["pick"]] is fastest or f[t["pick"]] == fastest, (t["pick"], fastest)
assert fastest["family"] != wrong and fastest["measured_step_s"] == 0.005, fastest
assert h["describe"] == fastest["describe"], (h["describe"], fastest)   # and trains it
assert 0 < t["seconds"] <= t["bound_s"] + 60, t
open("pick.txt", "w").write(fastest["describe"])
' || fail "the auto run did not train the fastest measured finalist"
    # The measured/predicted ratios are in the calibration now, per family,
    # and the next plan on this host ranks the measured fastest first.
    grep -A1 'family = "tp=1d sp=none zero=0 pp=none"' cal.toml | grep -q "ratios = \[0.05, " ||
      { cat cal.toml; fail "the wrong family's measured ratio was not recorded"; }
    grep -q 'family = "tp=none sp=none zero=0 pp=none"' cal.toml || fail "the pick's ratio was not recorded"
    timeout 120 "$KOLOS" plan tiny.toml -n 2 --calibration cal.toml --json >after.json 2>&1 ||
      { cat after.json; fail "kolos plan after the feedback failed"; }
    plan_json after.json | $PY -c '
import json, sys
plans = json.load(sys.stdin)["plans"]
pick = open("pick.txt").read()
assert plans[0]["describe"] == pick, (plans[0], pick)
assert plans[0]["family"] != "tp=1d sp=none zero=0 pp=none", plans[0]
assert plans[0]["model_step_s"] > 0 and plans[0]["uncertainty"] > 0, plans[0]
' || fail "the feedback did not change the next prediction"
    # kolos plan --tune: a finalist whose set-up fails on one rank (rank 1)
    # is skipped on both, with its reason; the others run.
    cp "$cal" cal.toml
    KOLOS_TEST_TUNE_FAIL="sp 1 tp 2(1d)" timeout 300 env LD_PRELOAD="$hooks" "$KOLOS" plan tiny.toml -n 2 --calibration cal.toml \
      --set planner.top=4 --tune 3 --json >skip.json 2>skip.err || { cat skip.json skip.err; fail "plan --tune with a failing finalist failed"; }
    plan_json skip.json | $PY -c '
import json, sys
r = json.load(sys.stdin)
f = r["tuning"]["finalists"]
assert "injected set-up failure on rank 1" in f[0]["skipped"], f[0]
assert all(not x["skipped"] for x in f[1:]) and len(f) >= 3, f
assert r["chosen"]["describe"] == f[r["tuning"]["pick"]]["describe"] != f[0]["describe"], r["chosen"]
' || fail "the failing finalist was not skipped by every rank"
    # Finalists within 10% of the fastest run a second time and keep the
    # faster figure: every finalist here measures 0.005 or 0.0052 s.
    cp "$cal" cal.toml
    KOLOS_TEST_TUNE_STEP_S="dp 2 sp 1 tp 1=0.005;pp=0.0052" timeout 300 env LD_PRELOAD="$hooks" "$KOLOS" plan tiny.toml -n 2 \
      --calibration cal.toml --set planner.top=4 --tune 3 >close.txt 2>&1 || { cat close.txt; fail "plan --tune with close finalists failed"; }
    cat close.txt
    $PY - close.txt <<'PY' || fail "close finalists were not measured twice"
import re, sys
rows = [l for l in open(sys.argv[1]) if re.match(r"kolos: plan --tune: [ *] \d+ ", l)]
assert len(rows) >= 3, rows
assert all(l.split()[-1] == "2" for l in rows), rows   # the passes column
assert any("*" in l.split(":")[2][:3] and "dp 2 sp 1 tp 1" in l for l in rows), rows
PY
    grep -q "those within 10% of the fastest run again, in reverse order" close.txt ||
      fail "the second pass was not announced"
    # The second pass's share of the bound: each finalist run counts 1 s on
    # the tuning's clock (KOLOS_TEST_TUNE_WALL_S) and the bound is 6 s. The
    # first pass stops at 75% of it (4 finalists), the close ones run again
    # in reverse order while the bound allows (the 4th and 3rd), and none is
    # left for the 2 finalists the first pass left.
    cp "$cal" cal.toml
    KOLOS_TEST_TUNE_WALL_S=1 KOLOS_TEST_TUNE_STEP_S="dp 2 sp 1 tp 1=0.005;pp=0.0052" timeout 300 env LD_PRELOAD="$hooks" \
      "$KOLOS" plan tiny.toml -n 2 --calibration cal.toml --set planner.top=4 --set planner.tune_seconds=6 --tune 3 --json \
      >share.json 2>share.err || { cat share.json share.err; fail "plan --tune with a share of the bound failed"; }
    plan_json share.json | $PY -c '
import json, sys
t = json.load(sys.stdin)["tuning"]
f = t["finalists"]
assert len(f) == 6, f
assert [x["passes"] for x in f] == [1, 1, 2, 2, 0, 0], [(x["describe"], x["passes"]) for x in f]
assert all("not tried: the tuning" in x["skipped"] for x in f[4:]), f[4:]
assert f[t["pick"]]["measured_step_s"] == 0.005, f[t["pick"]]
' || fail "the first pass did not leave the second its share of the bound"
    # The time bound: with 1 ms only the best prediction is tried.
    cp "$cal" cal.toml
    timeout 300 "$KOLOS" plan tiny.toml -n 2 --calibration cal.toml --set planner.top=4 \
      --set planner.tune_seconds=0.001 --tune 3 >bound.txt 2>&1 || { cat bound.txt; fail "plan --tune with a bound failed"; }
    cat bound.txt
    grep -q "not tried: the tuning's time bound (0.001 s, planner.tune_seconds)" bound.txt ||
      fail "finalists past the bound were not reported"
    grep -Eq "picked #1, the fastest measured: .*tuning took [0-9.]+ s \(bound 0.001 s\)" bound.txt ||
      fail "the bound's pick was not the best prediction"
    # Bad input: clear errors before anything runs.
    expect_failure 'kolos plan: --tune "0": expected the number of finalists, a whole number >= 1' -- \
      "$KOLOS" plan tiny.toml -n 2 --calibration cal.toml --tune 0
    expect_failure 'kolos plan: --tune "three": expected the number of finalists' -- \
      "$KOLOS" plan tiny.toml -n 2 --calibration cal.toml --tune three
    expect_failure 'kolos plan: --tune "3": --predict has no plans to try' -- \
      "$KOLOS" plan tiny.toml -n 2 --calibration cal.toml --tune 3 --predict
    expect_failure 'kolos plan: --tune runs the finalists on this machine; a cluster file' -- \
      "$KOLOS" plan tiny.toml -n 1024 --set train.global_batch=1024 --tune 3 \
      --cluster "$KOLOS_SOURCE_DIR/examples/clusters/a100-80gb-ib.toml"
    expect_failure 'planner.tune.*-1 is out of range; it must be 0 \(train the best prediction untried\) to planner.top = 10' -- \
      "$KOLOS" check tiny.toml -n 2 --set planner.tune=-1
    expect_failure 'planner.tune_steps.*2 is out of range; it must be 3 to 1000' -- \
      "$KOLOS" check tiny.toml -n 2 --set planner.tune_steps=2
    expect_failure 'planner.tune_seconds.*has no effect with planner.tune = 0' -- \
      "$KOLOS" check tiny.toml -n 2 --set planner.tune=0 --set planner.tune_seconds=10
    echo "ok: the tuner trains the fastest measured finalist, skips a failing one on every rank, keeps its bound, and feeds back"
    ;;

  *) fail "unknown case $case_name" ;;
esac
