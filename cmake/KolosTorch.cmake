# Which LibTorch kolos builds against (KOLOS_TORCH):
#
#   wheel   (default) the LibTorch inside a PyPI torch wheel installed in a
#           virtual environment (scripts/install-venv.sh), CPU libraries only.
#   system  find_package(Torch): a LibTorch named by CMAKE_PREFIX_PATH, e.g.
#           the CUDA LibTorch inside a Python torch on a GPU machine
#           (`torch.utils.cmake_prefix_path`).
#
# kolos needs LibTorch 2.0 or newer. 1.x is refused at configure time:
# Debian 12's libtorch-dev (1.13) has no fp16 matmul on the CPU and no CUDA,
# and CI cannot build and test two LibTorch trees within its hour on two
# cores (docs/building.md).
#
# The wheel is a CUDA build. Its TorchConfig.cmake finds the CUDA toolkit
# (through Caffe2Config's public/cuda.cmake), links libtorch.so and with it
# libtorch_cuda.so, cuDNN, cuBLAS, NCCL, and fails on a machine without
# them. `wheel` therefore does not call it: it imports the two libraries a
# CPU build needs, libtorch_cpu.so and libc10.so, with the include
# directories, definitions and C++ standard that TorchConfig would give them.
# libtorch_cpu.so itself still needs libcudart.so.13 and libcupti.so.13 when
# it is loaded (Kineto's profiler links them; nothing initialises a GPU): the
# wheel's RPATH finds them in <site-packages>/nvidia/cu13/lib, where
# install-venv.sh puts the two small nvidia-cuda-runtime/-cupti wheels.
#
# Sets KOLOS_TORCH_VERSION ("1.13.1", "2.15.0") and TORCH_LIBRARIES (what a
# target that uses LibTorch links).
set(KOLOS_TORCH "wheel" CACHE STRING "LibTorch to build against: system (find_package) or wheel")
set_property(CACHE KOLOS_TORCH PROPERTY STRINGS system wheel)
set(KOLOS_VENV "${PROJECT_SOURCE_DIR}/.cache/torch-venv" CACHE PATH
    "Virtual environment with the torch wheel (scripts/install-venv.sh; KOLOS_TORCH=wheel)")

if(KOLOS_TORCH STREQUAL "system")
  # LibTorch's CMake (Caffe2's public/cuda.cmake) changes two variables of
  # this scope for the .cu files of a torch extension: it sets a defined
  # CMAKE_CUDA_ARCHITECTURES to OFF ("pytorch is not compatible with
  # CMAKE_CUDA_ARCHITECTURES"), and appends to CMAKE_CUDA_FLAGS one -gencode
  # per entry of TORCH_CUDA_ARCH_LIST (by default every architecture the
  # LibTorch was built for, 11 for the 2.15 wheel) with its nvcc options.
  # kolos's .cu files include no LibTorch: they are compiled for the
  # architectures the user (or Spack's cuda_arch) gave, and nothing else.
  # So both are put back: the value CMakeLists.txt read before this file,
  # or the cache entry (unset drops the OFF that hides it).
  set(kolos_cuda_flags "${CMAKE_CUDA_FLAGS}")
  find_package(Torch REQUIRED)
  set(CMAKE_CUDA_FLAGS "${kolos_cuda_flags}")
  if(DEFINED KOLOS_CUDA_ARCHITECTURES_GIVEN)
    set(CMAKE_CUDA_ARCHITECTURES "${KOLOS_CUDA_ARCHITECTURES_GIVEN}")
  else()
    unset(CMAKE_CUDA_ARCHITECTURES)
  endif()
  set(KOLOS_TORCH_VERSION "${Torch_VERSION}")
  # A pip PyTorch finds its CUDA libraries (site-packages/nvidia/*/lib)
  # through its RPATH. The linker resolves libtorch_cuda.so's dependencies
  # (NCCL, cuBLAS, ...) from the -rpath folders first, where a CUDA
  # toolkit's older copies may lie: name the wheel's folders first.
  file(GLOB torch_nvidia_libs "${TORCH_INSTALL_PREFIX}/../nvidia/*/lib")
  foreach(dir IN LISTS torch_nvidia_libs)
    string(APPEND CMAKE_EXE_LINKER_FLAGS " -Wl,-rpath-link,${dir}")
    string(APPEND CMAKE_SHARED_LINKER_FLAGS " -Wl,-rpath-link,${dir}")
  endforeach()
  # LibTorch's CMake config appends to CMAKE_CXX_FLAGS (-D_GLIBCXX_USE_CXX11_ABI);
  # keep them so every target, torch-free ones included, shares one ABI.
