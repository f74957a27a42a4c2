# Two commands: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-cpp test beside-unit beside-unit-early lint typecheck unit compat wheel-check \
	cpp-build cpp-test bench clean system-tools

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch is pinned and installed first: a plain `torch` requirement would pull a multi-GB CUDA build.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[server,dev,pettingzoo,tracking,ray]'
	touch $(STAMP)

# System tools the tests drive, from Debian's packages: headless Chromium for the dashboard's
# browser test (tests/server/test_dashboard_browser.py) and promtool for the Prometheus check
# (tests/e2e/test_metrics_streams.py). Installed with apt-get only when missing (as root, or
# through sudo); checked on every run rather than stamped, so that a tool removed since is
# installed again.
# The C++ client (clients/cpp) builds with cmake and g++; SYSTEM_PACKAGES are the Debian packages
# it needs that install no command (headers, CMake package files), checked with dpkg -s instead:
# msgpack-cxx for the codec, nlohmann-json for the tests' vector reader, OpenSSL for TLS.
SYSTEM_TOOLS := chromium:chromium chromedriver:chromium-driver promtool:prometheus \
	cmake:cmake g++:g++ ctest:cmake
SYSTEM_PACKAGES := libmsgpack-cxx-dev nlohmann-json3-dev libssl-dev
system-tools:
	@missing=""; for pair in $(SYSTEM_TOOLS); do \
		command -v $${pair%%:*} >/dev/null || missing="$$missing $${pair#*:}"; \
	done; \
	for pkg in $(SYSTEM_PACKAGES); do \
		dpkg -s $$pkg >/dev/null 2>&1 || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $$missing || \
		{ echo "install Debian's$$missing (apt-get, as root) to run the tests"; exit 1; }; \
	fi

demo: $(STAMP)
	$(BIN)/rlserve demo cartpole

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples scripts
	$(BIN)/ruff format --check src tests bench examples scripts

typecheck: $(STAMP)
	$(BIN)/mypy

# Tests run in parallel workers, a test file per worker at a time (--dist loadfile, refined in
# tests/conftest.py: the modules on the Ray test cluster go in two units, so that at most two
# clusters run at once, and the longest modules are handed out first): most end-to-end tests
# wait on servers and sockets, so more workers than cores shortens the run (4 did better than 5
# on the 2-core VM, docs/benchmarks.md).
TEST_WORKERS ?= 4

# Some environments turn Python's bytecode caches off (PYTHONDONTWRITEBYTECODE=1 in a container
# image, say); the test targets turn them back on. Otherwise every server, learner, client and
# xdist worker the tests start compiles rlserve's modules again, and every worker rewrites the
# test modules' asserts again (a worker's collection: 7 CPU-s without the caches, 3 with).
unit compat-% cpp-test: export PYTHONDONTWRITEBYTECODE :=

unit: $(STAMP) system-tools
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15

# The client and the wire protocol on the oldest and the newest Python the package supports, in
# venvs without torch (a simulator's machine may have any of them): the tests that need neither
# torch nor a server (-m 'not e2e' leaves out those that start 'rlserve serve'). tests/policy
# compares against torch, tests/config reads the server's settings.
COMPAT_PYTHONS ?= 3.10 3.13
COMPAT_TESTS := tests/client tests/protocol tests/docs/test_protocol_vectors.py \
	tests/docs/test_protocol_render.py tests/test_layers.py
PYENV_ROOT ?= $(shell pyenv root 2>/dev/null || echo $(HOME)/.pyenv)

# Python X.Y: the newest pyenv X.Y.*, else pythonX.Y on PATH.
.venv-%/.installed: pyproject.toml
	@py=$$(ls -d $(PYENV_ROOT)/versions/$*.*/bin/python$* 2>/dev/null | sort -V | tail -n 1); \
	py=$${py:-$$(command -v python$* || true)}; \
	if [ -z "$$py" ] || ! "$$py" -c '' 2>/dev/null; then \
		echo "make: no Python $* in $(PYENV_ROOT)/versions nor on PATH:" \
			"install it with 'pyenv install $*' (or set PYENV_ROOT to where pyenv keeps it)" >&2; \
		exit 1; \
	fi; \
	echo "$$py -m venv .venv-$*"; "$$py" -m venv --clear .venv-$*
	.venv-$*/bin/pip install --quiet --upgrade pip
	.venv-$*/bin/pip install --quiet -e '.[test]'
	touch $@

.PRECIOUS: .venv-%/.installed

compat-%: .venv-%/.installed
	.venv-$*/bin/pytest -q -p no:cacheprovider -n 2 -m 'not e2e' $(COMPAT_TESTS)

compat: $(addprefix compat-,$(COMPAT_PYTHONS))

