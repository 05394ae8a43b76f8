#!/usr/bin/python3
"""Checks the Spack recipe and environment in spack/, with a stand-in for
Spack and, where one is given, with a real Spack.

    check_recipe.py REPO_ROOT
    KOLOS_SPACK=/path/to/spack check_recipe.py REPO_ROOT

Run with Debian's /usr/bin/python3 (python3-yaml, python3-jsonschema). Spack
is not in Debian, so the first part uses a small stand-in for `spack.package`
(spack_standin.py) that records the directives the recipe calls (version,
variant, depends_on, conflicts, when, ...) and runs its methods. The stand-in is only that: it
mimics the parts of Spack's package API the recipe uses (no `build_directory`
on the package, `self.builder.build_directory`, as in Spack 0.21), and a
recipe that passes it can still fail in Spack. With KOLOS_SPACK naming a
Spack checkout (and Spack's own configuration: SPACK_USER_CONFIG_PATH, with
externals for kolos's dependencies), the second part runs the recipe through
that Spack: `spack audit packages kolos`, concretizes kolos and
kolos+tests+interop (and kolos+cuda cuda_arch=90 where the configuration
allows it), calls cmake_args() and check() on the real package objects (check()
with its Executable and working_dir recorded, not run) and checks what they
did. Without KOLOS_SPACK it prints that only the stand-in was used.

Checks of the first part:
  - the recipe compiles and defines a CMakePackage with a description;
  - source and versions are honest: with no url or git the versions name no
    tag, branch or commit and the docstring says how to build from a
    checkout (spack dev-build / spack develop); a file:// url points into
    the releases/ folder of the recipe's own Spack repository (where
    scripts/release-tarball.sh puts the tarball); with a url or git every
    version is pinned (sha256 or commit, never a bare tag), except the
    project's own version while it is unreleased (no checksum, and the
    docstring says so and how to build from a checkout: Spack fetches a
    declared version without a checksum with a warning); maintainers only
    alongside a public address; the project's own version (CMakeLists.txt)
    is among the versions;
  - every variant named in a `when=`, a dependency's condition or the
    recipe's code (`satisfies("+x")`, `define_from_variant(..., "x")`) is
    declared;
  - every dependency is a known Spack package, with variants that package
    has (a short list kept below, from Spack's builtin repository), and the
    dependencies kolos needs are all there; build tools that the CMake files
    never use (pkgconfig) are not;
  - dependencies whose APIs kolos is written against carry the upper bounds
    in VERSION_BOUNDS;
  - CUDA: +cuda passes CMAKE_CUDA_COMPILER from spec["cuda"], and every
    cuda_arch is passed on to py-torch and nccl;
  - the test hook: KOLOS_BUILD_TESTS follows +tests and `spack install
    --test=...` (self.run_tests); googletest is in the graph in both cases;
    check() runs ctest in self.builder.build_directory without the `launch`
    and `fuzz` labels, without `gpu` unless +cuda on a node with a GPU,
    without `interop` unless +interop, and without the tests that run
    Debian's python3 with h5py when that Python cannot import h5py;
  - cmake_args(), run for each combination of the recipe's variants, only
    sets CMake variables that the project's CMake files (or LibTorch's, for
    TORCH_CUDA_ARCH_LIST) read, and none that a plain set() in those files
    would override; turns ccache off; +cuda: KOLOS_TORCH=system, the
    cuda_arch values as CMAKE_CUDA_ARCHITECTURES and TORCH_CUDA_ARCH_LIST;
    ~cuda: KOLOS_TORCH=wheel with py-torch's torch package
    (KOLOS_TORCH_PACKAGE: libtorch_cpu and libc10 only); +interop with
    tests: KOLOS_VENV is a folder whose bin/python runs spec["python"];
  - spack.yaml is valid YAML whose `specs` list follows the schema Spack
    documents for an environment (a list of spec strings or matrix entries,
    lib/spack/spack/schema/spec_list.py in Spack), whose specs name known
    packages and variants, and which agrees with the recipe and points at
    this checkout; repo.yaml has a namespace.
Prints each problem; exits 1 when there is any.
"""
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile

import jsonschema
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spack_standin import TORCH_PACKAGE, Calls, FakeDependency, FakeSpec, install_spack_standin  # noqa: E402

