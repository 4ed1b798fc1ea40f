# dueflow: the two commands of the README are `make demo` and `make test`.
# Everything they need is installed here: a virtualenv with the project, and
# the broker jars (Maven Central, through broker/dueflow/broker/pom.xml).

PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint unit integration chaos fmt bench broker-start broker-stop clean browser-deps faketime-deps promtool

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

jars: $(STAMP)
	$(BIN)/dueflow broker fetch

## the main job: a real pipeline on a local broker
demo: $(STAMP) jars
	$(PY) -m demo

## lint gate + every test tier; starts and stops the broker it needs. Two pytest
## workers: the chaos runs (one after the other, group "chaos") beside the rest.
test: $(STAMP) jars browser-deps faketime-deps promtool lint
	$(PY) -m pytest -n 2 --dist loadgroup

## every benchmark at sane sizes (about 15 minutes), then charts (docs/img/) and
## the README's Performance table. Needs the optional `bench` extra (matplotlib).
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) jars
	$(PY) -m benchmarks.suite --readme README.md

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

unit: $(STAMP) promtool
	$(PY) -m pytest tests/unit

integration: $(STAMP) jars browser-deps
	$(PY) -m pytest tests/integration

## Debian's chromium and chromedriver for the status-page browser test (no
## browser download: selenium is given both paths). Installs only if missing.
browser-deps:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  $$SUDO apt-get install -y --no-install-recommends chromium chromium-driver; \
	fi

## Debian's faketime (libfaketime) for the chaos suite's clock-skew faults: emitters
## and workers restarted 2 s ahead or behind. Installs only if missing.
faketime-deps:
	@if [ ! -x /usr/bin/faketime ] || ! ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  $$SUDO apt-get install -y --no-install-recommends faketime; \
	fi

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

broker-start: $(STAMP) jars
	$(BIN)/dueflow broker start

broker-stop: $(STAMP)
	$(BIN)/dueflow broker stop

clean:
	rm -rf $(VENV) .dueflow build *.egg-info .mypy_cache .ruff_cache .pytest_cache

## optional: build the `docker compose` CLI plugin from source (Go) so the
## compose-file test can run `docker compose config` where only the docker
## client is installed. Takes a few minutes; not part of `make test`.
COMPOSE_VERSION ?= v2.40.3
compose-plugin:
	@set -e; d=$$(mktemp -d); cd $$d; \
	go mod download -json github.com/docker/compose/v2@$(COMPOSE_VERSION) > dl.json; \
	src=$$(python3 -c "import json;print(json.load(open('dl.json'))['Dir'])"); \
	cp -r $$src src; chmod -R u+w src; cd src; \
	go build -o $$HOME/.docker/cli-plugins/docker-compose ./cmd; \
	docker compose version

## promtool (checks the alert rules): taken out of Debian's prometheus package
## without installing the server (no daemon is started), into the virtualenv.
## Fails loudly when it cannot: the alert-rule test fails without promtool.
promtool: $(STAMP)
	@set -e; \
	if [ ! -x $(BIN)/promtool ]; then \
	  d=$$(mktemp -d); trap 'rm -rf "$$d"' EXIT; chmod 755 "$$d"; \
	  echo "promtool: taking it from Debian's prometheus package (apt-get download prometheus)"; \
	  if ! (cd "$$d" && apt-get download -q prometheus); then \
	    echo "promtool: 'apt-get download prometheus' failed (no apt here, or stale package lists: run 'sudo apt-get update' and retry)" >&2; \
	    exit 1; \
	  fi; \
	  dpkg-deb -x "$$d"/prometheus_*.deb "$$d/x"; \
	  install -m 755 "$$d/x/usr/bin/promtool" $(BIN)/promtool; \
	fi; \
	if ! v=$$($(BIN)/promtool --version 2>&1); then \
	  echo "promtool: $(BIN)/promtool does not run: $$v" >&2; exit 1; \
	fi; \
	echo "$$v" | head -1
