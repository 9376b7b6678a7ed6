# The toolkit on Paddle's CPU build: what the Kubernetes manifests run, for CPU nodes and
# for trying them (scripts/cluster/kubernetes; its GPU twin is Dockerfile.gpu). Build from
# the repository's root, tagged as docs/guide.md ("An image to run") names it:
#   docker build -t paddle-resnet:0.2.0-cpu .
# Installed as scripts/setup.sh installs it: a virtual environment with Paddle 2.6.2, DALI
# and the pinned runtime requirements (requirements.txt under constraints/; the test
# requirements stay out), then the package itself, editable, from the repository copied to
# /workspace/paddle-resnet, where the manifests run train.py.
FROM python:3.11-slim-bookworm

# libgomp: Paddle's OpenMP runtime (its wheel links the system's); tcmalloc: training
# preloads it (paddle_resnet/core/bootstrap.py)
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 libtcmalloc-minimal4 \
    && rm -rf /var/lib/apt/lists/*

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /workspace/paddle-resnet

# The dependencies first: a layer that a change of the code does not rebuild.
COPY requirements.txt ./
COPY constraints/paddle-2.6.2.txt constraints/
RUN python -m venv /opt/venv \
    && pip install paddlepaddle==2.6.2 -r requirements.txt -c constraints/paddle-2.6.2.txt

COPY . .
RUN pip install --no-deps -e . \
    && python -c "import paddle_resnet.commands.train, paddle, nvidia.dali"
