# The two quick-start commands. Each bootstraps its own tool venv, so a fresh machine needs nothing
# installed by hand beyond Python 3.10+.
PY ?= python3
NOX := .venv-nox/bin/nox

.PHONY: demo test lint
$(NOX):
	$(PY) -m venv .venv-nox
	.venv-nox/bin/pip install -q "nox>=2024.3"

demo: $(NOX)
	$(NOX) -s demo

test: $(NOX)
	$(NOX) -s lint tests

lint: $(NOX)
	$(NOX) -s lint
