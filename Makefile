# dueflow: the two commands of the README are `make demo` and `make test`.
# Everything they need is installed here: a virtualenv with the project, and
# the broker jars (Maven Central, through broker/dueflow/broker/pom.xml).

PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint docs unit integration chaos fmt bench broker-start broker-stop clean browser-deps faketime-deps promtool clients clients-java clients-go clients-node client-schemas vectors lock releases

# setup.py compiles the modules it lists with mypyc (a C compiler is needed, else
# they stay Python): editing one of them rebuilds the install.
NATIVE := $(shell grep -o '"[a-z/_]*\.py"' setup.py | tr -d '"')

$(STAMP): pyproject.toml setup.py $(NATIVE)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

jars: $(STAMP)
	$(BIN)/dueflow broker fetch

## the main job: a real pipeline on a local broker
demo: $(STAMP) jars
	$(PY) -m demo

## lint gate, the docs site + every test tier; starts and stops the broker it needs. Three
## pytest workers (most integration tests wait on due times, not on the CPU): the serial
## groups of tests/support/serial.py (chaos, upgrade, demo) beside the rest.
test: $(STAMP) jars browser-deps faketime-deps promtool lint docs clients releases
	$(PY) -m pytest -n 3 --dist loadgroup --durations=30

## every benchmark at sane sizes (about 15 minutes), then the docs' benchmarks page
## (docs/benchmarks.md) and its charts (docs/img/). Needs the `bench` extra (matplotlib).
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) jars
	$(PY) -m benchmarks.suite

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## the user docs (docs/, mkdocs.yml) as a site in build/site. --strict: a broken link
## or anchor, or a page missing from the nav, fails. Nothing is fetched.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

unit: $(STAMP) promtool
	$(PY) -m pytest tests/unit

integration: $(STAMP) jars browser-deps clients releases
	$(PY) -m pytest tests/integration

## the previous release (git tag v0.1.0) for the upgrade tests (tests/integration/test_upgrade.py):
## its tree in a virtualenv of its own under ~/.cache/dueflow/releases/ ($$DUEFLOW_CACHE), built
## once per commit from its wheels (pip wheel: the package index or pip's cache), then reused.
## Found by its commit in a clone without tags; fails, naming the fix, in a shallow clone.
releases: $(STAMP)
	$(PY) -m tests.upgrade.release

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

## The Java, Go and Node clients (clients/): each one's own tests, which run the
## shared conformance table (clients/conformance/vectors.json), and the example
## programs tests/integration/test_clients_e2e.py runs against the broker.
## Dependencies come from Maven Central, the Go module proxy and npm (lockfile),
## cached in ~/.m2, ~/go/pkg/mod and ~/.npm.
clients: clients-java clients-go clients-node

clients-java:
	mvn -B -ntp -f clients/java/pom.xml package

clients-go:
	cd clients/go && go test -count=1 ./... && go build -o bin/dueflow-example ./cmd/dueflow-example

clients-node:
	cd clients/node && npm ci --no-audit --no-fund && npm test

## Copy the schemas the clients write into each client (tests/unit/test_client_schemas.py
## checks the copies).
client-schemas:
	@for d in clients/java/src/main/resources/dev/dueflow/client/schemas clients/go/schemas clients/node/schemas; do \
	  mkdir -p $$d/v1 $$d/v3; \
	  cp schemas/dueflow/schemas/job.avsc schemas/dueflow/schemas/idempotency_record.avsc $$d/; \
	  cp schemas/dueflow/schemas/command.avsc $$d/; \
	  cp schemas/dueflow/schemas/v2/outcome.avsc $$d/outcome.avsc; \
	  cp schemas/dueflow/schemas/outcome.avsc $$d/v3/outcome.avsc; \
	  cp schemas/dueflow/schemas/v1/idempotency_record.avsc schemas/dueflow/schemas/v1/outcome.avsc $$d/v1/; \
	done

## Regenerate the conformance vectors from the Python SDK (commit the result).
vectors: $(STAMP)
	$(PY) -m tests.support.conformance --write

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

broker-start: $(STAMP) jars
	$(BIN)/dueflow broker start

broker-stop: $(STAMP)
	$(BIN)/dueflow broker stop

clean:
	rm -rf $(VENV) .dueflow build *.egg-info .mypy_cache .ruff_cache .pytest_cache
	rm -rf clients/java/target clients/go/bin clients/node/dist clients/node/node_modules

## the container image's hashed lockfiles (deploy/docker/*.lock) from pyproject.toml,
## with uv from PyPI; run after changing [project] dependencies
UV_VERSION ?= 0.13.8
lock: $(STAMP)
	$(BIN)/pip install --quiet uv==$(UV_VERSION)
	UV=$(BIN)/uv deploy/docker/lock.sh

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

## the example Kubernetes manifests (deploy/kubernetes/example/) from
## deploy/kubernetes/example.toml and the example app; a test checks they are current
k8s-example: $(STAMP)
	rm -rf deploy/kubernetes/example
	PYTHONPATH=deploy/example_app $(BIN)/dueflow deploy kubernetes \
	  --config deploy/kubernetes/example.toml --app example_tasks \
	  --image registry.example.com/acme/dueflow-example:0.2.0 --out deploy/kubernetes/example
