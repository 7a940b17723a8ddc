# Two commands do all set-up on a fresh machine; both keep their environment in .venv/.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast bench chaos clean peers

$(STAMP): requirements.txt requirements-test.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-test.txt
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m wave_actors.node --demo

# The system peers the end-to-end tests drive (sipp for SIP, Chromium for the talk page),
# installed from Debian's packages where missing.
peers:
	@command -v sipp >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq sip-tester >/dev/null) || echo "warning: sipp not installed"
	@[ -x /usr/bin/chromium ] || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || echo "warning: chromium not installed"

# Three pytest workers for every two cores (xdist): many tests wait on sockets and timers, and a
# third worker runs while they wait; a worker steals queued tests when it runs dry.
WORKERS := $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n * 3 / 2 > 1 ? n * 3 / 2 : 2 )))
XDIST := -n $(WORKERS) --dist worksteal

test: $(STAMP) peers
	$(BIN)/python -m pytest -q $(XDIST) tests

# The edit-test loop: everything but the tests marked slow (and the device's).
test-fast: $(STAMP) peers
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow and not gpu" tests

# Fuzz the node and its bridges while victim sessions stream (a few minutes); writes
# bench/results/chaos-long.json and exits non-zero on a crash, a lost session or a lost frame.
chaos: $(STAMP)
	$(BIN)/python -m chaos.run --long

bench: $(STAMP)
	$(BIN)/python -m wave_actors.bench --backend sim --sessions 32 --beats 200

clean:
	rm -rf $(VENV) out