# Spack packages the recipe may depend on, and the variants of theirs it may
# ask for (from spack/var/spack/repos/builtin/packages/*/package.py).
KNOWN_PACKAGES = {
    "mpi": set(),  # virtual
    "openmpi": {"cuda", "fabrics", "schedulers", "legacylaunchers", "static", "wrapper-rpath"},
    "mpich": {"cuda", "netmod", "pmi"},
    "ucx": {"cuda", "cuda_arch", "rocm", "verbs", "rdmacm", "thread_multiple", "cma"},
    "nccl": {"cuda", "cuda_arch"},
    "cuda": set(),
    "py-torch": {"cuda", "nccl", "mpi", "distributed", "cuda_arch", "rocm", "openmp"},
    "hdf5": {"mpi", "cxx", "fortran", "hl", "shared", "threadsafe", "api"},
    "boost": {"program_options", "filesystem", "system", "shared", "mpi", "cxxstd"},
    "toml11": set(),
    "nlohmann-json": {"multiple_headers"},
    "cmake": set(),
    "ninja": set(),
    "pkgconfig": set(),
    "googletest": {"gmock", "shared", "pthreads", "cxxstd"},
    "hwloc": {"cuda", "nvml"},
    "python": set(),
    "py-transformers": set(),
    "py-safetensors": set(),
    "py-h5py": {"mpi"},
    "py-tokenizers": set(),
    "py-sentencepiece": set(),
    "py-numpy": set(),
    "pcre2": {"jit", "multibyte"},
    "icu4c": {"cxxstd"},
    "sentencepiece": set(),
    "cpp-httplib": set(),
    "libpng": set(),
    "jpeg": set(),  # virtual: libjpeg-turbo, libjpeg
}
# CMake variables the recipe may set that LibTorch's CMake reads, not kolos's.
LIBTORCH_VARIABLES = {"TORCH_CUDA_ARCH_LIST"}
# What kolos cannot build without (root-level, unconditional).
REQUIRED = {"mpi", "boost", "toml11", "nlohmann-json", "cmake", "py-torch", "hwloc", "pcre2", "icu4c",
            "sentencepiece"}
# Build tools that are only worth depending on when a CMake file uses them.
TOOL_USE = {"pkgconfig": r"find_package\(\s*PkgConfig|pkg_check_modules|pkg_search_module"}
# Dependencies whose APIs kolos uses, with the highest version the recipe may
# allow (compared on as many components as given: "3" admits 3.x) and why.
VERSION_BOUNDS = {
    "toml11": ("3", "toml11 4 removed toml::string; run_config.cpp reads as_string().str"),
    "hdf5": ("1.14", "kolos uses the 1.10-1.14 C API; 2.x changes the API defaults"),
    "py-torch": ("2", "LibTorch's C++ API of 2.x"),
    "hwloc": ("2", "libkolos_topology reads hwloc 2.x's OS device types; hwloc 3 renumbers them"),
    "nccl": ("2", "NCCL 2.x"),
}
# Packages that must be built for the same GPUs as kolos (cuda_arch).
CUDA_ARCH_DEPENDENCIES = ("py-torch", "nccl")
# Spack's CudaPackage.cuda_arch_values (lib/spack/spack/build_systems/cuda.py).
CUDA_ARCH_VALUES = (
    "10", "11", "12", "13", "20", "21", "30", "32", "35", "37", "50", "52", "53", "60", "61",
    "62", "70", "72", "75", "80", "86", "87", "89", "90", "90a", "100", "100a", "100f", "101",
    "101a", "101f", "103", "103a", "103f", "110", "110a", "110f", "120", "120a", "120f", "121",
    "121a", "121f",
)

# The `specs` list of a Spack environment as Spack documents and enforces it
# (lib/spack/spack/schema/spec_list.py, spec_list_schema): each item a spec
# string, or an object with `matrix` (a list of lists of strings) and
# `exclude` (a list of strings), or null.
SPEC_LIST_SCHEMA = {
    "type": "array",
    "items": {
        "anyOf": [
            {"type": "string"},
            {"type": "null"},
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "matrix": {
                        "type": "array",
                        "items": {"type": "array", "items": {"type": "string"}},
                    },
                    "exclude": {"type": "array", "items": {"type": "string"}},
                },
            },
        ]
    },
}
# The `develop` section (lib/spack/spack/schema/develop.py).
DEVELOP_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "patternProperties": {
        r"\w[\w-]*": {
            "type": "object",
            "additionalProperties": False,
            "required": ["spec"],
            "properties": {"spec": {"type": "string"}, "path": {"type": "string"}},
        }
    },
}




def root_part(spec):
    """The part of a spec string before its first dependency (`^`)."""
    return spec.split("^", 1)[0]


def variant_tokens(spec):
    """(sign, name) for +x, ~x and name=value at the root of a spec string."""
    root = root_part(spec)
    found = [(m.group(1), m.group(2)) for m in re.finditer(r"(?:^|\s)([+~])([\w-]+)", root)]
    found += [("=", m.group(1)) for m in re.finditer(r"([\w-]+)=", root)]
    return found


def version_range(spec):
    """(low, high) of the root's `@low:high` ("" for an open end), or None."""
    match = re.match(r"[\w-]+@([\w.]*)(:?)([\w.]*)", root_part(spec).strip())
    if not match:
        return None
    low, colon, high = match.groups()
    return (low, high) if colon else (low, low)


def version_key(text):
    return tuple(int(p) if p.isdigit() else p for p in text.split("."))


def within(high, limit):
    """Whether an upper bound `high` admits nothing above `limit`."""
    if not high:
        return False
    key, limit_key = version_key(high), version_key(limit)
    return key[: len(limit_key)] <= limit_key


