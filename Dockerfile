# The toolkit on Paddle's CPU build: what the Kubernetes manifests run, for CPU nodes and
# for trying them (scripts/cluster/kubernetes; its GPU twin is Dockerfile.gpu). Build from
# the repository's root, tagged as docs/guide.md ("An image to run") names it, naming the
# commit that checkpoints written in the image record (the image has no .git):
#   docker build --build-arg PADDLE_RESNET_COMMIT="$(git rev-parse HEAD)" -t paddle-resnet:0.2.0-cpu .
# Installed as scripts/setup.sh installs it: a virtual environment with Paddle 2.6.2, DALI
# and the pinned runtime requirements (requirements.txt under constraints/; the test
# requirements stay out), then the package itself, editable, from the repository copied to
# /workspace/paddle-resnet, where the manifests run train.py. Beside it the serving
# environment of scripts/setup_serve.sh at /opt/venv-serve (KServe 0.21, Paddle 3.3.1: their
# protobuf 6 cannot join Paddle 2.6's 4), whose paddle-resnet-serve the InferenceService of
# scripts/cluster/kubernetes/serving runs:
#   docker run -p 8080:8080 -p 8081:8081 -v "$PWD/inference:/models:ro" paddle-resnet:0.2.0-cpu \
#       /opt/venv-serve/bin/paddle-resnet-serve --inference-dir /models/resnet18_demo
# It runs as the user paddle (uid and gid 1000), not root.
# The base pinned by digest: the tag says what it is, the digest fixes which build is pulled
# (Python 3.11.16 on Debian 12, built 2026-08-25: the multi-platform index that Docker's
# official-image records list for the tag, github.com/docker-library/repo-info
# repos/python/remote/3.11-slim-bookworm.md). For a newer build: docker buildx imagetools
# inspect python:3.11-slim-bookworm, and its digest here.
FROM python:3.11-slim-bookworm@sha256:0bee7276f83efd4a1ee05bbbf4281d95ed28e079220a9457f25a93e3f1e3c31b

# libgomp: Paddle's OpenMP runtime (its wheel links the system's); tcmalloc: training
# runs on it (1.07-1.16x on a CPU): the image preloads it for every process by the
# environment (a link whose path does not depend on the architecture), so the training
# command does not start itself again (paddle_resnet/core/bootstrap.py)
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 libtcmalloc-minimal4 \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s /usr/lib/*/libtcmalloc_minimal.so.4 /usr/local/lib/libtcmalloc_minimal.so.4

# The user the run is: uid and gid 1000 (the manifests' runAsUser, runAsGroup and fsGroup),
# with a home for its cache (~/.cache: the toolkit's, and Paddle's, which Paddle creates
# when imported).
RUN groupadd --gid 1000 paddle \
    && useradd --uid 1000 --gid 1000 --create-home --home-dir /home/paddle \
        --shell /usr/sbin/nologin paddle

ENV PATH=/opt/venv/bin:$PATH \
    LD_PRELOAD=/usr/local/lib/libtcmalloc_minimal.so.4 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /workspace/paddle-resnet

# The dependencies first: a layer that a change of the code does not rebuild.
COPY requirements.txt ./
COPY constraints/paddle-2.6.2.txt constraints/
RUN python -m venv /opt/venv \
    && pip install paddlepaddle==2.6.2 -r requirements.txt -c constraints/paddle-2.6.2.txt
COPY requirements-serve.txt ./
COPY constraints/serve.txt constraints/
RUN python -m venv /opt/venv-serve \
    && /opt/venv-serve/bin/pip install -r requirements-serve.txt -c constraints/serve.txt

COPY . .
# The code stays root's, read-only to the user; compiled here, as a read-only root file
# system (the manifests) takes no __pycache__. The user owns what a run writes where no
# flag moves it: train.py's ./output, the launcher's ./log, export_model.py's ./inference.
RUN pip install --no-deps -e . \
    && /opt/venv-serve/bin/pip install --no-deps -e . \
    && python -m compileall -q paddle_resnet ./*.py \
    && install -d -o 1000 -g 1000 output log inference \
    && python -c "import paddle_resnet.commands.train, paddle, nvidia.dali" \
    && /opt/venv-serve/bin/python -c "import paddle_resnet.commands.serve, kserve"

# The commit built, which checkpoints record (paddle_resnet/core/provenance.py reads it where
# there is no git checkout); last, so that it rebuilds no layer above.
ARG PADDLE_RESNET_COMMIT=
ENV PADDLE_RESNET_COMMIT=$PADDLE_RESNET_COMMIT

USER 1000:1000
