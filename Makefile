# Two commands: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit bench clean browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch is pinned and installed first: a plain `torch` requirement would pull a multi-GB CUDA build.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[server,dev,pettingzoo,tracking]'
	touch $(STAMP)

# The dashboard's browser test drives Debian's headless Chromium (tests/server/test_dashboard_browser.py);
# installed with apt-get only when missing (as root, or through sudo). Checked on every run rather
# than stamped, so that a browser removed since is installed again.
browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends \
			chromium chromium-driver || \
		{ echo "install Debian's chromium and chromium-driver (apt-get, as root) to run the tests"; exit 1; }; \
	fi

demo: $(STAMP)
	$(BIN)/rlserve demo cartpole

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples scripts
	$(BIN)/ruff format --check src tests bench examples scripts

typecheck: $(STAMP)
	$(BIN)/mypy

# Tests run in parallel workers, a test file per worker at a time: most end-to-end tests wait on
# servers and sockets, so more workers than cores shortens the run.
TEST_WORKERS ?= 4

unit: $(STAMP) browser
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python bench/remote_inference.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
