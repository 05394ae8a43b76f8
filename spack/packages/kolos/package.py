# Spack recipe for kolos (docs/launching.md, "Spack"). kolos has no public
# source address. Spack builds it from a checkout:
#   spack repo add spack/
#   spack dev-build kolos@0.1.0               (from the checkout's top folder)
#   spack env activate spack/ && spack install  (spack.yaml: develop path ..)
# or from a release tarball (scripts/release-tarball.sh) that a site puts in
# this repository's releases/ folder or in a Spack mirror of its own.
import glob
import os

import llnl.util.tty as tty

from spack.package import *

# The Spack repository this recipe sits in (spack/ of a kolos checkout, or a
# site's copy of it): release tarballs are looked for in its releases/.
_REPO_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Tests that run Debian's /usr/bin/python3 with python3-h5py and numpy
# (tests/e2e/checkpoint/cases.sh, tests/e2e/bad_input/checkpoints.sh).
_DEBIAN_H5PY_TESTS = (
    "^e2e_checkpoint_(interop|resume_after_stop|restart_smaller|kill_mid_save|damaged)$",
    "^e2e_bad_checkpoints$",
)


def _torch_arch(arch):
    """Spack's cuda_arch in LibTorch's TORCH_CUDA_ARCH_LIST spelling: 90 -> 9.0,
    90a -> 9.0a, 100f -> 10.0f."""
    digits = arch.rstrip("abcdefghijklmnopqrstuvwxyz")
    return f"{digits[:-1]}.{digits[-1]}{arch[len(digits):]}"


