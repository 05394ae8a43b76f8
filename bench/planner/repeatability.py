#!/usr/bin/env python3
"""How well the planner check's measurements agree with themselves.

    bench/planner/repeatability.py RUN_DIR [RUN_DIR ...]

RUN_DIR is the --out directory of one `bench/run_planner_check.sh` run
(its summary.json: each plan's measured step per pass and the fastest).
The check scores a prediction against measured step times; this scores
measured step times against measured step times, by the same statistics,
so that the check's goals can be read against what the machine itself
repeats:

  within a run  each pair of passes (--rounds 2 or more): Spearman's rank
                correlation of the plans' step times, and the median
                absolute relative difference after one pass is scaled to
                the other's median (how far the plans move against each
                other, not the machine's speed);
  across runs   each pair of runs with the same plans, their fastest
                passes as the check reports them: one run taken as the
                prediction of the other, Spearman and the median absolute
                relative error as check.py computes them, as they are and
                with the first scaled to the second's median.

"Across runs" is what a planner that predicted every plan exactly as
another check measured it would score: Spearman and the level-scaled
error are the best any cost model can expect here, and the unscaled error
adds how far the machine's speed moved between the two. Last, each run
against the geometric mean of all the others: a prediction that knows
each plan's usual step time on this machine, not the run's. Nothing
runs.
"""
import itertools
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check import median_error, spearman  # noqa: E402


def scaled(xs, to):
    k = statistics.median(to) / statistics.median(xs)
    return [x * k for x in xs]


def describe(values, unit=""):
    values = sorted(values)
    digits = 1 if unit else 3
    return (f"median {statistics.median(values):.{digits}f}{unit}, range "
            f"{values[0]:.{digits}f}{unit}-{values[-1]:.{digits}f}{unit}")


def main():
    runs = sys.argv[1:]
    if not runs:
        raise SystemExit(__doc__)
    rows = {}
    for run in runs:
        path = os.path.join(run, "summary.json")
        if not os.path.isfile(path):
            raise SystemExit(f"repeatability.py: {run}: no summary.json (not a check's --out directory)")
        rows[run] = json.load(open(path))["rows"]

    print("| run | passes | Spearman, pass against pass | median difference, level-scaled |")
    print("|---|---:|---|---|")
    for run, r in rows.items():
        passes = len(r[0]["passes"])
        if passes < 2:
            print(f"| {run} | 1 | - | - |")
            continue
        rhos, diffs = [], []
        for i, j in itertools.combinations(range(passes), 2):
            a, b = [p["passes"][i] for p in r], [p["passes"][j] for p in r]
            rhos.append(spearman(a, b))
            diffs.append(median_error(scaled(a, b), b))
        print(f"| {run} | {passes} | {' '.join(f'{x:.3f}' for x in rhos)} | "
              f"{' '.join(f'{100 * x:.1f}%' for x in diffs)} |")

    rhos, errors, raw = [], [], []
    for a, b in itertools.permutations(rows, 2):
        if [p["plan"] for p in rows[a]] != [p["plan"] for p in rows[b]]:
            continue
        ma, mb = [p["measured"] for p in rows[a]], [p["measured"] for p in rows[b]]
        rhos.append(spearman(ma, mb))
        errors.append(median_error(scaled(ma, mb), mb))
        raw.append(median_error(ma, mb))
    print()
    if not rhos:
        print("across runs: no two runs measured the same plans")
        return
    print(f"across runs, one run's measured steps as the other's prediction ({len(rhos)} ordered pairs):")
    print(f"  Spearman: {describe(rhos)}; >= 0.85 in {sum(x >= 0.85 for x in rhos)} of {len(rhos)}")
    print(f"  median error, level-scaled: {describe([100 * x for x in errors], '%')}; "
          f"<= 5% in {sum(x <= 0.05 for x in errors)} of {len(errors)}")
    print(f"  median error, as measured: {describe([100 * x for x in raw], '%')}; "
          f"<= 5% in {sum(x <= 0.05 for x in raw)} of {len(raw)}")

    # Each run against the geometric mean of the others with its plans:
    # a prediction that knows every plan's usual step here, not this run's.
    print()
    print("each run against the geometric mean of the other runs' measured steps:")
    print("| run | Spearman | median error, level-scaled | median error, as measured |")
    print("|---|---:|---:|---:|")
    passing = 0
    for run, r in rows.items():
        plans = [p["plan"] for p in r]
        others = [o for o in rows if o != run and [p["plan"] for p in rows[o]] == plans]
        if not others:
            continue
        mean = [statistics.geometric_mean([rows[o][i]["measured"] for o in others])
                for i in range(len(plans))]
        measured = [p["measured"] for p in r]
        rho, level, raw_error = (spearman(mean, measured), median_error(scaled(mean, measured), measured),
                                 median_error(mean, measured))
        passing += rho >= 0.85 and raw_error <= 0.05
        print(f"| {run} | {rho:.3f} | {100 * level:.1f}% | {100 * raw_error:.1f}% |")
    print(f"Spearman >= 0.85 and median error <= 5% (as measured) together: {passing} of {len(rows)} runs")


if __name__ == "__main__":
    main()
