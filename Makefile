# Entry points. Each installs missing Debian packages first (quietly when
# nothing is missing), then configures and builds with the `cpu` preset.
#   make demo    train a small GPT on 2 MPI ranks with data parallelism
#   make test    build and run the whole CTest suite
#   make install install into $(PREFIX)
PREFIX ?= $(CURDIR)/install
BUILD  ?= build
JOBS   ?= $(shell nproc)
export CCACHE_SLOPPINESS := pch_defines,time_macros,include_file_mtime,include_file_ctime
export CCACHE_MAXSIZE ?= 5G
# Clones in other folders share the cache (paths are rewritten relative).
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: deps configure build demo test install clean

deps:
	@./scripts/install-deps.sh

configure: deps
	@if [ ! -f $(BUILD)/build.ninja ]; then cmake --preset cpu -B $(BUILD) >/dev/null || cmake --preset cpu -B $(BUILD); fi

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	@$(BUILD)/bin/kolos run -n 2 examples/gpt-demo.toml --set log.metrics=$(BUILD)/demo-metrics.jsonl

test: build
	@cd $(BUILD) && ctest -LE gpu --output-on-failure -j $(JOBS) --timeout 900

install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	@rm -rf $(BUILD)
