VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test install bench bytecode

$(VENV)/.installed: pyproject.toml
	test -d $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $@

install: bytecode

# pip compiles an installed package's modules once; an editable install's are compiled here
# (again after an edit, only the files changed), so a command reads them instead of compiling
# every module it imports: about 0.2-0.3 s of each fit process where Python writes no
# bytecode of its own (PYTHONDONTWRITEBYTECODE)
bytecode: $(VENV)/.installed
	$(PY) -m compileall -q engine cluster

demo: bytecode
	$(VENV)/bin/irt-engine demo

test: bytecode
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		{ apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; } \
		>/dev/null 2>&1; } || \
		echo "note: chromium not installed; the report's browser test will be skipped"
	# OpenBLAS on one thread in each of the two test processes, as the irt-engine command
	# sets it (engine.cli.one_blas_thread): two threads each would share two cores four ways
	OPENBLAS_NUM_THREADS=1 $(PY) -m pytest -q -rs -n 2 --dist loadfile --durations=25  # -rs: each skip with its reason; the 25 slowest tests

bench: bytecode
	$(PY) benchmarks/bench_core.py
