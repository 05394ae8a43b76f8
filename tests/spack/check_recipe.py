#!/usr/bin/env python3
"""Checks the Spack recipe and environment in spack/ without Spack.

    check_recipe.py REPO_ROOT

Spack is not in Debian and cannot be fetched here, so a small stand-in for
`spack.package` records the directives the recipe calls (version, variant,
depends_on, conflicts, ...) and the checks below read them:
  - the recipe compiles and defines a CMakePackage with a homepage, a source
    (git or url) and versions, one of them the project's own version;
  - every variant named in a `when=`, a dependency's condition or the
    recipe's code (`satisfies("+x")`, `define_from_variant(..., "x")`) is
    declared;
  - every dependency is a known Spack package, with variants that package
    has (a short list kept below, from Spack's builtin repository);
  - the dependencies kolos needs are all there;
  - cmake_args(), run for each combination of the recipe's variants, only
    sets CMake variables that the project's CMake files read;
  - spack.yaml and repo.yaml agree with the recipe and point at this checkout.
Prints each problem; exits 1 when there is any.
"""
import itertools
import os
import re
import sys
import types

import yaml

# Spack packages the recipe may depend on, and the variants of theirs it may
# ask for (from spack/var/spack/repos/builtin/packages/*/package.py).
KNOWN_PACKAGES = {
    "mpi": set(),  # virtual
    "openmpi": {"cuda", "fabrics", "schedulers", "legacylaunchers", "static", "wrapper-rpath"},
    "mpich": {"cuda", "netmod", "pmi"},
    "ucx": {"cuda", "rocm", "verbs", "rdmacm", "thread_multiple", "cma"},
    "nccl": {"cuda_arch"},
    "cuda": set(),
    "py-torch": {"cuda", "nccl", "mpi", "distributed", "cuda_arch", "rocm", "openmp"},
    "libtorch": set(),
    "hdf5": {"mpi", "cxx", "fortran", "hl", "shared", "threadsafe", "api"},
    "boost": {"program_options", "filesystem", "system", "shared", "mpi", "cxxstd"},
    "toml11": set(),
    "cmake": set(),
    "ninja": set(),
    "pkgconfig": set(),
    "googletest": {"gmock", "shared"},
    "hwloc": {"cuda", "nvml"},
}
# What kolos cannot build without (root-level, unconditional).
REQUIRED = {"mpi", "boost", "toml11", "cmake"}
REQUIRED_ANY = [("py-torch", "libtorch")]


class Recorder:
    pending = []

    @classmethod
    def directive(cls, kind):
        def record(*args, **kwargs):
            cls.pending.append((kind, args, kwargs))
        return record


class PackageMeta(type):
    def __new__(mcs, name, bases, namespace):
        cls = super().__new__(mcs, name, bases, namespace)
        inherited = []
        for base in bases:
            inherited += getattr(base, "directives", [])
        cls.directives = inherited + Recorder.pending
        Recorder.pending = []
        return cls


class Variant:
    def __init__(self, value):
        self.value = value


class FakeSpec:
    """Enough of a Spack spec for cmake_args(): variants and satisfies()."""

    def __init__(self, variants):
        self._variants = variants
        self.variants = {k: Variant(v) for k, v in variants.items()}

    def satisfies(self, condition):
        for token in condition.split():
            match = re.fullmatch(r"([+~])(\w[\w-]*)", token)
            if not match:
                raise ValueError(f"satisfies({condition!r}): the stand-in only knows +x/~x")
            sign, name = match.groups()
            if name not in self._variants:
                raise KeyError(f"satisfies({condition!r}): variant {name!r} is not declared")
            if bool(self._variants[name]) != (sign == "+"):
                return False
        return True

    def __contains__(self, name):
        return False


def make_stub_module():
    package = types.ModuleType("spack.package")

    class PackageBase(metaclass=PackageMeta):
        def __init__(self, spec):
            self.spec = spec

        def define(self, name, value):
            if isinstance(value, bool):
                value = "ON" if value else "OFF"
            elif isinstance(value, (list, tuple)):
                value = ";".join(value)
            return f"-D{name}={value}"

        def define_from_variant(self, name, variant=None):
            variant = variant or name
            if variant not in self.spec._variants:
                raise KeyError(f"define_from_variant({name!r}, {variant!r}): variant not declared")
            return self.define(name, self.spec._variants[variant])

    class CMakePackage(PackageBase):
        pass

    Recorder.pending.append(("variant", ("cuda",), {"default": False}))
    Recorder.pending.append(("variant", ("cuda_arch",), {"multi": True, "when": "+cuda"}))

    class CudaPackage(PackageBase):
        pass

    package.CMakePackage = CMakePackage
    package.CudaPackage = CudaPackage
    for kind in ("version", "variant", "depends_on", "conflicts", "maintainers", "generator",
                 "license", "patch", "provides", "requires", "resource", "extends"):
        setattr(package, kind, Recorder.directive(kind))
    package.join_path = os.path.join
    package.__all__ = [n for n in dir(package) if not n.startswith("_")]
    spack = types.ModuleType("spack")
    spack.package = package
    sys.modules["spack"] = spack
    sys.modules["spack.package"] = package
    return package


def root_part(spec):
    """The part of a spec string before its first dependency (`^`)."""
    return spec.split("^", 1)[0]


