# The two commands a newcomer needs:  `make run`  and  `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# PyTorch's CPU build (a local wheel on our machines).  CUDA or Ascend users:
# install the torch (and torch_npu) matching their driver/CANN first, then
# run `make setup TORCH_SPEC=` to keep it.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup run test bench clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	if [ -n "$(TORCH_SPEC)" ]; then $(PY) -m pip install --quiet --no-compile "$(TORCH_SPEC)"; fi
	$(PY) -m pip install --quiet --no-compile -e ".[all]"
	@# pip byte-compiles file by file on one core (a minute here); this uses every core.  A
	@# file written for a newer Python (torch ships one) fails here as it does under pip.
	@echo "setup: byte-compiling the installed packages"
	$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" >/dev/null || true
	touch $@

setup: $(VENV)/.installed

# The app on http://127.0.0.1:8501 (`make run PORT=8600` for another port) with a
# queue worker beside it, on the default SQLite database
# (~/.local/share/mpipe/mpipe.db, one per user that every clone shares; `mpipe app`
# says which it uses as it starts, and MPIPE_DB_URL=FILE picks another).  Ctrl-C stops both.
PORT ?= 8501
run: setup
	$(VENV)/bin/mpipe app --port $(PORT)

test: setup
	bash scripts/test.sh

bench: setup
	$(PY) -m benchmarks all

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
