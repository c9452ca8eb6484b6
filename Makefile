VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test install bench

$(VENV)/.installed: pyproject.toml
	test -d $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/irt-engine demo

test: $(VENV)/.installed
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		{ apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; } \
		>/dev/null 2>&1; } || \
		echo "note: chromium not installed; the report's browser test will be skipped"
	$(PY) -m pytest -q -rs -n 2 --dist loadfile --durations=25  # -rs: each skip with its reason; the 25 slowest tests

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_core.py
