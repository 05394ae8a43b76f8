# Spack recipe for kolos (docs/launching.md, "Spack").
#   spack repo add spack/ && spack install kolos +cuda cuda_arch=90
from spack.package import *


class Kolos(CMakePackage, CudaPackage):
    """Parallel training of deep-learning models from C++17 over MPI: data,
    tensor, pipeline and sequence parallelism and ZeRO as plugins, chosen in
    one TOML file; launched by mpirun, Slurm (srun) or a Kubernetes MPIJob."""

    homepage = "https://github.com/kolos/kolos"
    git = "https://github.com/kolos/kolos.git"

    maintainers("kolos")

    version("main", branch="main")
    version("0.1.0", tag="v0.1.0")

    # `cuda` and `cuda_arch` come from CudaPackage.
    variant("nccl", default=True, when="+cuda", description="NCCL collectives for CUDA tensors")
    variant("ucx", default=True, description="UCX point-to-point transport and MPI's UCX PML")
    variant(
        "hdf5_parallel",
        default=True,
        description="Link the MPI build of HDF5 (checkpoints are one serial file per rank either way)",
    )
    variant("tests", default=False, description="Build the CTest suite")

    generator("ninja")

    depends_on("cmake@3.25:", type="build")
    depends_on("ninja", type="build")
    depends_on("pkgconfig", type="build")

    # MPI bootstraps every run; kolos needs MPI_THREAD_MULTIPLE (a
    # communication thread per process group). OpenMPI is the tested MPI.
    depends_on("mpi")
    depends_on("openmpi +cuda", when="+cuda ^[virtuals=mpi] openmpi")
    depends_on("openmpi fabrics=ucx", when="+ucx ^[virtuals=mpi] openmpi")
    depends_on("ucx", when="+ucx")
    depends_on("ucx +cuda", when="+ucx +cuda")
    depends_on("nccl", when="+nccl")

    # LibTorch: the C++ library inside PyTorch (its share/cmake has TorchConfig.cmake).
    depends_on("py-torch@1.13:")
    depends_on("py-torch +cuda", when="+cuda")
    depends_on("py-torch ~cuda", when="~cuda")
    depends_on("py-torch +nccl", when="+nccl")

    depends_on("hdf5@1.10: +mpi", when="+hdf5_parallel")
    depends_on("hdf5@1.10: ~mpi", when="~hdf5_parallel")
    depends_on("boost@1.74: +program_options")
    depends_on("toml11@3.7:")
    depends_on("googletest", type="test", when="+tests")

    conflicts("%gcc@:8", msg="kolos needs C++17 with <filesystem> (GCC 9 or newer)")

    def cmake_args(self):
        spec = self.spec
        args = [
            self.define("KOLOS_WITH_CUDA", "ON" if spec.satisfies("+cuda") else "OFF"),
            self.define_from_variant("KOLOS_WITH_UCX", "ucx"),
            self.define_from_variant("KOLOS_BUILD_TESTS", "tests"),
            self.define("KOLOS_BUILD_BENCH", False),
            self.define("HDF5_PREFER_PARALLEL", spec.satisfies("+hdf5_parallel")),
        ]
        if spec.satisfies("+cuda"):
            args.append(self.define_from_variant("KOLOS_WITH_NCCL", "nccl"))
            archs = spec.variants["cuda_arch"].value
            if archs and archs[0] != "none":
                args.append(self.define("CMAKE_CUDA_ARCHITECTURES", ";".join(archs)))
        return args

    def setup_run_environment(self, env):
        env.prepend_path("KOLOS_PLUGIN_PATH", join_path(self.prefix.lib, "kolos", "plugins"))