def unguarded_sets(cmake_files, name):
    """(file, value) for each `set(NAME value)` that would replace a -DNAME
    given on the command line: not CACHE, not PARENT_SCOPE, and not inside an
    if() that tests `NOT NAME` or `NOT DEFINED NAME`."""
    token = re.compile(r"\b(if|elseif|else|endif|set)\s*\(([^)]*)\)", re.IGNORECASE)
    guard = re.compile(r"\bNOT\s+(DEFINED\s+)?" + re.escape(name) + r"\b")
    found = []
    all_text = "".join(open(path, errors="replace").read() for path in cmake_files)
    for path in cmake_files:
        text = re.sub(r"#[^\n]*", "", open(path, errors="replace").read())
        conditions = []
        for match in token.finditer(text):
            command, body = match.group(1).lower(), match.group(2)
            if command == "if":
                conditions.append(body)
            elif command in ("elseif", "else"):
                if conditions:
                    conditions[-1] = body if command == "elseif" else ""
            elif command == "endif":
                if conditions:
                    conditions.pop()
            else:
                words = body.split()
                if not words or words[0] != name or "CACHE" in words or "PARENT_SCOPE" in words:
                    continue
                # set(NAME "${SAVED}") where SAVED holds NAME's value from
                # before (set(SAVED "${NAME}")) puts the user's value back.
                restored = re.fullmatch(r'"?\$\{(\w+)\}"?', " ".join(words[1:]))
                if restored and re.search(r"set\(\s*" + restored.group(1) + r'\s+"?\$\{' + name + r"\}",
                                          all_text):
                    continue
                if not any(guard.search(c) for c in conditions):
                    found.append((path, " ".join(words[1:])))
    return found


# Run by `spack python` in real_spack_checks(): concretizes each spec with
# the recipe of the tree being checked, calls cmake_args() and check() on the
# real package object (check()'s Executable and working_dir recorded, not
# run) and prints what they did as JSON.
REAL_SPACK_SCRIPT = r"""
import contextlib, json, os, shutil, sys, tempfile
import spack.spec
out = []
for text in sys.argv[1:]:
    entry = {"spec": text}
    out.append(entry)
    try:
        spec = spack.spec.Spec(text).concretized()
    except Exception as e:
        entry["unsatisfiable"] = str(e).splitlines()[0][:300]
        continue
    pkg = spec.package
    module = pkg.module
    entry["package_has_build_directory"] = "build_directory" in dir(pkg)
    entry["build_directory"] = pkg.builder.build_directory
    # Keep the +interop wrapper out of Spack's stage (cmake_args writes it).
    scratch = tempfile.mkdtemp()
    type(pkg)._test_python_dir = lambda self: scratch
    pkg.run_tests = True
    entry["cmake_args"] = [str(a) for a in pkg.cmake_args()]
    calls = []
    class Recorder:
        def __init__(self, path):
            self.path, self.returncode = str(path), 0
        def __call__(self, *args, **kwargs):
            calls.append(["run", self.path, [str(a) for a in args]])
    @contextlib.contextmanager
    def working_dir(path, **kwargs):
        calls.append(["cd", str(path), []])
        yield
    module.Executable, module.working_dir = Recorder, working_dir
    # make_jobs is set on the module when a build starts (build_environment).
    if not hasattr(module, "make_jobs"):
        module.make_jobs = 2
    try:
        pkg.check()
    except Exception as e:
        entry["check_error"] = f"{type(e).__name__}: {e}"
    entry["check_calls"] = calls
    wrapper = scratch + "/bin/python"
    entry["test_python"] = open(wrapper).read() if os.access(wrapper, os.X_OK) else None
    shutil.rmtree(scratch, ignore_errors=True)
print("KOLOS-JSON" + json.dumps(out))
"""


