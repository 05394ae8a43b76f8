# Spack recipe for kolos (docs/launching.md, "Spack"). kolos has no public
# source address, so Spack builds it from a checkout:
#   spack repo add spack/
#   spack dev-build kolos@0.1.0               (from the checkout's top folder)
#   spack env activate spack/ && spack install  (spack.yaml: develop path ..)
import os

from spack.package import *


class Kolos(CMakePackage, CudaPackage):
    """Parallel training of deep-learning models from C++17 over MPI: data,
    tensor, pipeline and sequence parallelism and ZeRO as plugins, chosen in
    one TOML file; launched by mpirun, Slurm (srun) or a Kubernetes MPIJob.

    kolos is not published at a public address, so this recipe has no
    homepage, url or git and its version names no tag: build it from a
    checkout with `spack dev-build kolos@0.1.0` or in the environment
    spack/spack.yaml, which `spack develop`s the checkout it sits in. A plain
    `spack install kolos` outside such an environment has nothing to fetch.
    """

    # The project's version (CMakeLists.txt `project(kolos VERSION ...)`),
    # built from the source folder that `spack dev-build` or `develop` names.
    version("0.1.0")

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

    # googletest (with gmock): in the graph whenever the tests are built,
    # that is with +tests, and with `spack install --test=root` (type="test").
    depends_on("googletest@1.10: +gmock", type=("build", "link"), when="+tests")
    depends_on("googletest@1.10: +gmock", type="test")

    conflicts("%gcc@:8", msg="kolos needs C++17 with <filesystem> (GCC 9 or newer)")

    def cmake_args(self):
        spec = self.spec
        args = [
            # py-torch's LibTorch through find_package(Torch), not a wheel.
            self.define("KOLOS_TORCH", "system"),
            self.define("KOLOS_WITH_CUDA", "ON" if spec.satisfies("+cuda") else "OFF"),
            self.define("KOLOS_BUILD_TESTS", spec.satisfies("+tests") or self.run_tests),
            self.define("KOLOS_BUILD_BENCH", False),
            self.define("HDF5_PREFER_PARALLEL", spec.satisfies("+hdf5_parallel")),
        ]
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
                args.append(self.define("CMAKE_CUDA_ARCHITECTURES", ";".join(archs)))
        return args

    def _gpu_visible(self):
        """True when this node has an NVIDIA GPU that the `gpu` tests can use."""
        return os.path.exists("/dev/nvidia0")

    def check(self):
        """Runs the CTest suite (with `spack install --test=root`), leaving
        out what a build node cannot run: the `launch` tests (a Slurm with
        munge started as root, and checks that need kubectl, shellcheck and
        Debian's python3-yaml), and the `gpu` tests unless this is a +cuda
        build on a node with a GPU."""
        excluded = ["launch"]
        if not (self.spec.satisfies("+cuda") and self._gpu_visible()):
            excluded.append("gpu")
        ctest = Executable(self.spec["cmake"].prefix.bin.ctest)
        with working_dir(self.build_directory):
            ctest(
                "--output-on-failure",
                "--label-exclude",
                "|".join(excluded),
                "--timeout",
                "900",
                "-j",
                str(make_jobs),
            )

    def setup_run_environment(self, env):
        # The kolos binaries find lib/kolos/plugins from their own path; this
        # is for programs of the user's that link libkolos_core.
        env.prepend_path("KOLOS_PLUGIN_PATH", join_path(self.prefix.lib, "kolos", "plugins"))
