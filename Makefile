# ticketrec — the two commands: `make demo` and `make test`. Each does all set-up on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export TICKETREC_HOME ?= $(CURDIR)/var/demo
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test venv system-deps serve clean

venv: $(STAMP)

# torch is pinned and installed first, so nothing pulls a CUDA build.
$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,pretrained]'
	touch $(STAMP)

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

test: venv system-deps
	$(BIN)/python -m pytest

demo: venv
	$(BIN)/ticketrec demo

clean:
	rm -rf $(VENV) var *.egg-info