def variant_tokens(spec):
    """(sign, name) for +x, ~x and name=value at the root of a spec string."""
    root = root_part(spec)
    found = [(m.group(1), m.group(2)) for m in re.finditer(r"(?:^|\s)([+~])([\w-]+)", root)]
    found += [("=", m.group(1)) for m in re.finditer(r"([\w-]+)=", root)]
    return found


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    recipe = os.path.join(root, "spack", "packages", "kolos", "package.py")
    problems = []

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
    make_stub_module()
    namespace = {"__name__": "kolos_recipe"}
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

    # Metadata and versions.
    if not getattr(cls, "homepage", ""):
        problem("no homepage")
    if not (getattr(cls, "git", "") or getattr(cls, "url", "")):
        problem("no source: set git or url")
    if not (cls.__doc__ or "").strip():
        problem("no docstring (Spack shows it as the description)")
    versions = [a[0] for a, _ in by_kind("version")]
    if not versions:
        problem("no version()")
    cmake_text = open(os.path.join(root, "CMakeLists.txt")).read()
    project = re.search(r"project\(kolos VERSION ([0-9.]+)", cmake_text)
    if project and project.group(1) not in versions:
        problem(f"the project's version {project.group(1)} (CMakeLists.txt) has no version() in the recipe")
    for args, kwargs in by_kind("version"):
        if getattr(cls, "git", "") and not ({"tag", "branch", "commit"} & set(kwargs)) and "sha256" not in kwargs:
            problem(f"version({args[0]!r}) names no tag, branch, commit or sha256")

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

    # Dependencies.
    dependencies = []
    for args, kwargs in by_kind("depends_on"):
        spec = args[0]
        name = re.match(r"[\w-]+", spec).group(0)
        dependencies.append((name, spec, kwargs.get("when")))
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
    unconditional = {n for n, _, when in dependencies if not when}
    for name in sorted(REQUIRED - unconditional):
        problem(f"no unconditional depends_on({name!r})")
    for options in REQUIRED_ANY:
        if not set(options) & unconditional:
            problem(f"no unconditional dependency on any of {options}")
    hdf5 = [(s, w) for n, s, w in dependencies if n == "hdf5"]
    if not any("+mpi" in s for s, _ in hdf5):
        problem("no depends_on('hdf5 +mpi') (parallel HDF5)")
    if not any("program_options" in s for n, s, _ in dependencies if n == "boost"):
        problem("boost is needed with +program_options")
    for variant, dep in (("ucx", "ucx"), ("nccl", "nccl")):
        if variant in declared and not any(n == dep and w and f"+{variant}" in w for n, _, w in dependencies):
            problem(f"variant {variant!r} has no depends_on({dep!r}, when='+{variant}')")
    for variant in ("cuda", "nccl", "ucx"):
        if variant not in declared:
            problem(f"variant {variant!r} is not declared")

    # cmake_args() for every combination of boolean variants: each -D must be
    # a variable the project's CMake files read.
    cmake_files = []
    for folder, _, files in os.walk(root):
        if "/build" in folder[len(root):] or "/.git" in folder:
            continue
        cmake_files += [os.path.join(folder, f) for f in files if f == "CMakeLists.txt" or f.endswith(".cmake")]
    cmake_source = "".join(open(f, errors="replace").read() for f in cmake_files)
    booleans = [n for n, k in declared.items() if isinstance(k.get("default", False), bool) and not k.get("multi")]
    seen = set()
    for values in itertools.product([False, True], repeat=len(booleans)):
        variants = dict(zip(booleans, values))
        variants["cuda_arch"] = ("90",) if variants.get("cuda") else ("none",)
        try:
            args = cls(FakeSpec(variants)).cmake_args()
        except Exception as e:  # noqa: BLE001 - report any failure of the recipe's code
            problem(f"cmake_args() with {variants} raised {type(e).__name__}: {e}")
            continue
        for arg in args:
            match = re.match(r"-D([A-Za-z_][A-Za-z0-9_]*)(:\w+)?=", arg)
            if not match:
                problem(f"cmake_args() returned {arg!r}, not -DNAME=VALUE")
                continue
            seen.add(match.group(1))
    for name in sorted(seen):
        if not name.startswith("CMAKE_") and not re.search(r"\b" + name + r"\b", cmake_source):
            problem(f"cmake_args() sets {name}, which no CMake file of the project reads")

    # The environment and the repository description.
    with open(os.path.join(root, "spack", "repo.yaml")) as f:
        repo = yaml.safe_load(f)
    if not (repo or {}).get("repo", {}).get("namespace"):
        problem("spack/repo.yaml has no repo.namespace")
    with open(os.path.join(root, "spack", "spack.yaml")) as f:
        env = (yaml.safe_load(f) or {}).get("spack")
    if not env:
        problem("spack/spack.yaml has no top-level `spack:`")
    else:
        specs = env.get("specs") or []
        kolos_specs = [s for s in specs if str(s).startswith("kolos")]
        if not kolos_specs:
            problem("spack.yaml: no kolos spec")
        for s in kolos_specs:
            check_condition(str(s), "spack.yaml spec")
        for path in env.get("repos") or []:
            if not os.path.exists(os.path.join(root, "spack", path, "repo.yaml")):
                problem(f"spack.yaml: repo {path!r} has no repo.yaml")
        for name, dev in (env.get("develop") or {}).items():
            path = os.path.normpath(os.path.join(root, "spack", dev.get("path", "")))
            if not os.path.exists(os.path.join(path, "CMakeLists.txt")):
                problem(f"spack.yaml: develop {name} path {dev.get('path')!r} is not the kolos checkout")

    if problems:
        print(f"{len(problems)} problem(s)")
        return 1
    print(f"PASS: recipe kolos: {len(versions)} versions, variants {sorted(declared)}, "
          f"{len(dependencies)} dependencies, cmake_args over {2 ** len(booleans)} variant combinations "
          f"sets {sorted(seen)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