elseif(KOLOS_TORCH STREQUAL "wheel")
  # KOLOS_TORCH_PACKAGE names the torch package folder itself (the Spack
  # recipe's ~cuda build: py-torch's <prefix>/lib/python3.X/site-packages/torch),
  # so that KOLOS_VENV stays free for the tests' Python.
  set(KOLOS_TORCH_PACKAGE "" CACHE PATH
      "The torch package folder (site-packages/torch) to import LibTorch's CPU libraries from; default: the one in KOLOS_VENV")
  if(KOLOS_TORCH_PACKAGE)
    set(torch_dirs "${KOLOS_TORCH_PACKAGE}")
  else()
    file(GLOB torch_dirs "${KOLOS_VENV}/lib/python3*/site-packages/torch")
  endif()
  list(LENGTH torch_dirs n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "KOLOS_TORCH=wheel: expected one torch package in ${KOLOS_VENV}/lib/python3*/site-packages, "
                        "found ${n}. Create the environment with scripts/install-venv.sh "
                        "(or set -DKOLOS_VENV=DIR to one that has it, or -DKOLOS_TORCH_PACKAGE=DIR to the torch folder).")
  endif()
  set(KOLOS_TORCH_DIR "${torch_dirs}" CACHE INTERNAL "")
  set(lib "${KOLOS_TORCH_DIR}/lib")
  foreach(f IN ITEMS "${lib}/libtorch_cpu.so" "${lib}/libc10.so"
                     "${KOLOS_TORCH_DIR}/share/cmake/Torch/TorchConfigVersion.cmake")
    if(NOT EXISTS "${f}")
      message(FATAL_ERROR "KOLOS_TORCH=wheel: ${f} is missing; is ${KOLOS_TORCH_DIR} a LibTorch-carrying torch wheel?")
    endif()
  endforeach()
  file(STRINGS "${KOLOS_TORCH_DIR}/share/cmake/Torch/TorchConfigVersion.cmake" line
       REGEX "set\\(PACKAGE_VERSION \"[0-9.]+\"\\)")
  string(REGEX REPLACE ".*\"([0-9.]+)\".*" "\\1" KOLOS_TORCH_VERSION "${line}")

  # The C++ ABI the wheel was built with (torch._C._GLIBCXX_USE_CXX11_ABI):
  # std::string in libc10's exported signatures is std::__cxx11::basic_string
  # exactly when it is 1. Read from the library, so that no Python runs here.
  file(STRINGS "${lib}/libc10.so" cxx11 REGEX "__cxx11" LIMIT_COUNT 1)
  if(cxx11)
    set(KOLOS_TORCH_CXX11_ABI 1)
  else()
    set(KOLOS_TORCH_CXX11_ABI 0)
  endif()

  add_library(kolos_torch_c10 SHARED IMPORTED)
  set_target_properties(kolos_torch_c10 PROPERTIES IMPORTED_LOCATION "${lib}/libc10.so")
  add_library(kolos_torch_cpu SHARED IMPORTED)
  set_target_properties(kolos_torch_cpu PROPERTIES
    IMPORTED_LOCATION "${lib}/libtorch_cpu.so"
    INTERFACE_INCLUDE_DIRECTORIES "${KOLOS_TORCH_DIR}/include;${KOLOS_TORCH_DIR}/include/torch/csrc/api/include"
    # As the wheel's Caffe2Targets.cmake declares them for torch_cpu.
    INTERFACE_COMPILE_DEFINITIONS "USE_DISTRIBUTED;USE_C10D_GLOO;USE_RPC;USE_TENSORPIPE;_GLIBCXX_USE_CXX11_ABI=${KOLOS_TORCH_CXX11_ABI}"
    INTERFACE_LINK_LIBRARIES kolos_torch_c10)
  # LibTorch 2.10 and later refuse to compile as anything older than C++20
  # (torch/all.h: "#error C++20 or later"). TorchConfig.cmake puts cxx_std_20
  # on its target; here the whole build becomes C++20 instead, because a
  # C++ feature on a target with CUDA sources (libkolos_core) would also ask
  # for a CUDA20 dialect. kolos's code is C++17 and compiles as C++20 too;
  # the default (1.13) build keeps it C++17. The .cu sources include no
  # LibTorch and stay C++17 (CUDA_STANDARD would otherwise follow
  # CXX_STANDARD, and CMake 3.25 knows no C++20 flag for nvcc 13).
  if(KOLOS_TORCH_VERSION VERSION_GREATER_EQUAL 2.10)
    set(CMAKE_CXX_STANDARD 20)
    set(CMAKE_CUDA_STANDARD 17)
  endif()
  # Torch-free targets share the ABI too (std::string crosses between them).
  add_compile_definitions(_GLIBCXX_USE_CXX11_ABI=${KOLOS_TORCH_CXX11_ABI})
  set(TORCH_LIBRARIES kolos_torch_cpu)
  # An installed kolos loads the wheel's LibTorch from the environment (an
  # absolute path: the install depends on it). Without it the loader would
  # take Debian's libtorch_cpu.so, which has the same soname.
  list(APPEND CMAKE_INSTALL_RPATH "${lib}")
else()
  message(FATAL_ERROR "KOLOS_TORCH is `${KOLOS_TORCH}`; valid: system, wheel")
endif()

if(NOT KOLOS_TORCH_VERSION)
  set(KOLOS_TORCH_VERSION "unknown")
elseif(KOLOS_TORCH_VERSION VERSION_LESS 2.0)
  message(FATAL_ERROR "LibTorch ${KOLOS_TORCH_VERSION} (KOLOS_TORCH=${KOLOS_TORCH}, ${Torch_DIR}) is too old: kolos needs "
                      "LibTorch 2.0 or newer. Use the default KOLOS_TORCH=wheel (scripts/install-venv.sh installs it), "
                      "or name a LibTorch 2.x with CMAKE_PREFIX_PATH (docs/building.md).")
endif()
