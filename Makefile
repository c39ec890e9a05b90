# The two commands of the README. Everything else is plumbing for them.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: help demo test deps build build-kiln asan format clean

# The first target: `make` alone says what the two commands are.
help:
	@echo "make demo   builds the kiln binary only, compiles both bundled models into plans, runs prompts, inspects a plan"
	@echo "make test   builds everything (tests, micro-benchmarks) with warnings as errors, runs every ctest, then the bad-input tests under ASan/UBSan"

deps:
	@scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The demo needs the binary alone (and the libraries it links), not the tests and benchmarks.
build-kiln: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) --target kiln

demo: build-kiln
	@scripts/demo.sh $(BUILD)/kiln

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	@$(MAKE) --no-print-directory asan

# The bad-input tests again (every gtest suite whose name contains BadInput, and the CLI's
# bad-input, tokenize, onnx_inspect, onnx_exec_bad_input and onnx_build_bad_input scripts), under AddressSanitizer +
# UBSan; -O1 -g1 (line tables) keeps the build of this second tree short in CI. The avx2_
# copies of those tests run in the main tree only: the ISA changes kernels, not input checks.
asan: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_ASAN=ON -DKILN_CUDA=OFF \
	  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" >/dev/null
	@cmake --build build-asan -j $(JOBS) --target kiln_tests kiln
	@cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS) -E '^avx2_' \
	  -R 'BadInput|cli_bad_input|cli_tokenize|cli_onnx_inspect|cli_onnx_exec_bad_input|cli_onnx_build_bad_input'

format:
	@git ls-files --cached --others --exclude-standard -- '*.h' '*.cc' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD) build-asan
