#!/usr/bin/env python3
"""Lints docker/Dockerfile (no Docker engine runs here, so it cannot be built).

    lint_dockerfile.py REPO_ROOT [DOCKERFILE]     (default: REPO_ROOT/docker/Dockerfile)

Checks, each printed as it fails:
  - every instruction is a Dockerfile instruction; CMD/ENTRYPOINT in JSON form;
  - every FROM is Debian 12 with a pinned tag (no `latest`, no bare name);
  - multi-stage: the final stage copies only the install tree from the build
    stage (no COPY of sources, no ADD) and the build stage runs
    scripts/install-deps.sh, the README's install script;
  - apt-get: `update` and `install` in the same RUN, --no-install-recommends,
    the package lists removed in the same RUN;
  - COPY sources exist in the context (the repository root) and are not
    excluded by .dockerignore; build directories are excluded;
  - each RUN's shell passes shellcheck (when shellcheck is installed: it is
    in scripts/install-deps.sh, so a missing one is a failure);
  - the image agrees with what uses it: the version label is the project's
    version, which is the tag k8s/base sets; the paths the MPIJob runs
    (/opt/kolos/bin/kolos, /usr/sbin/sshd) are what the image installs.
Exits 1 when anything failed.
"""
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys

INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
                "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}


def instructions(text):
    """(line number, INSTRUCTION, arguments) with continuations joined."""
    out, buffer, start = [], "", 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not buffer and (not stripped or stripped.startswith("#")):
            continue
        if buffer and stripped.startswith("#"):
            continue
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer += stripped[:-1] + " "  # Docker drops the backslash-newline
            continue
        buffer += stripped
        word, _, rest = buffer.partition(" ")
        out.append((start, word.upper(), rest.strip()))
        buffer = ""
    return out


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "docker", "Dockerfile")
    shown = os.path.relpath(path, root) if path.startswith(root) else path
    text = open(path).read()
    problems = []

    def problem(line, message):
        problems.append(message)
        print(f"FAIL: {shown}:{line}: {message}")

    items = instructions(text)
    args = {}
    stages = []  # [name, [(line, instr, rest)]]
    for line, instr, rest in items:
        if instr not in INSTRUCTIONS:
            problem(line, f"unknown instruction {instr}")
        if instr == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        if instr == "FROM":
            words = rest.split()
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), words[0])
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append([name, []])
            repo, _, tag = image.partition(":")
            if repo != "debian" or not re.match(r"^(12(\.\d+)*|bookworm)(-slim)?(-\d+)?$", tag):
                problem(line, f"base image {image!r} is not a pinned Debian 12 (debian:12.x or bookworm)")
        elif stages:
            stages[-1][1].append((line, instr, rest))
        if instr in ("CMD", "ENTRYPOINT"):
            try:
                json.loads(rest)
            except ValueError:
                problem(line, f"{instr} in shell form; use the JSON form so signals reach kolos")

    if len(stages) < 2:
        problem(1, f"{len(stages)} stage(s): expected a multi-stage build (build, then runtime)")
    else:
        build_names = {s[0] for s in stages[:-1] if s[0]}
        final = stages[-1][1]
        for line, instr, rest in final:
            if instr == "ADD":
                problem(line, "ADD in the final stage: copy from the build stage only")
            if instr == "COPY":
                source_stage = re.search(r"--from=(\S+)", rest)
                if not source_stage or source_stage.group(1) not in build_names:
                    problem(line, f"COPY {rest!r} in the final stage does not come from a build stage")
                elif not re.search(r"--from=\S+\s+/opt/kolos\s+/opt/kolos$", rest):
                    problem(line, f"the final stage copies {rest!r}; only the install tree /opt/kolos belongs there")
        build_runs = " ".join(rest for s in stages[:-1] for _, instr, rest in s[1] if instr == "RUN")
        if "scripts/install-deps.sh" not in build_runs:
            problem(1, "the build stage does not run scripts/install-deps.sh (the README's install script)")
        if "--prefix /opt/kolos" not in build_runs:
            problem(1, "the build stage does not install into /opt/kolos (the MPIJob runs /opt/kolos/bin/kolos)")

    ignore = []
    ignore_path = os.path.join(root, ".dockerignore")
    if os.path.exists(ignore_path):
        ignore = [l.strip() for l in open(ignore_path) if l.strip() and not l.startswith("#")]
    else:
        problem(1, "no .dockerignore: the build directories would be sent as context")
    for needed in ("build", ".git"):
        if not any(fnmatch.fnmatch(needed, p) for p in ignore):
            problem(1, f".dockerignore does not exclude {needed}")

    all_runs = []
    for line, instr, rest in items:
        if instr == "COPY" and "--from=" not in rest:
            for source in rest.split()[:-1]:
                if source.startswith("--"):
                    continue
                if source != "." and not os.path.exists(os.path.join(root, source)):
                    problem(line, f"COPY source {source!r} does not exist in the context")
                if any(fnmatch.fnmatch(source, p) for p in ignore):
                    problem(line, f"COPY source {source!r} is excluded by .dockerignore")
        if instr == "RUN":
            all_runs.append((line, rest))
            if "apt-get install" in rest:
                if "--no-install-recommends" not in rest:
                    problem(line, "apt-get install without --no-install-recommends")
                if "rm -rf /var/lib/apt/lists" not in rest:
                    problem(line, "apt-get install without removing /var/lib/apt/lists in the same RUN")
            if re.search(r"apt-get update", rest) and "install" not in rest:
                problem(line, "apt-get update alone in a RUN: a cached layer leaves stale lists")
            if re.search(r"\bsudo\b", rest):
                problem(line, "sudo in a RUN: builds run as root")
    if not any("openssh-server" in r for _, r in all_runs) or not any("/run/sshd" in r for _, r in all_runs):
        problem(1, "the image lacks openssh-server and /run/sshd: MPIJob workers run /usr/sbin/sshd -De")

    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        problem(1, "shellcheck is not installed (scripts/install-deps.sh installs it)")
    else:
        for line, script in all_runs:
            result = subprocess.run([shellcheck, "-s", "bash", "-e", "SC2046", "-"], input=script,
                                    text=True, capture_output=True)
            if result.returncode != 0:
                problem(line, "shellcheck:\n" + result.stdout)

    version = re.search(r"project\(kolos VERSION ([0-9.]+)", open(os.path.join(root, "CMakeLists.txt")).read())
    label = re.search(r'org\.opencontainers\.image\.version="([^"]+)"', text)
    if not label:
        problem(1, "no org.opencontainers.image.version label")
    elif version and label.group(1) != version.group(1):
        problem(1, f"image version {label.group(1)} differs from the project's {version.group(1)}")
    kustomization = open(os.path.join(root, "k8s", "base", "kustomization.yaml")).read()
    tag = re.search(r'newTag:\s*"?([^"\s]+)"?', kustomization)
    if not tag or (version and tag.group(1) != version.group(1)):
        problem(1, f"k8s/base sets image tag {tag.group(1) if tag else None!r}, the image is {version.group(1) if version else '?'}")

    if problems:
        print(f"{len(problems)} problem(s)")
        return 1
    print(f"PASS: {shown}: {len(stages)} stages, {len(items)} instructions, "
          f"{len(all_runs)} RUN scripts shellchecked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
