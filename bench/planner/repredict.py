#!/usr/bin/env python3
"""Saved planner checks judged again with another calibration.

    bench/planner/repredict.py [--kolos build/bin/kolos] [--no-feedback]
                               [--group-sync G=SECONDS ...] [--rate KEY=VALUE ...]
                               [--plan TEXT ...] CALIBRATION RUN_DIR [RUN_DIR ...]
    bench/planner/repredict.py --saved [--plan TEXT ...] RUN_DIR [RUN_DIR ...]

CALIBRATION is a calibration file (a `KOLOS_CACHE_DIR/calibration/HOST-n4.toml`
of `kolos calibrate`); RUN_DIR is the --out directory of one
`bench/run_planner_check.sh` run (its summary.json: each plan's overrides
and measured step). Every plan of the first run is predicted from a copy
of CALIBRATION (`kolos plan --predict --json`), and each run's measurements
are compared with those predictions relative to the data-parallel reference
plan's (dp 4, micro-batch 4), prediction against prediction and measurement
against measurement: how fast the machine ran at each run's calibration
drops out, and what is left is how well the calibration's model ranks and
spaces the plans. Printed per run: the median of |predicted relative /
measured relative - 1|, Spearman's rank correlation, the level (the
median of predicted / measured over the plans, a geometric median) and
the check's median error with the predictions divided by that level.

--group-sync G=SECONDS replaces the copy's `[[calibration.sync]]` row of
pattern "group" and group G (repeatable): the same model with another
collective wait, on the same measurements; --rate KEY=VALUE replaces a
number of its [calibration] table (block_fixed, step_factor, ...).
--no-feedback drops the copy's `[[calibration.feedback]]` rows (what the
calibration's own check tuned into it): the model as calibrated.
--plan TEXT (repeatable) also prints, for each plan whose name contains
TEXT, its signed relative error in every run (predicted relative to dp 4
over measured relative to dp 4, less 1).
--saved judges each run's own predictions, as its check saved them (the
model and calibration of that run), instead of predicting again.
"""
import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

from check import median_error, spearman  # the check's own statistics, ties ranked alike

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
REFERENCE = "pp 1 dp 4 sp 1 tp 1 M=1 mb 4 zero0 none"


def with_group_sync(text, group, seconds):
    pattern = re.compile(r'(pattern = "group"\ngroup = %d\nseconds = )[0-9.eE+-]+' % group)
    if not pattern.search(text):
        raise SystemExit(f"repredict.py: the calibration has no group sync row for group {group}")
    return pattern.sub(lambda m: m.group(1) + repr(seconds), text)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kolos", default=os.path.join(ROOT, "build", "bin", "kolos"))
    p.add_argument("--config", default=os.path.join(HERE, "gpt-check.toml"))
    p.add_argument("--group-sync", action="append", default=[], metavar="G=SECONDS")
    p.add_argument("--rate", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--no-feedback", action="store_true")
    p.add_argument("--plan", action="append", default=[], metavar="TEXT")
    p.add_argument("--saved", action="store_true")
    p.add_argument("paths", nargs="+", metavar="CALIBRATION RUN_DIR")
    a = p.parse_args()
    if a.saved:
        a.runs = a.paths
        runs = [json.load(open(os.path.join(r, "summary.json")))["rows"] for r in a.runs]
        report(a, runs, [{r["plan"]: r["predicted"] for r in rows} for rows in runs])
        return 0
    if len(a.paths) < 2:
        p.error("a calibration and at least one run directory (or --saved and run directories)")
    a.calibration, a.runs = a.paths[0], a.paths[1:]
    text = open(a.calibration).read()
    for item in a.group_sync:
        group, _, seconds = item.partition("=")
        text = with_group_sync(text, int(group), float(seconds))
    for item in a.rate:
        key, _, value = item.partition("=")
        pattern = re.compile(r"^(%s = )\S+$" % re.escape(key), re.M)
        if not pattern.search(text):
            raise SystemExit(f"repredict.py: the calibration has no '{key}' number")
        text = pattern.sub(lambda m: m.group(1) + repr(float(value)), text, count=1)
    if a.no_feedback:
        text = re.sub(r'\[\[calibration\.feedback\]\]\nfamily = "[^"]*"\nratios = \[[^]]*\]\n*', "", text)
    runs = [json.load(open(os.path.join(r, "summary.json")))["rows"] for r in a.runs]
    cache = tempfile.mkdtemp(prefix="repredict.")
    try:
        os.makedirs(os.path.join(cache, "calibration"))
        with open(os.path.join(cache, "calibration", os.path.basename(a.calibration)), "w") as f:
            f.write(text)
        env = dict(os.environ, KOLOS_CACHE_DIR=cache)
        predicted = {}
        for row in runs[0]:
            cmd = [a.kolos, "plan", a.config, "-n", "4", "--predict", "--json"]
            for o in row["overrides"]:
                cmd += ["--set", o]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"repredict.py: {' '.join(cmd)} failed:\n{out.stderr}")
            plan = json.loads(out.stdout.strip().splitlines()[-1])["plans"][0]
            predicted[row["plan"]] = plan["step_s"]
    finally:
        shutil.rmtree(cache)
    report(a, runs, [predicted] * len(runs))
    return 0


def relative_error(predicted, measured, plan):
    """Plan's prediction relative to dp 4's over its measurement relative to dp 4's, less 1."""
    return predicted[plan] / predicted[REFERENCE] / (measured[plan] / measured[REFERENCE]) - 1


def report(a, runs, predictions):
    """The statistics of each run's measurements against its predictions."""
    for name, predicted in zip(a.runs, predictions):
        if REFERENCE not in predicted:
            raise SystemExit(f"repredict.py: {name} has no '{REFERENCE}' plan")
    print("| run | plans | median relative error | Spearman | level | median error, level-scaled |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, rows, predicted in zip(a.runs, runs, predictions):
        measured = {r["plan"]: r["measured"] for r in rows if r["plan"] in predicted}
        plans = sorted(measured)
        errors = [abs(relative_error(predicted, measured, k)) for k in plans]
        p, m = [predicted[k] for k in plans], [measured[k] for k in plans]
        rho = spearman(p, m)
        level = math.exp(statistics.median(math.log(x / y) for x, y in zip(p, m)))
        scaled = median_error([x / level for x in p], m)
        print(f"| {name} | {len(plans)} | {100 * statistics.median(errors):.1f}% | {rho:.3f} "
              f"| {level:.3f} | {100 * scaled:.1f}% |")
    shown = sorted({k for predicted in predictions for k in predicted if any(t in k for t in a.plan)})
    if shown:
        print()
        print("| plan | " + " | ".join(a.runs) + " |")
        print("|---|" + "---:|" * len(a.runs))
        for k in shown:
            cells = []
            for rows, predicted in zip(runs, predictions):
                measured = {r["plan"]: r["measured"] for r in rows}
                if k not in measured or k not in predicted or REFERENCE not in measured:
                    cells.append("")
                    continue
                cells.append(f"{100 * relative_error(predicted, measured, k):+.0f}%")
            print(f"| {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
