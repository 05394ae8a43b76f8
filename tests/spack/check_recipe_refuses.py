#!/usr/bin/python3
"""check_recipe.py refuses the mistakes it exists to catch.

    check_recipe_refuses.py REPO_ROOT

Each case copies the checkout's spack/ (and, where the case needs it, one
CMake file) into a temporary tree whose other entries link to the checkout,
breaks one thing, runs check_recipe.py on it and expects exit 1 with the
message that names the mistake. The unbroken copy must pass.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE = "spack/packages/kolos/package.py"
# The recipe's release line (the tag v0.1.0's tarball, scripts/release-tarball.sh).
RELEASED = ('version("0.1.0", '
            'sha256="e80bb6f8883edfbf3a8e3c486c89d91fe358fcf9bba7f14e67513464194ca308")')
ENV = "spack/spack.yaml"

# (name, file, text to replace, replacement, expected message)
CASES = [
    ("unquoted spec in spack.yaml", ENV,
     '- "openmpi@4.1: fabrics=ucx schedulers=slurm"', "- openmpi@4.1: fabrics=ucx schedulers=slurm",
     "is not valid under Spack's schema for `specs`"),
    ("tag without a source", RECIPE,
     'url = f"file://{_REPO_DIR}/releases/kolos-0.1.0.tar.gz"\n    ' + RELEASED,
     'version("0.1.0", tag="v0.1.0")', "names a source"),
    ("a released version without a checksum", RECIPE, "    " + RELEASED + "\n",
     '    version("0.2.0")\n    ' + RELEASED + "\n", "is pinned by neither sha256 nor commit"),
    ("a local url outside releases/", RECIPE, '{_REPO_DIR}/releases/kolos-0.1.0.tar.gz',
     '/tmp/kolos-0.1.0.tar.gz', "is a local file outside"),
    ("placeholder maintainers", RECIPE, RELEASED, RELEASED + '\n    maintainers("kolos")',
     "maintainers() without a public source address"),
    ("unpinned tag", RECIPE, RELEASED,
     'git = "https://example.org/kolos.git"\n    version("0.1.0", tag="v0.1.0")',
     "without a commit pin"),
    ("tests ignore run_tests", RECIPE, 'spec.satisfies("+tests") or self.run_tests', 'spec.satisfies("+tests")',
     "KOLOS_BUILD_TESTS=OFF, expected ON"),
    ("googletest only test-only", RECIPE,
     'depends_on("googletest@1.10: +gmock", type=("build", "link"), when="+tests")',
     'depends_on("googletest@1.10: +gmock", type="test", when="+tests")',
     "googletest is not a build/link dependency when +tests"),
    ("no check()", RECIPE, "def check(self):", "def unused_check(self):", "no check()"),
    ("check() runs launch tests", RECIPE, '"launch": "needs root', '"nolaunch": "needs root',
     "excludes labels"),
    ("check() runs the cluster tests", RECIPE, '"cluster": ("makes network namespaces',
     '"nocluster": ("makes network namespaces', "excludes labels"),
    ("check() runs the interop tests without their Python", RECIPE,
     'if not self.spec.satisfies("+interop"):', "if False:", "excludes labels"),
    ("check() in the package's build_directory (Spack 0.21 has none)", RECIPE,
     "        with working_dir(self.builder.build_directory):", "        with working_dir(self.build_directory):",
     "has no attribute 'build_directory'"),
    ("ccache in Spack builds", RECIPE, 'self.define("KOLOS_CCACHE", False),', "",
     "does not set KOLOS_CCACHE=OFF"),
    ("~cuda links TorchConfig's torch", RECIPE, 'args.append(self.define("KOLOS_TORCH", "wheel"))',
     'args.append(self.define("KOLOS_TORCH", "system"))', "expected KOLOS_TORCH=wheel"),
    ("cuda_arch not given to LibTorch's CMake", RECIPE,
     'args.append(self.define("TORCH_CUDA_ARCH_LIST", ";".join(_torch_arch(a) for a in archs)))', "pass",
     "TORCH_CUDA_ARCH_LIST=9.0"),
    ("interop tests without Spack's python", RECIPE, 'args.append(self.define("KOLOS_VENV", folder))', "pass",
     "runs spec['python']"),
    ("toml11 unbounded", RECIPE, 'depends_on("toml11@3.7:3")', 'depends_on("toml11@3.7:")',
     "depends_on('toml11') has no upper bound"),
    ("hdf5 2.x allowed", RECIPE, 'depends_on("hdf5@1.10:1.14")', 'depends_on("hdf5@1.10:2")',
     "allows more than 1.14"),
    ("HDF5_PREFER_PARALLEL overridden", "checkpoint/CMakeLists.txt",
     'set(HDF5_PREFER_PARALLEL ON CACHE BOOL "Prefer the MPI build of HDF5 when both are installed")',
     "set(HDF5_PREFER_PARALLEL TRUE)", "overrides it with `set(HDF5_PREFER_PARALLEL TRUE)`"),
    ("nvcc not from the spec", RECIPE,
     'args.append(self.define("CMAKE_CUDA_COMPILER", spec["cuda"].prefix.bin.nvcc))', "pass",
     "does not set CMAKE_CUDA_COMPILER"),
    ("cuda_arch not passed to nccl", RECIPE,
     'depends_on(f"nccl +cuda cuda_arch={_arch}", when=f"+nccl cuda_arch={_arch}")', "pass",
     "cuda_arch is not passed on to nccl"),
    # Every CMake file that uses pkg-config, whichever they are, changed.
    ("pkgconfig no longer used", lambda root: pkgconfig_edits(root), None, None,
     "no CMake file of the project uses pkgconfig"),
    ("hwloc unbounded", RECIPE, 'depends_on("hwloc@2.0:2")', 'depends_on("hwloc@2.0:")',
     "depends_on('hwloc') has no upper bound"),
    ("a UCX kolos does not link", RECIPE, 'depends_on("nccl@2", when="+nccl")',
     'depends_on("nccl@2", when="+nccl")\n    depends_on("ucx@1.13:1", when="+ucx")',
     "kolos does not link UCX"),
    ("the removed UCX option", RECIPE, 'self.define("KOLOS_BUILD_BENCH", False),',
     'self.define("KOLOS_BUILD_BENCH", False),\n            self.define_from_variant("KOLOS_WITH_UCX", "ucx"),',
     "cmake_args() sets KOLOS_WITH_UCX, which no CMake file of the project reads"),
]


def pkgconfig_edits(root):
    """(path, line, replacement) for each line of the project's CMake files
    that uses pkg-config: each is removed."""
    pattern = re.compile(r"find_package\(\s*PkgConfig|pkg_check_modules|pkg_search_module")
    edits = []
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        if rel.split(os.sep)[0] in (".git", ".cache", "build", "install") or rel.startswith("build-") \
                or "spack-build" in rel:
            dirs[:] = []
            continue
        for name in files:
            if name != "CMakeLists.txt" and not name.endswith(".cmake"):
                continue
            path = os.path.join(folder, name)
            for line in open(path, errors="replace").read().splitlines():
                if pattern.search(line):
                    edits.append((os.path.relpath(path, root), line, "# (removed by the test)"))
    return edits


def make_tree(root, top, copied):
    """A tree in `top` whose entries link to `root`'s, except spack/ and the
    files in `copied`, which are copies that may be changed."""
    for entry in os.listdir(root):
        if entry in ("spack", ".git", "build", ".cache") or entry.startswith("build-"):
            continue
        if not any(c.split("/")[0] == entry for c in copied):
            os.symlink(os.path.join(root, entry), os.path.join(top, entry))
    shutil.copytree(os.path.join(root, "spack"), os.path.join(top, "spack"),
                    ignore=shutil.ignore_patterns(".spack-env", "spack.lock", "__pycache__"))
    for path in copied:
        if path.startswith("spack/"):
            continue
        # Copy the folder chain of `path`: its siblings link to the checkout.
        parts = path.split("/")
        for depth in range(1, len(parts)):
            folder = os.path.join(top, *parts[:depth])
            if os.path.islink(folder):
                os.unlink(folder)
            if not os.path.isdir(folder):
                os.mkdir(folder)
                source = os.path.join(root, *parts[:depth])
                for entry in os.listdir(source):
                    if entry != parts[depth]:
                        os.symlink(os.path.join(source, entry), os.path.join(folder, entry))
        shutil.copy(os.path.join(root, path), os.path.join(top, path))


def run_check(top):
    # The stand-in only: each case is a mistake the stand-in must catch (a
    # real Spack, KOLOS_SPACK, is tried by check_recipe.py on the checkout).
    env = {k: v for k, v in os.environ.items() if k != "KOLOS_SPACK"}
    result = subprocess.run([sys.executable, os.path.join(HERE, "check_recipe.py"), top],
                            capture_output=True, text=True, timeout=60, env=env)
    return result.returncode, result.stdout + result.stderr


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    failures = 0
    with tempfile.TemporaryDirectory() as top:
        make_tree(root, top, [])
        rc, out = run_check(top)
        if rc != 0:
            print(f"FAIL: the unbroken copy does not pass:\n{out}")
            return 1
    for name, path, old, new, expected in CASES:
        edits = path(root) if callable(path) else [(path, old, new)]
        with tempfile.TemporaryDirectory() as top:
            make_tree(root, top, sorted({p for p, _, _ in edits}))
            missing = False
            for edit_path, edit_old, edit_new in edits:
                target = os.path.join(top, edit_path)
                text = open(target).read()
                if edit_old not in text:
                    print(f"FAIL: {name}: {edit_path} no longer contains {edit_old!r}; update this case")
                    missing = True
                    break
                open(target, "w").write(text.replace(edit_old, edit_new, 1))
            if missing:
                failures += 1
                continue
            rc, out = run_check(top)
            if rc == 1 and expected in out:
                print(f"ok: {name}: refused ({expected})")
            else:
                print(f"FAIL: {name}: exit {rc}, expected 1 with {expected!r}:\n{out}")
                failures += 1
    print(f"{len(CASES) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
