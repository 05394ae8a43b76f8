#!/usr/bin/env python3
"""Validates rendered Kubernetes manifests that hold Kubeflow MPIJobs.

    validate_mpijobs.py --crd CRD.yaml FILE...      (FILE: multi-document YAML; - for stdin)

Each MPIJob is checked three ways:
  1. against the OpenAPI v3 schema of its apiVersion in the CRD, with unknown
     fields rejected (`additionalProperties: false` added to every object
     that lists its properties, as `kubectl --validate=strict` would);
  2. against the mpi-operator's own rules, after its defaults are applied
     (pkg/apis/kubeflow/validation/validation.go; ../shared/k8s/README.md);
  3. against the other documents rendered with it: every ConfigMap and
     PersistentVolumeClaim a pod template mounts must be among them.
Prints one line per problem, `FILE: MPIJob NAME: where: what`, and exits 1
when there is any, 0 when every MPIJob passed (and at least one was found).
"""
import argparse
import copy
import re
import sys

import jsonschema
import yaml

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def strict(schema):
    """The schema with unknown fields rejected wherever properties are listed."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def load_crd(path):
    """{apiVersion: validator} for every version the CRD serves."""
    with open(path) as f:
        crd = yaml.safe_load(f)
    group = crd["spec"]["group"]
    validators = {}
    for version in crd["spec"]["versions"]:
        if not version.get("served", True):
            continue
        schema = strict(version["schema"]["openAPIV3Schema"])
        validators[f"{group}/{version['name']}"] = jsonschema.Draft7Validator(schema)
    return crd["spec"]["names"]["kind"], validators


def where(path):
    return ".".join(str(p) for p in path) or "(top)"


def schema_errors(validator, job):
    for error in sorted(validator.iter_errors(job), key=lambda e: list(e.absolute_path)):
        message = error.message
        if error.validator == "additionalProperties" and error.validator_value is False:
            extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
            message = "unknown field(s) " + ", ".join(repr(e) for e in extra)
        yield f"{where(error.absolute_path)}: {message}"


def operator_errors(job):
    """The operator's validation, after its defaults (SetDefaults_MPIJob)."""
    metadata = job.get("metadata") or {}
    spec = job.get("spec") or {}
    name = metadata.get("name", "")
    if not name:
        yield "metadata.name: missing"
    elif not DNS1123_SUBDOMAIN.match(name) or len(name) > 253:
        yield f"metadata.name: {name!r} is not a valid DNS-1123 subdomain"
    replica_specs = spec.get("mpiReplicaSpecs") or {}
    launcher = replica_specs.get("Launcher")
    if launcher is None:
        yield "spec.mpiReplicaSpecs.Launcher: required"
    elif launcher.get("replicas", 1) != 1:
        yield f"spec.mpiReplicaSpecs.Launcher.replicas: must be 1, got {launcher.get('replicas')}"
    worker = replica_specs.get("Worker")
    if worker is not None:
        replicas = worker.get("replicas", 0)
        if not isinstance(replicas, int) or replicas < 1:
            yield f"spec.mpiReplicaSpecs.Worker.replicas: must be >= 1, got {replicas}"
        elif name:
            label = f"{name}-worker-{replicas - 1}"
            if not DNS1035.match(label) or len(label) > 63:
                yield (f"metadata.name: the worker hostname {label!r} is not a valid "
                       "DNS-1035 label (lower case, starts with a letter, at most 63 characters)")
    defaults = {"Launcher": "OnFailure", "Worker": "Never"}
    for role, replica in replica_specs.items():
        if not isinstance(replica, dict):
            continue
        policy = replica.get("restartPolicy", defaults.get(role, "Never"))
        if policy not in ("Never", "OnFailure"):
            yield (f"spec.mpiReplicaSpecs.{role}.restartPolicy: must be Never or OnFailure, "
                   f"got {policy!r}")
        containers = ((replica.get("template") or {}).get("spec") or {}).get("containers") or []
        if not containers:
            yield f"spec.mpiReplicaSpecs.{role}.template.spec.containers: needs at least one container"
    clean = (spec.get("runPolicy") or {}).get("cleanPodPolicy", "None")
    if clean not in ("None", "Running", "All"):
        yield f"spec.runPolicy.cleanPodPolicy: must be None, Running or All, got {clean!r}"
    implementation = spec.get("mpiImplementation", "OpenMPI")
    if implementation not in ("OpenMPI", "Intel", "MPICH"):
        yield f"spec.mpiImplementation: must be OpenMPI, Intel or MPICH, got {implementation!r}"
    slots = spec.get("slotsPerWorker", 1)
    if not isinstance(slots, int) or slots < 1:
        yield f"spec.slotsPerWorker: must be >= 1, got {slots!r}"


def reference_errors(job, documents):
    """ConfigMaps and PVCs that pod templates mount must be rendered alongside."""
    have = {(d.get("kind"), (d.get("metadata") or {}).get("name")) for d in documents}
    for role, replica in ((job.get("spec") or {}).get("mpiReplicaSpecs") or {}).items():
        volumes = (((replica or {}).get("template") or {}).get("spec") or {}).get("volumes") or []
        for i, volume in enumerate(volumes):
            ref = None
            if "configMap" in volume:
                ref = ("ConfigMap", (volume["configMap"] or {}).get("name"))
            elif "persistentVolumeClaim" in volume:
                ref = ("PersistentVolumeClaim", (volume["persistentVolumeClaim"] or {}).get("claimName"))
            if ref and ref not in have:
                yield (f"spec.mpiReplicaSpecs.{role}.template.spec.volumes.{i}: {ref[0]} "
                       f"{ref[1]!r} is not among the rendered manifests")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crd", required=True, help="the MPIJob CustomResourceDefinition (YAML)")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    kind, validators = load_crd(args.crd)
    problems = 0
    jobs = 0
    for path in args.files:
        with (sys.stdin if path == "-" else open(path)) as f:
            documents = [d for d in yaml.safe_load_all(f) if d]
        for doc in documents:
            if doc.get("kind") != kind:
                continue
            jobs += 1
            name = (doc.get("metadata") or {}).get("name", "?")
            validator = validators.get(doc.get("apiVersion"))
            if validator is None:
                found = [f"apiVersion: {doc.get('apiVersion')!r} is not served by the CRD "
                         f"(served: {', '.join(sorted(validators))})"]
            else:
                found = list(schema_errors(validator, doc))
                found += list(operator_errors(doc))
                found += list(reference_errors(doc, documents))
            for problem in found:
                print(f"{path}: {kind} {name}: {problem}")
            problems += len(found)
            if not found:
                print(f"{path}: {kind} {name}: ok")
    if jobs == 0:
        print(f"{', '.join(args.files)}: no {kind} found")
        return 1
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
