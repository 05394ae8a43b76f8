#!/usr/bin/env python3
"""Fails when a torch-free target includes anything from LibTorch.

    torch_free_includes.py BUILD_DIR SOURCE_DIR

The torch-free targets are those marked with kolos_torch_free()
(cmake/KolosTorchFree.cmake), listed by configure in
BUILD_DIR/torch_free_targets.txt. Every translation unit of theirs in
BUILD_DIR/compile_commands.json is run through the preprocessor with its
own compile command plus -M -MG: -M lists every header the unit includes,
directly or through another header, and -MG lists a header that cannot be
found by the name it was included as instead of stopping. A header under
c10/, ATen/ or torch/ therefore shows up whether or not LibTorch's headers
are installed where the compiler looks, and fails the test, with the
project's own headers that include it.

First the checker proves on this machine that it catches such an include
(a scratch unit whose header includes <c10/core/ScalarType.h>); a checker
that could not fail would pass any tree.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

BANNED = re.compile(r"(^|/)(c10|ATen|torch)/")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]((?:c10|ATen|torch)/[^>"]+)[>"]', re.M)


def preprocess_args(args, source):
    """The compile command turned into a dependency listing."""
    out = []
    i = 0
    # A compiler launcher (ccache) first: drop it.
    if os.path.basename(args[0]).startswith("ccache"):
        args = args[1:]
    while i < len(args):
        a = args[i]
        if a in ("-o", "-MF", "-MT", "-MQ"):
            i += 2
            continue
        if a in ("-c", "-MD", "-MMD", "-Winvalid-pch") or a.startswith("-fpch"):
            i += 1
            continue
        if a == "-include" and i + 1 < len(args) and "cmake_pch" in args[i + 1]:
            i += 2
            continue
        out.append(a)
        i += 1
    return out + ["-M", "-MG"]


def dependencies(entry):
    """Every header the unit includes (paths, or the bare name of a missing one)."""
    args = entry.get("arguments") or shlex.split(entry["command"])
    cmd = preprocess_args(args, entry["file"])
    run = subprocess.run(cmd, cwd=entry["directory"], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{entry['file']}: the preprocessor failed:\n{run.stderr[-4000:]}")
    text = run.stdout.replace("\\\n", " ")
    deps = text.split(":", 1)[1].split() if ":" in text else []
    return [d for d in deps if d != entry["file"]]


def violations(entry, source_dir, build_dir):
    """(header, [project headers that include LibTorch]) for each banned header."""
    deps = dependencies(entry)
    own = lambda p: os.path.isabs(p) and (p.startswith(source_dir + "/") or p.startswith(build_dir + "/"))
    found = []
    for d in deps:
        # The project's own files are named by their place in the tree, which
        # may itself sit under a folder called torch/: judge only the rest.
        if own(d) or not BANNED.search(d):
            continue
        found.append(d)
    if not found:
        return []
    culprits = []
    for d in [entry["file"]] + deps:
        path = d if os.path.isabs(d) else os.path.join(entry["directory"], d)
        if not (own(path) or path == entry["file"]) or not os.path.isfile(path):
            continue
        with open(path, errors="replace") as f:
            names = INCLUDE.findall(f.read())
        if names:
            culprits.append(f"{os.path.relpath(path, source_dir)} includes {', '.join(sorted(set(names)))}")
    return [(found[0] if len(found) == 1 else f"{found[0]} (and {len(found) - 1} more)", culprits)]


def target_of(entry):
    out = entry.get("output")
    if not out:
        args = entry.get("arguments") or shlex.split(entry["command"])
        out = args[args.index("-o") + 1] if "-o" in args else ""
    m = re.search(r"CMakeFiles/([^/]+)\.dir/", out)
    return m.group(1) if m else None


def self_test(compiler):
    """The checker must catch a torch-free header that includes c10."""
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "table.h"), "w") as f:
            f.write("#pragma once\n#include <c10/core/ScalarType.h>\n")
        unit = os.path.join(tmp, "unit.cpp")
        with open(unit, "w") as f:
            f.write('#include "table.h"\nint main() { return 0; }\n')
        entry = {"directory": tmp, "file": unit,
                 "arguments": [compiler, "-std=c++17", "-c", unit, "-o", "unit.o"]}
        found = violations(entry, tmp, tmp)
        if not found or not any("table.h includes c10/core/ScalarType.h" in c for c in found[0][1]):
            print(f"FAIL: the checker missed a header that includes c10/ (got {found})")
            return False
    print("ok: the checker catches a header that includes <c10/core/ScalarType.h>")
    return True


def main():
    build_dir, source_dir = (os.path.realpath(p) for p in sys.argv[1:3])
    with open(os.path.join(build_dir, "torch_free_targets.txt")) as f:
        targets = [t for t in f.read().strip().split(";") if t]
    with open(os.path.join(build_dir, "compile_commands.json")) as f:
        entries = json.load(f)
    cxx = [e for e in entries if e["file"].endswith((".cpp", ".cc", ".cxx"))]
    if not targets or not cxx:
        print("FAIL: no torch-free targets or no compile commands to check")
        return 1
    compiler = shlex.split(cxx[0]["command"])[0] if "command" in cxx[0] else cxx[0]["arguments"][0]
    if os.path.basename(compiler).startswith("ccache"):
        compiler = (shlex.split(cxx[0]["command"]) if "command" in cxx[0] else cxx[0]["arguments"])[1]
    if not self_test(compiler):
        return 1
    failed = 0
    for target in targets:
        units = [e for e in cxx if target_of(e) == target]
        if not units:
            print(f"FAIL: {target}: marked torch-free but has no C++ unit in compile_commands.json")
            failed += 1
            continue
        bad = 0
        for e in units:
            for header, culprits in violations(e, source_dir, build_dir):
                bad += 1
                where = "; ".join(culprits) or "no project header names it directly"
                print(f"FAIL: {target}: {os.path.relpath(e['file'], source_dir)} includes {header} ({where})")
        print(f"{'ok' if not bad else 'FAIL'}: {target}: {len(units)} unit(s)"
              f"{'' if not bad else f', {bad} including LibTorch'}")
        failed += bad
    if failed:
        print(f"FAIL: {failed} problem(s): a torch-free library must not include c10/, ATen/ or torch/ "
              "headers (docs/building.md, \"Torch-free libraries\")")
        return 1
    print(f"PASS: {len(targets)} torch-free targets include nothing from LibTorch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