class Kolos(CMakePackage, CudaPackage):
    """Parallel training of deep-learning models from C++17 over MPI: data,
    tensor, pipeline and sequence parallelism and ZeRO as plugins, chosen in
    one TOML file; launched by mpirun, Slurm (srun) or a Kubernetes MPIJob.

    kolos is not published at a public address. Build it from a checkout with
    `spack dev-build kolos@0.1.0`, or in the environment spack/spack.yaml,
    which `spack develop`s the checkout it sits in; or from a release tarball
    kolos-<version>.tar.gz (scripts/release-tarball.sh) placed in this
    repository's releases/ folder or in a site mirror (`spack mirror add`).
    A version is checksummed once its release tarball exists: 0.1.0 has not
    been released yet, so it has no checksum and Spack fetches its tarball
    with a warning, unverified.
    """

    # Where a release tarball (scripts/release-tarball.sh) is fetched from
    # when no mirror has it: the releases/ folder next to packages/ in this
    # Spack repository. A mirror serves it as kolos/kolos-<version>.tar.gz.
    # Versions: the project's (CMakeLists.txt `project(kolos VERSION ...)`).
    # Each release's sha256 is that of scripts/release-tarball.sh's tarball of
    # the release tag (deterministic: the same commit gives the same bytes),
    # written here in a commit after the tag. 0.1.0 is tag v0.1.0, commit
    # d913b48dc0e028a257e378c699d65587d6d5a6ff.
    url = f"file://{_REPO_DIR}/releases/kolos-0.1.0.tar.gz"
    version("0.1.0", sha256="e80bb6f8883edfbf3a8e3c486c89d91fe358fcf9bba7f14e67513464194ca308")

    # `cuda` and `cuda_arch` come from CudaPackage.
    variant("nccl", default=True, when="+cuda", description="NCCL collectives for CUDA tensors")
    variant(
        "ucx",
        default=True,
        description="Require an OpenMPI built with UCX (fabrics=ucx), whose UCX PML `kolos run` "
        "selects at run time; kolos itself has no UCX transport and does not link UCX",
    )
    variant(
        "hdf5_parallel",
        default=True,
        description="Link the MPI build of HDF5 (checkpoints are one serial file per rank either way)",
    )
    variant(
        "tests",
        default=False,
        description="Build the CTest suite (`spack install --test=root` builds and runs it too)",
    )
    variant(
        "interop",
        default=False,
        description="With --test=root: run the tests that compare kolos with Python libraries "
        "(transformers, safetensors, h5py, tokenizers, sentencepiece) with Spack's python; "
        "without it check() leaves them out, saying so",
    )

    generator("ninja")

    depends_on("cmake@3.25:", type="build")
    depends_on("ninja", type="build")

    # MPI bootstraps every run; kolos needs MPI-3 and MPI_THREAD_MULTIPLE (a
    # communication thread per process group). OpenMPI is the tested MPI.
    depends_on("mpi@3:")
    depends_on("openmpi +cuda", when="+cuda ^[virtuals=mpi] openmpi")
    depends_on("openmpi fabrics=ucx", when="+ucx ^[virtuals=mpi] openmpi")

    # Upper bounds: the major versions whose APIs kolos is written against.
    # NCCL 2.x.
    depends_on("nccl@2", when="+nccl")

    # LibTorch: the C++ library inside PyTorch (its share/cmake has
    # TorchConfig.cmake). 2.x only: kolos refuses LibTorch 1.x at configure
    # time (docs/building.md).
    depends_on("py-torch@2.0:2")
    depends_on("py-torch +cuda", when="+cuda")
    depends_on("py-torch ~cuda", when="~cuda")
    depends_on("py-torch +nccl", when="+nccl")

    # Every CUDA library kolos links is built for the GPUs kolos is built for.
    for _arch in CudaPackage.cuda_arch_values:
        depends_on(f"py-torch +cuda cuda_arch={_arch}", when=f"+cuda cuda_arch={_arch}")
        depends_on(f"nccl +cuda cuda_arch={_arch}", when=f"+nccl cuda_arch={_arch}")

    # HDF5: the 1.10 to 1.14 C API (H5Pset_virtual, H5Literate with the
    # H5L_info_t of the default API mapping); 2.x changes the defaults.
    depends_on("hdf5@1.10:1.14")
    depends_on("hdf5 +mpi", when="+hdf5_parallel")
    depends_on("hdf5 ~mpi", when="~hdf5_parallel")
    # program_options' API has been stable since 1.74; no upper bound.
    depends_on("boost@1.74: +program_options")
    # toml11 4.x removed toml::string (run_config.cpp reads `as_string().str`).
    depends_on("toml11@3.7:3")
    # safetensors headers and Hugging Face config.json (`kolos ckpt import`).
    depends_on("nlohmann-json@3.2:")
    # libkolos_topology: hwloc 2.x (hwloc 3 renumbers the OS device types it
    # reads), found through pkg-config's hwloc.pc.
    depends_on("hwloc@2.0:2")
    depends_on("pkgconfig", type="build")
    # libkolos_tokenizer: PCRE2 (with its JIT) for tokenizer.json's
    # pre-tokenizer regexes, ICU's normalizers, SentencePiece models (the
    # 0.1 series, whose encoder the interop tests compare with).
    depends_on("pcre2 +jit")
    depends_on("icu4c")
    depends_on("sentencepiece@0.1")
    # `kolos serve`'s HTTP server (without it the command builds as a stub
    # that says so).
    depends_on("cpp-httplib@0.11:")
    # `kolos sample`'s PNG grid and `kolos data prepare --images`'s PNG and
    # JPEG images (`jpeg` is the virtual that libjpeg-turbo and libjpeg
    # provide; without either library the commands build and refuse that
    # format, saying so).
    depends_on("libpng@1.6:")
    depends_on("jpeg")

    # googletest (with gmock): in the graph whenever the tests are built,
    # that is with +tests, and with `spack install --test=root` (type="test").
    depends_on("googletest@1.10: +gmock", type=("build", "link"), when="+tests")
    depends_on("googletest@1.10: +gmock", type="test")

    # The `interop` tests' Python (tests/e2e/*: KOLOS_VENV/bin/python): Spack's
    # python with the packages they import, and py-torch (above).
    with when("+interop"):
        depends_on("python@3.9:", type="test")
        for _name in ("py-transformers", "py-safetensors", "py-h5py", "py-tokenizers",
                      "py-sentencepiece", "py-numpy"):
            depends_on(_name, type="test")

    conflicts("%gcc@:8", msg="kolos needs C++17 with <filesystem> (GCC 9 or newer)")

    def _torch_package(self):
        """py-torch's torch package folder (<prefix>/lib/python3.X/site-packages/torch):
        where its LibTorch (lib/, include/, share/cmake/) lies."""
        # lib64 is often a link to lib (a venv's is): one folder, two names.
        pattern = join_path(self.spec["py-torch"].prefix, "lib*", "python3*", "site-packages", "torch")
        found = sorted({os.path.realpath(p) for p in glob.glob(pattern)})
        if len(found) != 1:
            raise InstallError(f"py-torch: expected one torch package under {self.spec['py-torch'].prefix}, "
                               f"found {found}")
        return found[0]

    def _test_python_dir(self):
        """A folder with bin/python running Spack's python, for the tests'
        KOLOS_VENV (they run $KOLOS_VENV/bin/python; Spack's python prefix may
        have only python3, a Debian /usr never has bin/python)."""
        return join_path(self.builder.build_directory, "kolos-test-python")

    def cmake_args(self):
        spec = self.spec
        tests = spec.satisfies("+tests") or self.run_tests
        args = [
            self.define("KOLOS_WITH_CUDA", "ON" if spec.satisfies("+cuda") else "OFF"),
            self.define("KOLOS_BUILD_TESTS", tests),
            self.define("KOLOS_BUILD_BENCH", False),
            self.define("HDF5_PREFER_PARALLEL", spec.satisfies("+hdf5_parallel")),
            # Spack's builds never write the user's ccache.
            self.define("KOLOS_CCACHE", False),
        ]
        if spec.satisfies("+cuda"):
            # py-torch's LibTorch through its TorchConfig.cmake (find_package),
            # with its CUDA libraries.
            args.append(self.define("KOLOS_TORCH", "system"))
        else:
            # Only libtorch_cpu.so and libc10.so, imported from py-torch's
            # torch package as the default wheel build does: TorchConfig's
            # `torch` target would link libtorch_cuda.so (and need the CUDA
            # toolkit) whenever py-torch is a CUDA build. The install's RPATH
            # names py-torch's torch/lib, inside Spack's graph.
            args.append(self.define("KOLOS_TORCH", "wheel"))
            args.append(self.define("KOLOS_TORCH_PACKAGE", self._torch_package()))
        if spec.satisfies("+cuda"):
            # Spack's cuda, not whatever nvcc CMake would find first
            # (/usr/local/cuda on many nodes).
            args.append(self.define("CMAKE_CUDA_COMPILER", spec["cuda"].prefix.bin.nvcc))
            args.append(self.define_from_variant("KOLOS_WITH_NCCL", "nccl"))
            if spec.satisfies("+nccl"):
                args.append(self.define("KOLOS_NCCL_INCLUDE", spec["nccl"].prefix.include))
                args.append(self.define("KOLOS_NCCL_LIBRARY", spec["nccl"].libs[0]))
            archs = spec.variants["cuda_arch"].value
            if archs and archs[0] != "none":
                # kolos's .cu files (CMAKE_CUDA_ARCHITECTURES), and LibTorch's
                # CMake, which reads its own list (TORCH_CUDA_ARCH_LIST: 9.0, 9.0a).
                args.append(self.define("CMAKE_CUDA_ARCHITECTURES", ";".join(archs)))
                args.append(self.define("TORCH_CUDA_ARCH_LIST", ";".join(_torch_arch(a) for a in archs)))
        if tests and spec.satisfies("+interop"):
            folder = self._test_python_dir()
            mkdirp(join_path(folder, "bin"))
            wrapper = join_path(folder, "bin", "python")
            with open(wrapper, "w") as f:
                f.write(f'#!/bin/sh\nexec "{spec["python"].command.path}" "$@"\n')
            os.chmod(wrapper, 0o755)
            args.append(self.define("KOLOS_VENV", folder))
        return args

    def _gpu_visible(self):
        """True when this node has an NVIDIA GPU that the `gpu` tests can use."""
        return os.path.exists("/dev/nvidia0")

    def _debian_h5py(self):
        """True when Debian's /usr/bin/python3 imports h5py and numpy."""
        if not os.path.exists("/usr/bin/python3"):
            return False
        probe = Executable("/usr/bin/python3")
        probe("-c", "import h5py, numpy", output=os.devnull, error=os.devnull, fail_on_error=False)
        return probe.returncode == 0

    def check(self):
        """Runs the CTest suite (with `spack install --test=root`) in the build
        folder, leaving out, with the reason printed, what a build node cannot
        run or what needs programs outside this package's graph."""
        labels = {
            "launch": "needs root, a Slurm with munge, kubectl, shellcheck and Debian's python3-yaml",
            "fuzz": "builds its own project with clang++ and libFuzzer, outside this package's graph",
            "cluster": ("makes network namespaces, veth links and a bridge, and starts munged, "
                        "slurmctld and slurmd in them: needs root and Debian's slurm-wlm; run it "
                        "from a build tree (ctest -L cluster)"),
        }
        if not (self.spec.satisfies("+cuda") and self._gpu_visible()):
            labels["gpu"] = "needs a +cuda build on a node with a GPU (/dev/nvidia0)"
        if not self.spec.satisfies("+interop"):
            labels["interop"] = ("needs Python with transformers, safetensors, h5py, tokenizers and "
                                 "sentencepiece: build with +interop to run them")
        names = []
        if not self._debian_h5py():
            names += _DEBIAN_H5PY_TESTS
            tty.msg("kolos check(): leaving out " + " ".join(_DEBIAN_H5PY_TESTS) +
                    ": they run Debian's /usr/bin/python3 with python3-h5py and numpy, which "
                    "this node lacks")
        for label, why in labels.items():
            tty.msg(f"kolos check(): leaving out the `{label}` tests: {why}")
        args = ["--output-on-failure", "--label-exclude", "|".join(labels), "--timeout", "900",
                "-j", str(make_jobs)]
        if names:
            args += ["--exclude-regex", "|".join(names)]
        ctest = Executable(self.spec["cmake"].prefix.bin.ctest)
        with working_dir(self.builder.build_directory):
            ctest(*args)

    def setup_run_environment(self, env):
        # The kolos binaries find lib/kolos/plugins from their own path; this
        # is for programs of the user's that link libkolos_core.
        env.prepend_path("KOLOS_PLUGIN_PATH", join_path(self.prefix.lib, "kolos", "plugins"))
