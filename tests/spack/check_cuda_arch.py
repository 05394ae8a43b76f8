#!/usr/bin/python3
"""Checks that CMAKE_CUDA_ARCHITECTURES reaches nvcc, configure only.

    check_cuda_arch.py CMAKE SOURCE_DIR SCRATCH_DIR NVCC TORCH_CMAKE_DIR KOLOS_VENV

Spack's `cuda_arch=90` becomes -DCMAKE_CUDA_ARCHITECTURES=90. LibTorch's
CMake sets that variable to OFF in the including scope and appends its own
-gencode list to CMAKE_CUDA_FLAGS, so kolos's .cu files were compiled for
every architecture LibTorch was built for. This configures the project
(no build) in scratch folders and reads build.ninja's FLAGS line of every
.cu object:
  - KOLOS_TORCH=system (the recipe's mode, LibTorch's TorchConfig.cmake from
    TORCH_CMAKE_DIR) with -DCMAKE_CUDA_ARCHITECTURES=90 and no
    TORCH_CUDA_ARCH_LIST (so LibTorch's own list would show): sm_90 with its
    PTX only, on every .cu file;
  - the same with KOLOS_TORCH=wheel, where KOLOS_VENV has the torch wheel
    (a Spack build has none: the case is then left out, saying so);
  - KOLOS_TORCH=system with no value: kolos's default list (75-real 80-real
    86-real 90 from CUDA 13 on, 70-real before), nothing else.
Each .cu file must have exactly the architectures asked for: one extra or one
missing fails. Prints what it found; exits 1 on any difference.
"""
import glob
import os
import re
import shutil
import subprocess
import sys

ARCH = re.compile(r"(?:-gencode[= ]|--generate-code=)arch=compute_(\w+),code=\[?([\w,]+)\]?|-arch[= ](\S+)")


def configure(cmake, source, scratch, nvcc, extra):
    shutil.rmtree(scratch, ignore_errors=True)
    cmd = [cmake, "-S", source, "-B", scratch, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
           "-DKOLOS_WITH_CUDA=ON", f"-DCMAKE_CUDA_COMPILER={nvcc}", "-DKOLOS_BUILD_TESTS=OFF",
           "-DKOLOS_BUILD_BENCH=OFF", "-DKOLOS_CCACHE=OFF"] + extra
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if run.returncode != 0:
        print(run.stdout[-4000:])
        raise SystemExit(f"FAIL: configure failed: {' '.join(cmd)}")
    return run.stdout


def cu_architectures(scratch):
    """{object: sorted list of 'compute_X:sm_X,...'} from build.ninja."""
    found = {}
    current = None
    with open(os.path.join(scratch, "build.ninja")) as f:
        for line in f:
            m = re.match(r"build (\S+\.cu\.o): CUDA_COMPILER", line)
            if m:
                current = m.group(1)
                found[current] = []
                continue
            if current and line.startswith("  FLAGS = "):
                for g in ARCH.finditer(line):
                    if g.group(3):
                        found[current].append(f"-arch={g.group(3)}")
                    else:
                        found[current].append(f"compute_{g.group(1)}:{g.group(2)}")
                current = None
            elif current and not line.startswith("  "):
                current = None
    return {k: sorted(v) for k, v in found.items()}


def main():
    cmake, source, scratch, nvcc, torch_cmake, venv = sys.argv[1:7]
    version = subprocess.run([nvcc, "--version"], stdout=subprocess.PIPE, text=True).stdout
    major = int(re.search(r"release (\d+)", version).group(1))
    default = ["compute_75:sm_75", "compute_80:sm_80", "compute_86:sm_86", "compute_90:compute_90,sm_90"]
    if major < 13:
        default.insert(0, "compute_70:sm_70")
    cases = [
        ("system, cuda_arch 90", ["-DKOLOS_TORCH=system", f"-DCMAKE_PREFIX_PATH={torch_cmake}",
                                  "-DCMAKE_CUDA_ARCHITECTURES=90"],
         ["compute_90:compute_90,sm_90"]),
        ("wheel, cuda_arch 90", ["-DKOLOS_TORCH=wheel", f"-DKOLOS_VENV={venv}",
                                 "-DCMAKE_CUDA_ARCHITECTURES=90"],
         ["compute_90:compute_90,sm_90"]),
        ("system, no value (kolos's default)", ["-DKOLOS_TORCH=system", f"-DCMAKE_PREFIX_PATH={torch_cmake}"],
         default),
    ]
    if not glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "torch", "lib", "libtorch_cpu.so")):
        print(f"not run: wheel, cuda_arch 90: no torch wheel in KOLOS_VENV={venv}")
        cases = [c for c in cases if not c[0].startswith("wheel")]
    failed = False
    for name, extra, want in cases:
        configure(cmake, source, scratch, nvcc, extra)
        found = cu_architectures(scratch)
        if not found:
            print(f"FAIL: {name}: no .cu object in build.ninja")
            failed = True
            continue
        bad = {obj: archs for obj, archs in found.items() if archs != sorted(want)}
        for obj, archs in sorted(bad.items()):
            print(f"FAIL: {name}: {obj} compiled for {archs}, expected {sorted(want)}")
        if bad:
            failed = True
        else:
            print(f"ok: {name}: {len(found)} .cu files, each for {sorted(want)} only")
    shutil.rmtree(scratch, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
