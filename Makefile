# The only two set-up commands: `make run` and `make test`. Both create .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCHREC_SET := torchrec==1.9.2 fbgemm-gpu-cpu==1.8.0

.PHONY: run test venv bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, from the CPU build on disk (a plain `torch` would download a CUDA build).
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[test,torchrec,ray,postgres,triton,torchao,dashboard]"
	# Optional peers whose metadata would pull CUDA wheels: install without deps, tolerate absence.
	-$(BIN)/python -m pip install -q --no-deps $(TORCHREC_SET)
	touch $(STAMP)

# The main job: a short co-design campaign on the embedded dlrm-small workload (cubic's proxy-guided
# loop plus the random and direct-TPE baselines), then its HTML report. A few minutes on 2 cores;
# configs already measured on this machine are served from the trial store (.cubic/).
run: $(STAMP)
	mkdir -p reports
	$(BIN)/cubic campaign run --workload dlrm-small --name default --replace --budget 12 --batch 4 \
		--steps 10 --warmup 2 --baselines --report reports/default
	@echo "report: reports/default/index.html"
	@echo "live study: $(BIN)/cubic campaign dashboard default   (optuna-dashboard on the campaign's storage)"

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	for f in experiments/[a-z]*.py; do $(BIN)/python $$f || exit 1; done
	$(BIN)/python -m experiments.reliability

clean:
	rm -rf $(VENV) build *.egg-info
