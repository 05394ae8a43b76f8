#!/usr/bin/env python3
"""The planner check's statistics again, under other uses of the feedback.

    bench/planner/feedback_rules.py RUN_DIR [RUN_DIR ...]

RUN_DIR is the --out directory of one `bench/run_planner_check.sh
--recalibrate` run: its summary.json, predict-N.json and plan.json (the
tuning's finalists, predicted and measured). With a fresh calibration the
tuning ran without feedback, so each finalist's ratio measured / model is
its measured step over its prediction. Each plan's prediction is rebuilt
from its `model_step_s` (the model before feedback) times a factor from
those ratios, as each rule sets it, and compared with the same measured
steps:

  none       no feedback: the calibration's model alone
  family     a family's own ratios, their geometric mean, taken whole (the
             feedback before ratios were recorded over their median)
  median     the ratios over the tuning's median first (what a tuning
             records now, docs/planner.md "Finalists")
  relatives  `family`, and a family without ratios takes those of the
             families with its tensor and sequence modes, the calibration's
             reference families counting as a ratio of 1 among them and
             keeping the model themselves (a rule tried and not kept)
  weighed    `median`, the factor raised to n / (n + 3) for a family with
             n ratios (what later predictions use now, tune.h
             kFeedbackPrior)

Then, per rule, in how many runs Spearman reached 0.85 and the median
error came within 5% (the check's goals), and in how many the median
error would with each run's predictions scaled by the median of its
measured / predicted ratios (the calibration's level set right, the
model's shape as it is). Last, for the rule in use (weighed), each plan's
signed error over the runs: its median and range.

Nothing runs: the figures come from the files alone, so every rule is
judged on the same measurements.
"""
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check import median_error  # noqa: E402

PRIOR = 3.0  # tune.h kFeedbackPrior
RULES = ("none", "family", "median", "relatives", "weighed")
REFERENCES = ["tp=none sp=none zero=0 pp=none", "tp=2d sp=none zero=0 pp=none",
              "tp=none sp=ring zero=0 pp=none"]


def spearman(x, y):
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0] * len(v)
        for k, i in enumerate(order):
            r[i] = k
        return r
    a, b = ranks(x), ranks(y)
    n = len(x)
    return 1 - 6 * sum((p - q) ** 2 for p, q in zip(a, b)) / (n * (n * n - 1))


def feedback(run):
    """The tuning's ratios measured / predicted, by family, in its order."""
    text = open(os.path.join(run, "plan.json")).read()
    report = json.loads([l for l in text.splitlines() if l.startswith("{")][-1])
    out = {}
    for f in (report.get("tuning") or {}).get("finalists", []):
        if f["skipped"] or not f["measured_step_s"] > 0:
            continue
        out.setdefault(f["family"], []).append(f["measured_step_s"] / f["predicted_step_s"])
    return out


def modes(family):
    return tuple(family.split()[:2])


def geometric_mean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def factor(rule, family, fb):
    if rule == "none":
        return 1.0
    if rule in ("median", "weighed") and fb:
        all_ratios = sorted(x for r in fb.values() for x in r)
        n = len(all_ratios)
        mid = all_ratios[n // 2] if n % 2 else math.sqrt(all_ratios[n // 2 - 1] * all_ratios[n // 2])
        fb = {f: [x / mid for x in r] for f, r in fb.items()}
    if family in fb:
        if rule == "weighed":
            n = len(fb[family])
            return geometric_mean(fb[family]) ** (n / (n + PRIOR))
        return geometric_mean(fb[family])
    if rule != "relatives" or family in REFERENCES:
        return 1.0
    ratios = [x for f, r in fb.items() if modes(f) == modes(family) for x in r]
    if not ratios:
        return 1.0
    ratios += [1.0 for f in REFERENCES if modes(f) == modes(family)]
    return geometric_mean(ratios)


def main():
    args = sys.argv[1:]
    if not args:
        raise SystemExit(__doc__)
    print("| run | rule | Spearman | median error |")
    print("|---|---|---:|---:|")
    goals = {rule: [0, 0, 0] for rule in RULES}
    signed = {}
    for run in args:
        summary = json.load(open(os.path.join(run, "summary.json")))
        rows = summary["rows"]
        plans = []
        for i in range(len(rows)):
            text = open(os.path.join(run, f"predict-{i}.json")).read().strip().splitlines()[-1]
            plans.append(json.loads(text)["plans"][0])
        measured = [r["measured"] for r in rows]
        fb = feedback(run)
        for rule in RULES:
            predicted = [p["model_step_s"] * factor(rule, p["family"], fb) for p in plans]
            rho, error = spearman(predicted, measured), median_error(predicted, measured)
            level = math.exp(statistics.median(math.log(m / p) for p, m in zip(predicted, measured)))
            fitted = median_error([p * level for p in predicted], measured)
            goals[rule][0] += rho >= 0.85
            goals[rule][1] += error <= 0.05
            goals[rule][2] += fitted <= 0.05
            if rule == "weighed":
                for r, p, m in zip(rows, predicted, measured):
                    signed.setdefault(r["plan"], []).append(p / m - 1)
            print(f"| {run} | {rule} | {rho:.3f} | {100 * error:.1f}% |")
    print()
    for rule in RULES:
        print(f"{rule}: Spearman >= 0.85 in {goals[rule][0]} of {len(args)} runs, "
              f"median error <= 5% in {goals[rule][1]}, with the level fitted in {goals[rule][2]}")
    print()
    print("| plan (weighed) | runs | median signed error | range |")
    print("|---|---:|---:|---|")
    for plan, errors in signed.items():
        print(f"| {plan} | {len(errors)} | {100 * statistics.median(errors):+.1f}% | "
              f"{100 * min(errors):+.0f}% to {100 * max(errors):+.0f}% |")


if __name__ == "__main__":
    main()