# python -m build, the wheel installed alone into a fresh venv, its client against a real server.
wheel-check: $(STAMP)
	$(BIN)/python scripts/wheel_check.py

# The C++ client. cpp-build: one configure each (kept between runs), on CPP_JOBS cores, a Release
# build of the library, the examples and the tests that use them (an installed consumer, and
# end-to-end tests against a real server from .venv), and the unit tests (the protocol vectors,
# bad input, the C ABI, the codec's random-bytes loop) built once, under AddressSanitizer and
# UndefinedBehaviorSanitizer (RLSERVE_SANITIZE, an unoptimised Debug build in
# clients/cpp/build-asan): only their programs are built there. It needs no .venv, so `make
# test` builds it while .venv is made. cpp-test runs both ctest suites (the end-to-end tests two
# at once, as they mostly wait on the server). The end-to-end tests pass under the sanitizers
# too but add about 70 s: `make cpp-test CPP_ASAN_SKIP=` builds and runs them there.
CPP_BUILD := clients/cpp/build
CPP_ASAN_BUILD := clients/cpp/build-asan
CPP_ASAN_SKIP ?= ^e2e_
CPP_JOBS ?= 2
# A unity build: each target's sources compiled as one translation unit, so that the heavy headers
# (msgpack-cxx, the standard library) are parsed once per target rather than once per file: 105
# CPU-s for both builds instead of 171 (docs/benchmarks.md). An edit then recompiles its target's
# whole unit: `make cpp-test CPP_UNITY=OFF` for an edit-and-rebuild loop.
CPP_UNITY ?= ON
CPP_CONFIGURE := -DCMAKE_UNITY_BUILD=$(CPP_UNITY) -DCMAKE_UNITY_BUILD_BATCH_SIZE=0 \
	-DRLSERVE_PYTHON_BIN=$(abspath $(BIN))
CPP_UNIT_TARGETS := test_codec test_framing test_forward test_model test_spaces test_requests \
	write_fixtures test_client_parts test_c_api
cpp-build: system-tools
	cmake -S clients/cpp -B $(CPP_BUILD) -DCMAKE_BUILD_TYPE=Release -DRLSERVE_UNIT_TESTS=OFF \
		$(CPP_CONFIGURE)
	cmake --build $(CPP_BUILD) -j$(CPP_JOBS)
	cmake -S clients/cpp -B $(CPP_ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DRLSERVE_SANITIZE=ON \
		-DRLSERVE_UNIT_TESTS=ON $(CPP_CONFIGURE)
	cmake --build $(CPP_ASAN_BUILD) -j$(CPP_JOBS) $(if $(CPP_ASAN_SKIP),--target $(CPP_UNIT_TARGETS))

cpp-test: cpp-build $(STAMP)
	ctest --test-dir $(CPP_BUILD) --output-on-failure --parallel 2
	ctest --test-dir $(CPP_ASAN_BUILD) --output-on-failure --parallel 2 $(if $(CPP_ASAN_SKIP),-E '$(CPP_ASAN_SKIP)')

# The C++ CartPole (clients/cpp/examples/cartpole_train.cpp) trained to 475 through a real
# `rlserve serve` on 127.0.0.1, with remote and then local inference (scripts/demo_cpp.py).
demo-cpp: system-tools $(STAMP)
	cmake -S clients/cpp -B $(CPP_BUILD) -DCMAKE_BUILD_TYPE=Release -DRLSERVE_PYTHON_BIN=$(abspath $(BIN))
	cmake --build $(CPP_BUILD) -j2 --target rlserve_cartpole_train
	$(BIN)/python scripts/demo_cpp.py --build $(CPP_BUILD)

# pytest's workers leave part of the two cores idle (most end-to-end tests wait on servers and
# sockets), so the other checks run beside it, one at a time, in a second job; each target's
# output is printed whole once it is done (--output-sync), not interleaved. The C++ builds and
# the compat venvs need no .venv, so they start while it is made: pip works on one core, and the
# C++ build here on the other (CPP_JOBS=1; with two compilers, or with these checks niced,
# pytest started or ended later: docs/benchmarks.md).
test:
	$(MAKE) --no-print-directory -j2 --output-sync=target unit beside-unit

BESIDE := $(MAKE) --no-print-directory -j1 CPP_JOBS=1

beside-unit: beside-unit-early $(STAMP)
	$(BESIDE) lint typecheck wheel-check cpp-test

beside-unit-early: system-tools
	$(BESIDE) cpp-build compat

bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python bench/remote_inference.py

clean:
	rm -rf $(VENV) .venv-* build dist src/*.egg-info $(CPP_BUILD) $(CPP_ASAN_BUILD)
