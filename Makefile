# Entry points. Each installs missing Debian packages first (quietly when
# nothing is missing), then configures and builds with the `cpu` preset.
#   make demo    train a small GPT on 2 MPI ranks with data parallelism
#   make test    build and run the whole CTest suite, then build against
#                LibTorch 2.x (the torch wheel) and run its unit tests
#   make install install into $(PREFIX)
# TORCH=wheel selects LibTorch 2.x from the PyPI torch wheel (the `torch2`
# preset, into build-torch2; the wheel goes into a virtual environment,
# $(KOLOS_VENV)) for build, demo, install; the default is Debian's LibTorch.
PREFIX ?= $(CURDIR)/install
TORCH  ?= system
ifeq ($(TORCH),wheel)
PRESET := torch2
BUILD  ?= build-torch2
else ifeq ($(TORCH),system)
PRESET := cpu
BUILD  ?= build
else
$(error TORCH=$(TORCH): valid are system (Debian's LibTorch) and wheel (LibTorch 2.x from PyPI))
endif
JOBS   ?= $(shell nproc)
export KOLOS_VENV ?= $(CURDIR)/.cache/torch-venv
export CCACHE_SLOPPINESS := pch_defines,time_macros,include_file_mtime,include_file_ctime
export CCACHE_MAXSIZE ?= 5G
# Clones in other folders share the cache (paths are rewritten relative).
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: deps venv configure build demo test test-suite test-torch2 install clean

deps:
	@./scripts/install-deps.sh
ifeq ($(TORCH),wheel)
	@./scripts/install-venv.sh build
endif

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

demo: build
	@$(BUILD)/bin/kolos run -n 2 examples/gpt-demo.toml --set log.metrics=$(BUILD)/demo-metrics.jsonl

# CI runs exactly this: the whole suite against the default LibTorch, then
# the 2.x build's unit tests. `make test TORCH=wheel`: the whole suite
# against 2.x.
ifeq ($(TORCH),wheel)
test: test-suite
else
test: test-suite test-torch2
endif

test-suite: venv build
	@cd $(BUILD) && ctest -LE gpu --output-on-failure -j $(JOBS) --timeout 900

test-torch2:
	@$(MAKE) --no-print-directory TORCH=wheel BUILD=build-torch2 build
	@cd build-torch2 && ctest -L unit --output-on-failure -j $(JOBS) --timeout 900

install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	@rm -rf $(BUILD)
