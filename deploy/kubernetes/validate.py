"""Validates stockade's Kubernetes manifests offline, strictly.

    python validate.py [--expect-invalid] FILE...

Core kinds go to kubernetes-validate (PyPI, pinned by `cargo xtask deploy`) with `strict`,
which refuses any field the Kubernetes API does not define. agent-sandbox's kinds go to
schema/agent-sandbox.schema.json (ours, written from agent-sandbox's v1beta1 API), and the
core PodSpec inside each `podTemplate` to kubernetes-validate again, as a Pod. A kind neither
knows is an error. Envoy's configuration, carried in a ConfigMap, is parsed and every route's
cluster must be one it defines; a seccomp profile a pod names must be the one in
deploy/seccomp. With --expect-invalid every document of every file must fail (the fixtures
that show the validator can fail). Prints one line per document; exits 1 on any failure.
"""

import json
import os
import sys

import jsonschema
import kubernetes_validate
import yaml

KUBERNETES = "1.33.0"
HERE = os.path.dirname(os.path.abspath(__file__))
SANDBOX_GROUPS = ("agents.x-k8s.io/", "extensions.agents.x-k8s.io/")
SECCOMP_DIR = os.path.join(HERE, "..", "seccomp")


def sandbox_schema():
    """A validator per agent-sandbox kind: the schema's definition of that kind, so an error
    names the field rather than every kind the document is not."""
    with open(os.path.join(HERE, "schema", "agent-sandbox.schema.json")) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    kinds = {}
    for kind in schema["$defs"]:
        if kind[0].isupper():
            one = {k: v for k, v in schema.items() if k != "oneOf"}
            one["$ref"] = f"#/$defs/{kind}"
            kinds[kind] = jsonschema.Draft202012Validator(one)
    return kinds


def pod_specs(doc):
    """Every PodSpec in a document, with where it is."""
    spec = doc.get("spec") or {}
    if doc["kind"] == "Pod":
        yield "spec", spec
    if isinstance(spec.get("podTemplate"), dict):
        yield "spec.podTemplate.spec", spec["podTemplate"].get("spec") or {}
    if isinstance(spec.get("template"), dict):
        yield "spec.template.spec", spec["template"].get("spec") or {}


def check_seccomp(doc):
    """A Localhost seccomp profile a pod names must be one deploy/seccomp ships."""
    for where, spec in pod_specs(doc):
        contexts = [("securityContext", spec.get("securityContext") or {})]
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            contexts.append((f"container {c.get('name')}", c.get("securityContext") or {}))
        for what, ctx in contexts:
            profile = ctx.get("seccompProfile") or {}
            if profile.get("type") == "Localhost":
                name = profile.get("localhostProfile", "")
                if not os.path.isfile(os.path.join(SECCOMP_DIR, os.path.basename(name))) or "/" in name:
                    raise ValueError(f"{where} {what}: seccomp profile {name!r} is not in deploy/seccomp")


def check_envoy(doc):
    """Envoy's static configuration in a ConfigMap: parsed, and every route names a cluster
    it defines."""
    for key, text in (doc.get("data") or {}).items():
        if not key.startswith("envoy") or not key.endswith((".yaml", ".yml")):
            continue
        conf = yaml.safe_load(text)
        resources = conf["static_resources"]
        clusters = {c["name"] for c in resources["clusters"]}
        routes = 0
        for listener in resources["listeners"]:
            for chain in listener["filter_chains"]:
                for f in chain["filters"]:
                    manager = f["typed_config"]
                    for vhost in manager["route_config"]["virtual_hosts"]:
                        for route in vhost["routes"]:
                            target = route["route"].get("cluster")
                            if target not in clusters:
                                raise ValueError(f"{key}: a route goes to {target!r}, which is not a cluster")
                            routes += 1
        if routes == 0:
            raise ValueError(f"{key}: no routes")


def validate(doc, schema):
    api = doc.get("apiVersion", "")
    if api.startswith(SANDBOX_GROUPS):
        if doc.get("kind") not in schema:
            raise ValueError(f"{api} {doc.get('kind')}: a kind the agent-sandbox schema does not define")
        errors = sorted(schema[doc["kind"]].iter_errors(doc), key=lambda e: list(e.absolute_path))
        if errors:
            e = errors[0]
            raise ValueError(f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}")
    else:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    for where, spec in pod_specs(doc):
        if doc["kind"] == "Pod":
            continue
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "podtemplate"}, "spec": spec}
        try:
            kubernetes_validate.validate(pod, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise ValueError(f"{where}: {e}") from None
    check_seccomp(doc)
    if doc["kind"] == "ConfigMap":
        check_envoy(doc)


def main(argv):
    expect_invalid = "--expect-invalid" in argv
    files = [a for a in argv if a != "--expect-invalid"]
    if not files:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    schema = sandbox_schema()
    failed = 0
    for path in files:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
        if not docs:
            print(f"FAIL {path}: no documents")
            failed += 1
        for doc in docs:
            label = f"{path}: {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
            try:
                validate(doc, schema)
                error = None
            except Exception as e:  # noqa: BLE001 - every failure is reported the same way
                error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if expect_invalid:
                ok = error is not None
                print(f"{'ok  ' if ok else 'FAIL'} {label}: {'refused: ' + error if ok else 'accepted, but it is invalid'}")
            else:
                ok = error is None
                print(f"{'ok  ' if ok else 'FAIL'} {label}{'' if ok else ': ' + error}")
            failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
