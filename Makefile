# Two entry points for a fresh machine:
#   make test   install what is missing, build, run every C++ and Python test
#   make demo   install, build, run the main job on a checkpoint the project makes itself
#   make test-asan   the file parsers' tests and fuzz entry points under AddressSanitizer + UBSan
# Other targets: build, bench, gpu-check (on a machine with an NVIDIA GPU), clean.

BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
PYTHON ?= python3

ASAN_BUILD ?= build-asan

.PHONY: all deps build test test-cpp test-python test-asan demo bench gpu-check clean

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

# The parsers of every file format lowbit reads (ans containers, GGUF,
# safetensors, tokenizer files) with their malformed-input tests, and the fuzz
# entry points over mutated files, in a CPU-only sanitizer build. Warnings are
# errors in the main build only: GCC's -Wstringop-overflow gives false alarms
# on code instrumented by the sanitizers.
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOWBIT_CUDA=OFF \
	  -DLOWBIT_SANITIZE=address,undefined -DLOWBIT_BUILD_FUZZ=ON -DLOWBIT_BUILD_BENCH=OFF -DLOWBIT_WERROR=OFF
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target lowbit_cli test_ans test_gguf test_io test_tokenizer \
	  ans_fuzz_seed ans_fuzz_lowbit ans_fuzz_baseline ans_fuzz_detect gguf_fuzz_file
	ASAN_OPTIONS=detect_leaks=1 ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS) --timeout 1200 \
	  -L '^(ans|gguf|io|tokenizer)$$'
	scripts/fuzz-replay $(ASAN_BUILD)

demo: build
	LOWBIT=$(abspath $(BUILD))/lowbit scripts/demo

gpu-check:
	scripts/gpu-check

clean:
	rm -rf $(BUILD)