def real_spack_checks(root, spack_dir, problem, passed):
    """The recipe through a real Spack: audit, concretization, cmake_args()
    and check() on Spack's own package objects."""
    spack = os.path.join(spack_dir, "bin", "spack")
    with tempfile.TemporaryDirectory() as scope:
        # This tree's spack/ as the only `kolos` repository (repos:: replaces
        # the ones of lower scopes), ahead of Spack's builtin one.
        with open(os.path.join(scope, "repos.yaml"), "w") as f:
            f.write(f"repos::\n- {os.path.join(root, 'spack')}\n- $spack/var/spack/repos/builtin\n")
        base = [spack, "-C", scope]
        for extra in filter(None, os.environ.get("KOLOS_SPACK_SCOPES", "").split(":")):
            base += ["-C", extra]
        audit = subprocess.run(base + ["audit", "packages", "kolos"], capture_output=True, text=True)
        issues = re.findall(r"(\d+) issues? found", audit.stdout)
        if audit.returncode != 0 or not issues or any(n != "0" for n in issues):
            problem(f"spack audit packages kolos: exit {audit.returncode}:\n{audit.stdout[-2000:]}{audit.stderr[-2000:]}")
        else:
            passed.append(f"real Spack: `spack audit packages kolos`: {audit.stdout.strip().splitlines()[-3:]}")
        script = os.path.join(scope, "check.py")
        with open(script, "w") as f:
            f.write(REAL_SPACK_SCRIPT)
        specs = ["kolos", "kolos +tests +interop", "kolos +cuda cuda_arch=90"]
        run = subprocess.run(base + ["python", script] + specs, capture_output=True, text=True)
        line = [l for l in run.stdout.splitlines() if l.startswith("KOLOS-JSON")]
        if run.returncode != 0 or not line:
            problem(f"spack python (the recipe's methods): exit {run.returncode}:\n{run.stdout[-2000:]}{run.stderr[-3000:]}")
            return
    for entry in json.loads(line[0][len("KOLOS-JSON"):]):
        text = entry["spec"]
        if "unsatisfiable" in entry:
            if "+cuda" in text:
                print(f"not checked with the real Spack: {text}: {entry['unsatisfiable']}")
            else:
                problem(f"real Spack: {text} does not concretize: {entry['unsatisfiable']}")
            continue
        defined = dict(re.match(r"-D(\w+)(?::\w+)?=(.*)", a).groups() for a in entry["cmake_args"] if a.startswith("-D"))
        if entry.get("check_error"):
            problem(f"real Spack: {text}: check() raised {entry['check_error']}")
        cds = [c[1] for c in entry["check_calls"] if c[0] == "cd"]
        ctest = [c[2] for c in entry["check_calls"] if c[0] == "run" and c[1].endswith("ctest")]
        if not ctest or cds != [entry["build_directory"]]:
            problem(f"real Spack: {text}: check() ran {entry['check_calls']}, expected ctest in "
                    f"{entry['build_directory']}")
        if defined.get("KOLOS_CCACHE") != "OFF":
            problem(f"real Spack: {text}: cmake_args() does not turn ccache off")
        if "+cuda" in text:
            if defined.get("CMAKE_CUDA_ARCHITECTURES") != "90" or defined.get("TORCH_CUDA_ARCH_LIST") != "9.0":
                problem(f"real Spack: {text}: cuda_arch=90 not passed on: {entry['cmake_args']}")
        elif defined.get("KOLOS_TORCH") != "wheel" or not os.path.isfile(
                os.path.join(defined.get("KOLOS_TORCH_PACKAGE", ""), "lib", "libtorch_cpu.so")):
            problem(f"real Spack: {text}: ~cuda does not import py-torch's libtorch_cpu.so: {entry['cmake_args']}")
        if "+interop" in text and not entry.get("test_python"):
            problem(f"real Spack: {text}: KOLOS_VENV ({defined.get('KOLOS_VENV')}) has no bin/python")
        passed.append(f"real Spack: {text}: cmake_args {entry['cmake_args']}; check() ran ctest "
                      f"{' '.join(ctest[0]) if ctest else '-'} in the builder's build directory "
                      f"(the package itself has build_directory: {entry['package_has_build_directory']})")


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    recipe = os.path.join(root, "spack", "packages", "kolos", "package.py")
    problems = []
    passed = []

    def problem(message):
        problems.append(message)
        print("FAIL:", message)

    with open(recipe) as f:
        source = f.read()
    try:
        code = compile(source, recipe, "exec")  # what py_compile does, without writing a .pyc
    except SyntaxError as e:
        print(f"FAIL: {recipe} does not compile: {e}")
        return 1
    install_spack_standin(CUDA_ARCH_VALUES)
    namespace = {"__name__": "kolos_recipe", "__file__": recipe}
    exec(code, namespace)
    cls = namespace.get("Kolos")
    if cls is None:
        print("FAIL: package.py defines no class Kolos")
        return 1
    package = sys.modules["spack.package"]
    if not issubclass(cls, package.CMakePackage):
        problem("Kolos is not a CMakePackage")

    directives = cls.directives
    by_kind = lambda kind: [(a, k) for d, a, k in directives if d == kind]

    # Source, metadata and versions.
    doc = (cls.__doc__ or "").strip()
    if not doc:
        problem("no docstring (Spack shows it as the description)")
    address = {a: getattr(cls, a, "") for a in ("homepage", "url", "git") if getattr(cls, a, "")}
    # A file:// url is the releases/ folder of the recipe's own repository
    # (or a mirror in front of it): a place to fetch from, not a public one.
    public = {a: v for a, v in address.items() if not v.startswith("file://")}
    releases = os.path.join(root, "spack", "releases")
    if address.get("url", "").startswith("file://"):
        folder = os.path.dirname(address["url"][len("file://"):])
        if os.path.realpath(folder) != os.path.realpath(releases):
            problem(f"url {address['url']!r} is a local file outside {releases}, where "
                    "scripts/release-tarball.sh puts release tarballs")
    versions = [a[0] for a, _ in by_kind("version")]
    if not versions:
        problem("no version()")
    cmake_text = open(os.path.join(root, "CMakeLists.txt")).read()
    project = re.search(r"project\(kolos VERSION ([0-9.]+)", cmake_text)
    if project and project.group(1) not in versions:
        problem(f"the project's version {project.group(1)} (CMakeLists.txt) has no version() in the recipe")
    if not address:
        for args, kwargs in by_kind("version"):
            fetch = sorted({"tag", "branch", "commit", "url", "sha256", "git"} & set(kwargs))
            if fetch or len(args) > 1:
                problem(f"version({args[0]!r}) names a source ({fetch or 'a checksum'}) but the "
                        "recipe has no url or git to fetch it from")
        if not re.search(r"spack (dev-build|develop)", doc):
            problem("with no public source address, the docstring must say how to build from a "
                    "checkout (spack dev-build / spack develop)")
    else:
        if "url" not in address and "git" not in address:
            problem(f"{sorted(address)} set but no url or git: nothing to fetch from")
        for args, kwargs in by_kind("version"):
            pinned = {"sha256", "commit"} & set(kwargs) or len(args) > 1
            unreleased = (project and args[0] == project.group(1) and not kwargs
                          and re.search(r"spack (dev-build|develop)", doc)
                          and re.search(r"not\s+been\s+released|unreleased", doc))
            if "tag" in kwargs and "commit" not in kwargs:
                problem(f"version({args[0]!r}) names tag {kwargs['tag']!r} without a commit pin")
            elif not pinned and "branch" not in kwargs and not unreleased:
                problem(f"version({args[0]!r}) is pinned by neither sha256 nor commit (only the "
                        "project's own, unreleased version may be, with a docstring that says how "
                        "to build it from a checkout and that it is not released)")
            elif "branch" in kwargs and re.fullmatch(r"[0-9.]+", args[0]):
                problem(f"version({args[0]!r}) is a release number following branch {kwargs['branch']!r}")
    if by_kind("maintainers") and not public:
        problem("maintainers() without a public source address: maintainers are the GitHub "
                "handles of the package's upstream")
    passed.append(f"source: {address or 'checkout only'}, versions {versions}")

    # Variants: declared, and every use of one.
    declared = {}
    for args, kwargs in by_kind("variant"):
        declared[args[0]] = kwargs
        if args[0] not in ("cuda", "cuda_arch") and not kwargs.get("description"):
            problem(f"variant {args[0]!r} has no description")

    def check_condition(condition, where):
        for sign, name in variant_tokens(condition):
            if name not in declared and name not in KNOWN_PACKAGES:
                problem(f"{where}: variant {name!r} in {condition!r} is not declared")

    for kind in ("variant", "depends_on", "conflicts", "requires", "patch", "resource"):
        for args, kwargs in by_kind(kind):
            if "when" in kwargs:
                check_condition(kwargs["when"], f"{kind}({args[0]!r})")
    for args, _ in by_kind("conflicts"):
        if args[0].startswith(("+", "~")):
            check_condition(args[0], f"conflicts({args[0]!r})")
    for name in re.findall(r"satisfies\(\"([^\"]+)\"\)", source):
        check_condition(name, "satisfies()")
    for name in re.findall(r"define_from_variant\(\"[^\"]+\",\s*\"([^\"]+)\"\)", source):
        if name not in declared:
            problem(f"define_from_variant uses undeclared variant {name!r}")
    for name in re.findall(r"variants\[\"([^\"]+)\"\]", source):
        if name not in declared:
            problem(f"spec.variants[{name!r}] is not declared")
    for variant in ("cuda", "nccl", "ucx", "tests", "hdf5_parallel", "interop"):
        if variant not in declared:
            problem(f"variant {variant!r} is not declared")

    # Dependencies.
    cmake_files = []
    for folder, _, files in os.walk(root, followlinks=True):
        rel = folder[len(root):]
        # Build trees, and .cache (the torch wheel's environment, whose
        # LibTorch CMake files are not kolos's) stay out.
        if rel.startswith(("/build", "/.git", "/install", "/.cache")) or "/spack-build" in rel:
            continue
        cmake_files += [os.path.join(folder, f) for f in files if f == "CMakeLists.txt" or f.endswith(".cmake")]
    cmake_source = "".join(open(f, errors="replace").read() for f in cmake_files)
    dependencies = []  # (name, spec, when, types)
    for args, kwargs in by_kind("depends_on"):
        spec = args[0]
        name = re.match(r"[\w-]+", spec).group(0)
        types_ = kwargs.get("type", ("build", "link"))
        types_ = (types_,) if isinstance(types_, str) else tuple(types_)
        dependencies.append((name, spec, kwargs.get("when"), types_))
        if name not in KNOWN_PACKAGES:
            problem(f"depends_on({spec!r}): {name!r} is not a known Spack package")
            continue
        for sign, variant in variant_tokens(spec):
            if variant not in KNOWN_PACKAGES[name]:
                problem(f"depends_on({spec!r}): {name} has no variant {variant!r}")
        when = kwargs.get("when") or ""
        for dep in re.findall(r"\^(?:\[[^\]]*\]\s*)?([\w-]+)", when):
            if dep not in KNOWN_PACKAGES:
                problem(f"depends_on({spec!r}, when={when!r}): {dep!r} is not a known Spack package")
        if name in TOOL_USE and not re.search(TOOL_USE[name], cmake_source):
            problem(f"depends_on({spec!r}): no CMake file of the project uses {name}")
    unconditional = {n for n, _, when, _ in dependencies if not when}
    for name in sorted(REQUIRED - unconditional):
        problem(f"no unconditional depends_on({name!r})")
    if not any("+mpi" in s for n, s, _, _ in dependencies if n == "hdf5"):
        problem("no depends_on('hdf5 +mpi') (parallel HDF5)")
    if not any("program_options" in s for n, s, _, _ in dependencies if n == "boost"):
        problem("boost is needed with +program_options")
    if "nccl" in declared and not any(n == "nccl" and w and "+nccl" in w for n, _, w, _ in dependencies):
        problem("variant 'nccl' has no depends_on('nccl', when='+nccl')")
    # kolos has no UCX transport: +ucx asks for an OpenMPI with UCX (whose PML
    # `kolos run` may select), not for a UCX that kolos would link.
    if "ucx" in declared and not any(n == "openmpi" and "fabrics=ucx" in s and w and "+ucx" in w
                                     for n, s, w, _ in dependencies):
        problem("variant 'ucx' has no depends_on('openmpi fabrics=ucx', when='+ucx ^[virtuals=mpi] openmpi')")
    if any(n == "ucx" for n, _, _, _ in dependencies):
        problem("depends_on('ucx'): kolos does not link UCX (OpenMPI's fabrics=ucx brings it)")

    # Upper bounds where kolos uses the dependency's API: either one
    # unconditional depends_on carries the bound, or every one of them does.
    for name, (limit, why) in VERSION_BOUNDS.items():
        specs = [(s, w) for n, s, w, _ in dependencies if n == name]
        if not specs:
            continue
        ranges = [(version_range(s), w) for s, w in specs]
        bounded = [(r, w) for r, w in ranges if r and within(r[1], limit)]
        # A bound under condition W covers every dependency whose condition
        # includes W (an unconditional bound covers all).
        covers = lambda w, other: set((w or "").split()) <= set((other or "").split())
        if not bounded or not all(any(covers(bw, w) for _, bw in bounded) for _, w in specs):
            problem(f"depends_on({name!r}) has no upper bound at or below {limit} ({why})")
        for r, w in ranges:
            if r and r[1] and not within(r[1], limit):
                problem(f"depends_on({name}@{r[0]}:{r[1]}) allows more than {limit} ({why})")
    passed.append("version bounds: " + ", ".join(f"{n}<={l}" for n, (l, _) in VERSION_BOUNDS.items()))

    # CUDA: every cuda_arch reaches the CUDA libraries kolos links.
    for dep in CUDA_ARCH_DEPENDENCIES:
        missing = []
        for arch in CUDA_ARCH_VALUES:
            if not any(n == dep and re.search(rf"cuda_arch={arch}\b", s) and w
                       and re.search(rf"cuda_arch={arch}\b", w) for n, s, w, _ in dependencies):
                missing.append(arch)
        if missing:
            problem(f"cuda_arch is not passed on to {dep} for {len(missing)} of "
                    f"{len(CUDA_ARCH_VALUES)} values (e.g. {missing[0]}): add "
                    f"depends_on('{dep} +cuda cuda_arch=X', when='... cuda_arch=X') for each")
    passed.append(f"cuda_arch passed on to {', '.join(CUDA_ARCH_DEPENDENCIES)}")

    # googletest: in the graph with +tests (not test-only, which +tests
    # alone would not pull in) and with --test (type "test").
    gtest = [(w, t) for n, _, w, t in dependencies if n == "googletest"]
    if not any(w and "+tests" in w and set(t) & {"build", "link"} for w, t in gtest):
        problem("googletest is not a build/link dependency when +tests (a test-only one is left "
                "out of the graph unless `spack install --test` is given)")
    if not any(not w and "test" in t for w, t in gtest):
        problem("googletest is not an unconditional type='test' dependency, so `spack install "
                "--test=root` builds the tests without it")

    # cmake_args() for every combination of boolean variants and of
    # self.run_tests: each -D must be a variable the project's CMake reads.
    booleans = [n for n, k in declared.items() if isinstance(k.get("default", False), bool) and not k.get("multi")]
    seen = {}
    combinations = 0
    # One line per kind of failure: the first combination it showed in, and
    # how many it showed in.
    per_combination = {}

    def combination_problem(message, where):
        first, count = per_combination.get(message, (where, 0))
        per_combination[message] = (first, count + 1)

    for values in itertools.product([False, True], repeat=len(booleans) + 1):
        variants = dict(zip(booleans, values))
        run_tests = values[-1]
        variants["cuda_arch"] = ("90",) if variants.get("cuda") else ("none",)
        combinations += 1
        try:
            args = cls(FakeSpec(variants), run_tests=run_tests).cmake_args()
        except Exception as e:  # noqa: BLE001 - report any failure of the recipe's code
            problem(f"cmake_args() with {variants}, run_tests={run_tests} raised {type(e).__name__}: {e}")
            continue
        defined = {}
        for arg in args:
            match = re.match(r"-D([A-Za-z_][A-Za-z0-9_]*)(:\w+)?=(.*)", arg)
            if not match:
                problem(f"cmake_args() returned {arg!r}, not -DNAME=VALUE")
                continue
            defined[match.group(1)] = match.group(3)
            seen.setdefault(match.group(1), set()).add(match.group(3))
        where = f"{variants}, run_tests={run_tests}"
        want_tests = "ON" if (variants.get("tests") or run_tests) else "OFF"
        if defined.get("KOLOS_BUILD_TESTS") != want_tests:
            combination_problem(f"sets KOLOS_BUILD_TESTS={defined.get('KOLOS_BUILD_TESTS')}, expected "
                                f"{want_tests} (it follows +tests and self.run_tests)", where)
        want_parallel = "ON" if variants.get("hdf5_parallel") else "OFF"
        if defined.get("HDF5_PREFER_PARALLEL") != want_parallel:
            combination_problem(f"sets HDF5_PREFER_PARALLEL={defined.get('HDF5_PREFER_PARALLEL')}, "
                                f"expected {want_parallel}", where)
        if defined.get("KOLOS_CCACHE") != "OFF":
            combination_problem("does not set KOLOS_CCACHE=OFF (a Spack build would write the user's "
                                "ccache)", where)
        if variants.get("cuda"):
            nvcc = FakeDependency("cuda").prefix.bin.nvcc
            if defined.get("CMAKE_CUDA_COMPILER") != nvcc:
                combination_problem("does not set CMAKE_CUDA_COMPILER to spec['cuda'].prefix.bin.nvcc "
                                    "(CMake would take the first nvcc it finds)", where)
            if defined.get("KOLOS_TORCH") != "system":
                combination_problem(f"sets KOLOS_TORCH={defined.get('KOLOS_TORCH')} with +cuda, expected "
                                    "system (py-torch's TorchConfig.cmake, with its CUDA libraries)", where)
            if defined.get("CMAKE_CUDA_ARCHITECTURES") != "90" or defined.get("TORCH_CUDA_ARCH_LIST") != "9.0":
                combination_problem("does not pass cuda_arch=90 as CMAKE_CUDA_ARCHITECTURES=90 and "
                                    "TORCH_CUDA_ARCH_LIST=9.0 (got "
                                    f"{defined.get('CMAKE_CUDA_ARCHITECTURES')!r}, "
                                    f"{defined.get('TORCH_CUDA_ARCH_LIST')!r})", where)
        else:
            if defined.get("KOLOS_TORCH") != "wheel" or defined.get("KOLOS_TORCH_PACKAGE") != TORCH_PACKAGE:
                combination_problem(f"sets KOLOS_TORCH={defined.get('KOLOS_TORCH')}, KOLOS_TORCH_PACKAGE="
                                    f"{defined.get('KOLOS_TORCH_PACKAGE')} with ~cuda, expected KOLOS_TORCH=wheel "
                                    "and py-torch's torch package (libtorch_cpu and libc10 only: TorchConfig's "
                                    "`torch` links libtorch_cuda.so whenever py-torch is a CUDA build)", where)
        if variants.get("interop") and want_tests == "ON":
            venv = defined.get("KOLOS_VENV", "")
            python = os.path.join(venv, "bin", "python")
            want = FakeDependency("python").command.path
            if not (os.access(python, os.X_OK) and want in open(python).read()):
                combination_problem("with +interop does not set KOLOS_VENV to a folder whose bin/python "
                                    "runs spec['python'] (the interop tests run $KOLOS_VENV/bin/python)", where)
    for message, (first, count) in per_combination.items():
        problem(f"cmake_args() {message}: in {count} of {combinations} combinations, e.g. {first}")
    for name in sorted(seen):
        if name in LIBTORCH_VARIABLES:
            continue
        if not name.startswith("CMAKE_") and not re.search(r"\b" + name + r"\b", cmake_source):
            problem(f"cmake_args() sets {name}, which no CMake file of the project reads")
        for path, value in unguarded_sets(cmake_files, name):
            problem(f"cmake_args() sets {name}, but {os.path.relpath(path, root)} overrides it with "
                    f"`set({name} {value})`: make it a cache variable or guard it with "
                    f"if(NOT DEFINED {name})")
    passed.append(f"cmake_args over {combinations} combinations (variants x run_tests) sets {sorted(seen)}")

    # check(): ctest without `launch`, `fuzz` and `cluster`, and without `gpu` unless +cuda on a
    # node with a GPU.
    labels_in_tests = {label for found in re.findall(r"LABELS\s+\"?([a-z0-9_;]+)", cmake_source)
                       for label in found.split(";")}
    if "check" not in cls.__dict__:
        problem("no check(): `spack install --test=root` would run CMakePackage's default `ninja test`, "
                "launch and gpu tests included")
    else:
        always = {"launch", "fuzz", "cluster"}
        cases = [({"cuda": False}, False, True, always | {"gpu", "interop"}),
                 ({"cuda": True}, False, True, always | {"gpu", "interop"}),
                 ({"cuda": True}, True, True, always | {"interop"}),
                 ({"cuda": False, "interop": True}, False, True, always | {"gpu"}),
                 ({"cuda": True, "interop": True}, True, False, always)]
        for overrides, gpu, h5py, want in cases:
            variants = {n: bool(declared[n].get("default", False)) for n in booleans}
            variants.update(overrides)
            variants["cuda_arch"] = ("90",) if variants.get("cuda") else ("none",)
            pkg = cls(FakeSpec(variants), run_tests=True)
            pkg._gpu_visible = lambda: gpu
            pkg._debian_h5py = lambda: h5py
            Calls.log = []
            try:
                pkg.check()
            except Exception as e:  # noqa: BLE001
                problem(f"check() with {overrides}, GPU={gpu} raised {type(e).__name__}: {e}")
                continue
            runs = [(path, args) for kind, path, args in Calls.log if kind == "run"]
            ctest = [args for path, args in runs if os.path.basename(path) == "ctest"]
            if not ctest:
                problem(f"check() with {overrides}, GPU={gpu} runs no ctest ({runs})")
                continue
            args = ctest[0]
            excluded = set()
            for flag in ("-LE", "--label-exclude"):
                if flag in args and args.index(flag) + 1 < len(args):
                    excluded |= set(re.split(r"[|]", args[args.index(flag) + 1].strip("^$()")))
            if excluded != want:
                problem(f"check() with {overrides}, GPU={gpu} excludes labels {sorted(excluded)}, "
                        f"expected {sorted(want)}")
            names = args[args.index("--exclude-regex") + 1] if "--exclude-regex" in args else ""
            if h5py == bool(re.search(r"e2e_bad_checkpoints", names)):
                problem(f"check() with Debian's python3 {'able' if h5py else 'unable'} to import h5py "
                        f"excludes the tests {names!r}: the tests that need it are left out exactly "
                        "when it cannot")
            said = " ".join(path for kind, path, _ in Calls.log if kind == "msg")
            for label in want:
                if f"`{label}`" not in said:
                    problem(f"check() leaves out label {label!r} without saying why (tty.msg)")
            if not any(kind == "cd" and path == pkg.builder.build_directory for kind, path, _ in Calls.log):
                problem("check() does not run ctest in self.builder.build_directory")
        for label in ("launch", "gpu", "fuzz", "interop", "cluster"):
            if label not in labels_in_tests:
                problem(f"check() leaves out label {label!r}, which no test of the project has")
        passed.append("check(): ctest -LE launch|fuzz|cluster|gpu|interop (gpu kept with +cuda on a GPU node, "
                      "interop with +interop), reasons printed")

    # The environment and the repository description.
    with open(os.path.join(root, "spack", "repo.yaml")) as f:
        repo = yaml.safe_load(f)
    if not (repo or {}).get("repo", {}).get("namespace"):
        problem("spack/repo.yaml has no repo.namespace")
    env_file = os.path.join(root, "spack", "spack.yaml")
    try:
        with open(env_file) as f:
            env = (yaml.safe_load(f) or {}).get("spack")
    except yaml.YAMLError as e:
        problem(f"spack/spack.yaml is not valid YAML: {e}")
        env = None
    if not env:
        problem("spack/spack.yaml has no top-level `spack:`")
    else:
        for key, schema in (("specs", SPEC_LIST_SCHEMA), ("develop", DEVELOP_SCHEMA)):
            if key not in env:
                continue
            validator = jsonschema.Draft7Validator(schema)
            for error in sorted(validator.iter_errors(env[key]), key=lambda e: list(e.path)):
                location = "/".join(str(p) for p in error.path)
                problem(f"spack.yaml: {key}[{location}] = {error.instance!r} is not valid under "
                        f"Spack's schema for `{key}` ({error.message.splitlines()[0][:120]}); "
                        "quote spec strings that contain `: `")
        strings = []
        for item in env.get("specs") or []:
            if isinstance(item, str):
                strings.append(item)
            elif isinstance(item, dict):
                strings += [s for row in item.get("matrix") or [] for s in row if isinstance(s, str)]
        kolos_specs = [s for s in strings if s.startswith("kolos")]
        if not kolos_specs:
            problem("spack.yaml: no kolos spec")
        for s in strings:
            name = re.match(r"[\w-]*", s).group(0)
            if name == "kolos":
                check_condition(s, "spack.yaml spec")
            elif name in KNOWN_PACKAGES:
                for sign, variant in variant_tokens(s):
                    if variant not in KNOWN_PACKAGES[name]:
                        problem(f"spack.yaml spec {s!r}: {name} has no variant {variant!r}")
            elif name:
                problem(f"spack.yaml spec {s!r}: {name!r} is not a known Spack package")
        for s in kolos_specs + [d.get("spec", "") for d in (env.get("develop") or {}).values()
                                if isinstance(d, dict)]:
            r = version_range(s)
            if r and r[0] and not any(v == r[0] or v.startswith(r[0] + ".") for v in versions):
                problem(f"spack.yaml: {s!r} names version {r[0]}, which the recipe does not declare {versions}")
        for path in env.get("repos") or []:
            if not os.path.exists(os.path.join(root, "spack", path, "repo.yaml")):
                problem(f"spack.yaml: repo {path!r} has no repo.yaml")
        develop = env.get("develop") or {}
        if "kolos" not in develop:
            problem("spack.yaml: no `develop: kolos:` entry, so the environment has no source for kolos")
        for name, dev in develop.items():
            if not isinstance(dev, dict):
                continue
            path = os.path.normpath(os.path.join(root, "spack", dev.get("path", "")))
            if not os.path.exists(os.path.join(path, "CMakeLists.txt")):
                problem(f"spack.yaml: develop {name} path {dev.get('path')!r} is not the kolos checkout")
        passed.append(f"spack.yaml: specs {strings} valid under Spack's spec-list schema")

    spack_dir = os.environ.get("KOLOS_SPACK")
    if spack_dir:
        real_spack_checks(root, spack_dir, problem, passed)
    else:
        passed.append("only the stand-in for spack.package was used (no KOLOS_SPACK): a recipe that "
                      "passes it can still fail in Spack")

    if problems:
        print(f"{len(problems)} problem(s)")
        return 1
    for line in passed:
        print("ok:", line)
    print(f"PASS: recipe kolos: variants {sorted(declared)}, {len(dependencies)} dependencies")
    return 0


if __name__ == "__main__":
    sys.exit(main())
