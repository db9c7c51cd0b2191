# Two entry points for a fresh machine:
#   make test   install what is missing, build, run every C++ and Python test
#   make demo   install, build, run the main job on a checkpoint the project makes itself
# Other targets: build, bench, gpu-check (on a machine with an NVIDIA GPU), clean.

BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
PYTHON ?= python3

.PHONY: all deps build test test-cpp test-python demo bench gpu-check clean

all: build

deps:
	@scripts/install-deps

build: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOWBIT_WERROR=ON $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

test: build
	scripts/fetch-default-model >/dev/null
	$(MAKE) --no-print-directory test-cpp test-python

test-cpp:
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) --timeout 600

test-python:
	LOWBIT_BUILD_DIR=$(abspath $(BUILD)) $(PYTHON) -m pytest -q tests/python

demo: build
	LOWBIT=$(abspath $(BUILD))/lowbit scripts/demo

gpu-check:
	scripts/gpu-check

clean:
	rm -rf $(BUILD)
