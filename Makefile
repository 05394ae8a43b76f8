# Entry points. Each installs missing Debian packages and the virtual
# environment with the torch wheel first (quietly when nothing is missing),
# then configures and builds with the `cpu` preset against that wheel's
# LibTorch 2.x.
#   make demo    train a small GPT on 2 MPI ranks with data parallelism
#   make test    build and run the whole CTest suite, then the LibTorch-free
#                sanitizer subset
#   make test-asan  that subset (`asan` preset, ASan + UBSan, into
#                build-asan); test-asan-full: all of it
#   make install install into $(PREFIX)
# TORCH=system builds against the LibTorch 2.x that find_package(Torch)
# finds instead (name it with CMAKE_PREFIX_PATH, e.g. a GPU node's PyTorch:
# `python -c 'import torch; print(torch.utils.cmake_prefix_path)'`), with
# the `system` preset into build-system.
PREFIX ?= $(CURDIR)/install
TORCH  ?= wheel
ifeq ($(TORCH),wheel)
PRESET := cpu
BUILD  ?= build
else ifeq ($(TORCH),system)
PRESET := system
BUILD  ?= build-system
else
$(error TORCH=$(TORCH): valid are wheel (LibTorch 2.x from the PyPI torch wheel, the default) and system (a LibTorch 2.x that CMAKE_PREFIX_PATH names))
endif
JOBS   ?= $(shell nproc)
# Tests at once: twice the cores. An MPI test counts its ranks (at most 2,
# tests/CMakeLists.txt), and many wait on process start-up, files and
# timeouts, so at -j 2 the cores were idle half the time; at -j 4 the suite
# kept them 75% busy (docs/performance.md, "CI time").
TEST_JOBS ?= $(shell echo $$((2 * $(JOBS))))
export KOLOS_VENV ?= $(CURDIR)/.cache/torch-venv
export CCACHE_SLOPPINESS := pch_defines,time_macros,include_file_mtime,include_file_ctime
export CCACHE_MAXSIZE ?= 5G
# Clones in other folders share the cache (paths are rewritten relative).
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: deps venv configure build demo test test-suite test-asan test-asan-full asan-configure install clean

deps:
	@./scripts/install-deps.sh
	@./scripts/install-venv.sh build

# The environment the interop tests (and bench/'s Python peers) use: the
# wheel with a working `import torch`, safetensors, transformers, h5py.
venv: deps
	@./scripts/install-venv.sh python

configure: deps
	@if [ ! -f $(BUILD)/build.ninja ]; then \
	  cmake --preset $(PRESET) -B $(BUILD) -DKOLOS_VENV=$(KOLOS_VENV) >/dev/null || \
	  cmake --preset $(PRESET) -B $(BUILD) -DKOLOS_VENV=$(KOLOS_VENV); fi

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# The demo builds what a run needs (the `runtime` target: kolos and its
# plugins), not the tests.
demo: configure
	@cmake --build $(BUILD) -j $(JOBS) --target runtime
	@$(BUILD)/bin/kolos run -n 2 examples/gpt-demo.toml --set log.metrics=$(BUILD)/demo-metrics.jsonl

# CI runs exactly this: the whole suite, then the sanitizer subset.
test: test-suite test-asan

# The `python` level of the environment (several GB to download) installs
# while the build compiles: it adds packages beside the wheel and replaces
# none of the files the build reads (scripts/install-venv.sh).
test-suite: deps
	@$(MAKE) --no-print-directory -j 2 venv build
	@cd $(BUILD) && ctest -LE gpu --output-on-failure -j $(TEST_JOBS) --timeout 900

# The sanitizer subset (docs/reliability.md, "Sanitizers"), built alone
# into build-asan with the `asan` preset (ASan + UBSan); any report fails
# its test. `make test` (CI) runs its LibTorch-free part, test-asan: the
# config reader, the token-file reader, the plugin registry (its test
# plugins built with the sanitizers too), the pipeline plans and the memory
# tiers' building blocks; a cold
# build of it costs minutes. test-asan-full adds the LibTorch side (dtype
# table, mesh, placements, CPU kernels, the checkpoint fault tests and
# ProcessGroupMPI's collectives on 2 and 3 ranks under mpirun), whose cold
# build took 43 minutes on a loaded 2-core machine: too long for CI.
# Leaks inside OpenMPI, PMIx, UCX, hwloc and LibTorch are suppressed
# (tests/sanitizers/lsan.supp); kolos's own are not. The tests that start
# MPI unwind every malloc's stack fully (fast_unwind_on_malloc=0): the fast
# unwinder stops in libraries built without frame pointers, and OpenMPI's
# leaks then show only a component that exit has unloaded, which no
# suppression can name. The others keep the fast unwinder (full unwinding
# made them 3-10x slower).
ASAN_BUILD     ?= build-asan
ASAN_TARGETS   := config_test data_test plugin_registry_test pipeline_plan_test pipeline_config_test \
                  memory_chunk_layout_test memory_placement_test memory_nvme_store_test \
                  memory_chunk_executor_test memory_streamed_adamw_test memory_chunk_trace_test
ASAN_TESTS     := ^(config_test|data_test|plugin_registry_test|pipeline_plan_test|pipeline_config_test|memory_.*_test)$$
ASAN_FULL_TARGETS := $(ASAN_TARGETS) dtype_test mesh_test placement_test kernels_cpu_test \
                  checkpoint_faults_test comm_collectives_test
ASAN_FULL_TESTS := ^(config_test|data_test|plugin_registry_test|pipeline_plan_test|pipeline_config_test|memory_.*_test|dtype_test|mesh_test|placement_test|kernels_cpu_test)$$
ASAN_MPI_TESTS := ^(checkpoint_faults_test|comm_collectives_test_np[23])$$
SAN_ENV = LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizers/lsan.supp:print_suppressions=0 \
          UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$(CURDIR)/tests/sanitizers/ubsan.supp
asan-configure: deps
	@if [ ! -f $(ASAN_BUILD)/build.ninja ]; then cmake --preset asan -B $(ASAN_BUILD) >/dev/null || cmake --preset asan -B $(ASAN_BUILD); fi
test-asan: asan-configure
	@cmake --build $(ASAN_BUILD) -j $(JOBS) --target $(ASAN_TARGETS)
	@cd $(ASAN_BUILD) && $(SAN_ENV) ASAN_OPTIONS=detect_leaks=1:$(ASAN_OPTIONS) \
	  ctest -R '$(ASAN_TESTS)' --output-on-failure -j $(JOBS) --timeout 900
test-asan-full: asan-configure
	@cmake --build $(ASAN_BUILD) -j $(JOBS) --target $(ASAN_FULL_TARGETS)
	@cd $(ASAN_BUILD) && $(SAN_ENV) ASAN_OPTIONS=detect_leaks=1:$(ASAN_OPTIONS) \
	  ctest -R '$(ASAN_FULL_TESTS)' --output-on-failure -j $(JOBS) --timeout 900
	@cd $(ASAN_BUILD) && $(SAN_ENV) ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:$(ASAN_OPTIONS) \
	  ctest -R '$(ASAN_MPI_TESTS)' --output-on-failure -j $(JOBS) --timeout 900

install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	@rm -rf $(BUILD) $(ASAN_BUILD)
