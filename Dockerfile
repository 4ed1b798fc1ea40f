# syntax=docker/dockerfile:1
# The dueflow image: `dueflow` is the entrypoint, the command picks the process.
#
#   docker build -t dueflow:0.2.0 .
#   docker run --rm dueflow:0.2.0 emitter
#   docker run --rm -e PYTHONPATH=/app -v "$PWD/myapp:/app/myapp:ro" dueflow:0.2.0 worker --app myapp.tasks
#   docker run --rm -e DUEFLOW_OBSERVABILITY_STATUS_TOKEN=... -p 6066:6066 dueflow:0.2.0 status-view
#
# Two stages: the build stage makes a virtualenv from the hashed lockfile
# (wheels only) and installs the dueflow wheel built from this tree (gcc there
# compiles the worker's record decoder and encoder with mypyc, see setup.py);
# the final stage is the same slim Python with that virtualenv copied in, no
# compiler, no pip cache, running as an unprivileged user. deploy/docker/install.sh holds
# the install steps (a test runs the same script in a clean virtualenv).
# docs/deployment.md: building, extending with your tasks, settings.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# gcc: a build tool only (not in the final stage), taken at bookworm's current
# version so its security updates are not held back by a pin.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
# Dependencies first: this layer is rebuilt only when the lockfiles change.
COPY deploy/docker/install.sh deploy/docker/requirements.lock deploy/docker/build-requirements.lock deploy/docker/
RUN deploy/docker/install.sh deps /opt/dueflow
COPY pyproject.toml README.md ./
COPY dueflow/ dueflow/
COPY consumers/ consumers/
COPY producers/ producers/
COPY streams/ streams/
COPY broker/ broker/
COPY schemas/ schemas/
RUN deploy/docker/install.sh app /opt/dueflow /src

FROM ${PYTHON_IMAGE}
ARG UID=10001
RUN groupadd --system --gid "${UID}" dueflow \
    && useradd --system --uid "${UID}" --gid dueflow --home-dir /home/dueflow --create-home \
       --shell /usr/sbin/nologin dueflow
COPY --from=build /opt/dueflow /opt/dueflow
# In a container the listener of /metrics, /livez and /readyz must be reachable
# from outside it (the kubelet, a Prometheus server): every interface, port 9464.
# The status view also binds every interface, which it refuses without a
# configured token (DUEFLOW_OBSERVABILITY_STATUS_TOKEN).
ENV PATH=/opt/dueflow/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DUEFLOW_OBSERVABILITY_METRICS_BIND=0.0.0.0 \
    DUEFLOW_OBSERVABILITY_METRICS_PORT=9464 \
    DUEFLOW_OBSERVABILITY_STATUS_BIND=0.0.0.0 \
    DUEFLOW_OBSERVABILITY_STATUS_DATA_DIR=/home/dueflow/status \
    DUEFLOW_WORKER_STORE_DIR=/home/dueflow/keys
WORKDIR /home/dueflow
USER ${UID}:${UID}
EXPOSE 9464 6066
ENTRYPOINT ["dueflow"]
CMD ["--help"]
