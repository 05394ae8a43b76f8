"""A stand-in for the part of Spack 0.21's package API that kolos's recipe
(spack/packages/kolos/package.py) uses, so that check_recipe.py can load the
recipe and call its methods on a machine without Spack: the directives are
recorded (Recorder), a spec answers satisfies() on +x/~x and hands out fake
dependency prefixes (FakeSpec), and what the methods run is logged (Calls).
The real Spack checks are check_recipe.py's real_spack_checks."""
import atexit
import contextlib
import os
import re
import shutil
import sys
import tempfile
import types

class Recorder:
    pending = []
    conditions = []  # the `with when(...)` blocks the directives are inside

    @classmethod
    def directive(cls, kind):
        def record(*args, **kwargs):
            if cls.conditions:
                kwargs = dict(kwargs)
                kwargs["when"] = " ".join(cls.conditions + ([kwargs["when"]] if kwargs.get("when") else []))
            cls.pending.append((kind, args, kwargs))

        return record

    @classmethod
    @contextlib.contextmanager
    def when(cls, condition):
        cls.conditions.append(condition)
        try:
            yield
        finally:
            cls.conditions.pop()


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


class Prefix(str):
    """Spack's Prefix: attribute access joins path components."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Prefix(os.path.join(self, name))


# Fake installation prefixes (py-torch's has the torch package folder the
# recipe looks for) and build folders, removed at exit.
SCRATCH = tempfile.mkdtemp(prefix="check_recipe.")
atexit.register(shutil.rmtree, SCRATCH, True)
TORCH_PACKAGE = os.path.join(SCRATCH, "opt", "py-torch", "lib", "python3.11", "site-packages", "torch")
os.makedirs(TORCH_PACKAGE)


class FakeCommand:
    def __init__(self, path):
        self.path = path


class FakeDependency:
    def __init__(self, name):
        self.name = name
        self.prefix = Prefix(os.path.join(SCRATCH, "opt", name))
        self.libs = [os.path.join(self.prefix, "lib", f"lib{name}.so")]
        self.command = FakeCommand(os.path.join(self.prefix, "bin", "python3"))


class FakeSpec:
    """Enough of a Spack spec for the recipe's methods: variants,
    satisfies() on +x/~x, and spec["dep"].prefix / .libs."""

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

    def __getitem__(self, name):
        return FakeDependency(name)

    def __contains__(self, name):
        return False


class Calls:
    """What the recipe's methods ran: Executable calls and working_dir()."""

    log = []


def install_spack_standin(arch_values):
    """Installs spack, spack.package and llnl.util.tty in sys.modules; returns
    spack.package. arch_values: CudaPackage.cuda_arch_values."""
    package = types.ModuleType("spack.package")

    class Builder:
        """Spack 0.21's CMakeBuilder, as far as the recipe uses it. The
        package itself has no build_directory (Spack 0.21: only its builder
        has)."""

        def __init__(self, build_directory):
            self.build_directory = build_directory

    class PackageBase(metaclass=PackageMeta):
        def __init__(self, spec, run_tests=False):
            self.spec = spec
            self.run_tests = run_tests
            self._builder = Builder(tempfile.mkdtemp(prefix="spack-build-", dir=SCRATCH))

        @property
        def builder(self):
            return self._builder

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
        cuda_arch_values = tuple(arch_values)

    class Executable:
        def __init__(self, path):
            self.path = str(path)
            self.returncode = None

        def __call__(self, *args, **kwargs):
            Calls.log.append(("run", self.path, [str(a) for a in args]))
            self.returncode = 0

    class InstallError(Exception):
        pass

    @contextlib.contextmanager
    def working_dir(path):
        Calls.log.append(("cd", str(path), []))
        yield

    package.CMakePackage = CMakePackage
    package.CudaPackage = CudaPackage
    package.Executable = Executable
    package.working_dir = working_dir
    package.InstallError = InstallError
    package.mkdirp = lambda *paths: [os.makedirs(p, exist_ok=True) for p in paths]
    package.when = Recorder.when
    package.make_jobs = 2
    for kind in ("version", "variant", "depends_on", "conflicts", "maintainers", "generator",
                 "license", "patch", "provides", "requires", "resource", "extends"):
        setattr(package, kind, Recorder.directive(kind))
    package.join_path = os.path.join
    package.__all__ = [n for n in dir(package) if not n.startswith("_")]
    spack = types.ModuleType("spack")
    spack.package = package
    sys.modules["spack"] = spack
    sys.modules["spack.package"] = package
    # llnl.util.tty: Spack's messages (check() says what it leaves out).
    llnl, util, tty = (types.ModuleType(n) for n in ("llnl", "llnl.util", "llnl.util.tty"))
    tty.msg = tty.warn = tty.info = lambda *a, **k: Calls.log.append(("msg", " ".join(map(str, a)), []))
    llnl.util, util.tty = util, tty
    sys.modules.update({"llnl": llnl, "llnl.util": util, "llnl.util.tty": tty})
    return package
