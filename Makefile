# One entry point per job. Every target creates the venv and installs what it needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test check lint typecheck bench bench-quick clean

# constraints.txt: the versions the suite last passed with (its header says how to move one).
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)          ## the whole pipeline on embedded defaults, then a summary
	$(BIN)/llmslo demo

# Four workers on two cores: most tests wait on brokers, child processes and sleeps (at
# four the CPU was 78 % busy, on an idle machine). A file is one unit (module fixtures run once);
# files holding slow tests are handed out first (tests/conftest.py; xdist would otherwise
# hand out the files with the most tests first, however short). The 25 slowest tests are
# listed at the end, so a CI log shows where the suite's time goes.
test: $(STAMP)          ## the test suite (real broker, DuckDB files, binaries when installed)
	$(BIN)/pytest -q -p no:cacheprovider -n 4 --dist loadfile --no-loadscope-reorder --durations=25

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy
	$(BIN)/mypy tests bench --ignore-missing-imports

check: lint typecheck test  ## ruff (format + lint), mypy on the library and tests, then the tests

bench-quick: $(STAMP)   ## every benchmark in --quick mode (each < 60 s)
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
