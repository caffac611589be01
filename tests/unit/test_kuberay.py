"""deploy/kuberay/ as Kubernetes would take it, checked offline.

Every YAML document there is validated against the schema of its kind: a RayCluster
against the openAPIV3Schema of KubeRay's own CRD, a ConfigMap or a Secret against
Kubernetes' (both vendored in tests/data/kuberay/, whose README names the versions).
The schemas are closed as the API server closes them: a field the schema does not name is
refused (kubectl's default, strict field validation), and two entries of a keyed list
(containers, env) may not share a key. Then what raydelay needs of the manifests: the head
starts raydelay (`raydelay up`), its config comes from the ConfigMap, the S3 credentials
from the Secret, Ray runs with raydelay's health checks, and the Ray of the image is one
raydelay supports. Each check is also shown failing on a broken copy.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shlex
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from raydelay.cluster.local import ray_system_config
from raydelay.config import Config, load_config
from raydelay.errors import InvalidArgument

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kuberay"
DATA = ROOT / "tests" / "data" / "kuberay"
GCS_PORT = "6379"  # KubeRay's default, unless the head's rayStartParams set `port`
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# --- schemas ------------------------------------------------------------------------------


def _closed(node: Any) -> Any:
    """``node`` with every object schema that names its properties closed to others, as a
    structural schema is: unknown fields are refused, except where the schema keeps them
    (``x-kubernetes-preserve-unknown-fields``) or describes a map (``additionalProperties``)."""
    if isinstance(node, list):
        return [_closed(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _closed(v) for k, v in node.items()}
    if (
        out.get("type") == "object"
        and isinstance(out.get("properties"), dict)
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _list_map_keys(validator, keys, instance, schema) -> Iterator[jsonschema.ValidationError]:
    """``x-kubernetes-list-type: map``: no two entries share their key (a container's name,
    an env variable's name), which the API server refuses."""
    if schema.get("x-kubernetes-list-type") != "map" or not validator.is_type(instance, "array"):
        return
    seen = set()
    for item in instance:
        if isinstance(item, dict):
            key = tuple(json.dumps(item.get(k), sort_keys=True) for k in keys)
            if key in seen:
                named = ", ".join(f"{k}={item.get(k)!r}" for k in keys)
                yield jsonschema.ValidationError(f"two entries with {named}")
            seen.add(key)


Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, {"x-kubernetes-list-map-keys": _list_map_keys}
)


@cache
def _crd() -> dict:
    return yaml.load((DATA / "ray.io_rayclusters.yaml").read_text(), Loader=LOADER)


@cache
def _validator(api_version: str, kind: str) -> Any:
    if (api_version, kind) == ("v1", "ConfigMap"):
        schema = json.loads((DATA / "configmap-v1.json").read_text())
    elif (api_version, kind) == ("v1", "Secret"):
        schema = json.loads((DATA / "secret-v1.json").read_text())
    elif kind == "RayCluster" and api_version.startswith("ray.io/"):
        crd = _crd()
        assert crd["kind"] == "CustomResourceDefinition"
        assert crd["spec"]["names"]["kind"] == "RayCluster"
        version = api_version.removeprefix(f"{crd['spec']['group']}/")
        found = [v for v in crd["spec"]["versions"] if v["name"] == version]
        assert found, f"{api_version}: not a version of KubeRay's RayCluster CRD"
        assert found[0]["served"] and not found[0].get("deprecated"), f"{api_version}: retired"
        schema = _closed(found[0]["schema"]["openAPIV3Schema"])
        # the CRD leaves metadata to Kubernetes: check it as Kubernetes' ObjectMeta
        meta = json.loads((DATA / "configmap-v1.json").read_text())
        schema["properties"]["metadata"] = {
            "$ref": "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
        }
        schema["$defs"] = meta["$defs"]
    else:
        raise AssertionError(f"{api_version} {kind}: no vendored schema for this kind")
    Validator.check_schema(schema)
    return Validator(schema)


def schema_errors(doc: dict) -> list[str]:
    """What the schema of ``doc``'s kind refuses in it, one line each (none: valid)."""
    validator = _validator(doc.get("apiVersion", ""), doc.get("kind", ""))
    return [
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.path)))
    ]


# --- the manifests ------------------------------------------------------------------------


def _documents() -> list[tuple[str, dict]]:
    """(where, document) of every YAML document in deploy/kuberay/."""
    found = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for i, doc in enumerate(yaml.load_all(path.read_text(), Loader=LOADER)):
            if doc is not None:
                found.append((f"{path.name}:{i}:{doc.get('kind')}", doc))
    return found


DOCUMENTS = _documents()


def _one(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d.get("kind") == kind]
    assert len(found) == 1, f"deploy/kuberay/ has {len(found)} {kind} documents, not 1"
    return found[0]


def _docs() -> list[dict]:
    return copy.deepcopy([d for _, d in DOCUMENTS])


def _ray_containers(cluster: dict) -> dict[str, dict]:
    """The Ray container of each group's pods (KubeRay's is the first of the pod), by group."""
    spec = cluster["spec"]
    groups = {"head": spec["headGroupSpec"]}
    groups.update({g["groupName"]: g for g in spec.get("workerGroupSpecs", [])})
    return {name: g["template"]["spec"]["containers"][0] for name, g in groups.items()}


def _head(cluster: dict) -> dict:
    return _ray_containers(cluster)["head"]


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def _config_text(docs: list[dict]) -> str:
    """The config TOML the head reads: the ConfigMap key that RAYDELAY_CONFIG names through
    the head's mount of it."""
    cluster, config_map = _one(docs, "RayCluster"), _one(docs, "ConfigMap")
    head = _head(cluster)
    named = _env(head).get("RAYDELAY_CONFIG", {}).get("value")
    assert named, "the head has no RAYDELAY_CONFIG value"
    path = PurePosixPath(named)
    volumes = {
        v["name"]: v for v in cluster["spec"]["headGroupSpec"]["template"]["spec"]["volumes"]
    }
    for mount in head.get("volumeMounts", []):
        if "subPath" in mount or not path.is_relative_to(mount["mountPath"]):
            continue
        source = volumes[mount["name"]].get("configMap")
        assert source, f"{mount['mountPath']}: not a ConfigMap volume"
        assert source["name"] == config_map["metadata"]["name"], "another ConfigMap is mounted"
        rel = str(path.relative_to(mount["mountPath"]))
        keys = {i["path"]: i["key"] for i in source.get("items", [])} or {
            k: k for k in config_map.get("data", {})
        }
        assert rel in keys, f"RAYDELAY_CONFIG={path}: the ConfigMap has no key for {rel}"
        return config_map["data"][keys[rel]]
    raise AssertionError(f"RAYDELAY_CONFIG={path}: no volume of the head is mounted there")


# --- the checks (each shown failing on a broken copy below) -------------------------------


def check_head_runs_raydelay_up(docs: list[dict]) -> str:
    """The head's postStart hook runs `raydelay up`, attached to this pod's Ray; returns
    the hook's script, for a test to run."""
    head = _head(_one(docs, "RayCluster"))
    params = _one(docs, "RayCluster")["spec"]["headGroupSpec"].get("rayStartParams", {})
    # attach to the Ray of this pod, never start one (`raydelay up` without an address would)
    address = _env(head).get("RAYDELAY_ADDRESS", {}).get("value")
    assert address == f"127.0.0.1:{params.get('port', GCS_PORT)}", f"RAYDELAY_ADDRESS={address}"
    command = head.get("lifecycle", {}).get("postStart", {}).get("exec", {}).get("command")
    assert command and command[:2] == ["/bin/bash", "-c"] and len(command) == 3, command
    assert re.search(r"\braydelay up\b", command[2]), "the hook does not run `raydelay up`"
    assert "ray start" not in command[2]  # KubeRay starts Ray itself
    return command[2]


def check_config_from_the_configmap(docs: list[dict], tmp: Path) -> Config:
    """RAYDELAY_CONFIG names the ConfigMap's TOML as the head mounts it; that TOML loads
    with raydelay's own loader (an unknown key or a wrong type is refused) and names an
    S3 store."""
    path = tmp / "raydelay.toml"
    path.write_text(_config_text(docs))
    try:
        config = load_config(path, env={})
    except InvalidArgument as exc:
        raise AssertionError(f"the ConfigMap's config: {exc}") from exc
    assert config.storage.kind == "s3", f"the store is {config.storage.kind}, not S3"
    assert config.storage.s3.bucket, "no bucket"
    return config


def check_credentials_from_the_secret(docs: list[dict]) -> None:
    """Every Ray container (raydelay's actors run in the workers' too) reads the two AWS
    keys from the Secret, and the Secret holds them; nothing else carries them."""
    cluster, secret = _one(docs, "RayCluster"), _one(docs, "Secret")
    keys = {**secret.get("data", {}), **secret.get("stringData", {})}
    for group, container in _ray_containers(cluster).items():
        env = _env(container)
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert name in env, f"{group}: no {name}"
            assert "value" not in env[name], f"{group}: {name} is written in the manifest"
            ref = env[name].get("valueFrom", {}).get("secretKeyRef")
            assert ref, f"{group}: {name} does not come from a Secret"
            assert ref["name"] == secret["metadata"]["name"], f"{group}: {name} from {ref}"
            assert ref["key"] in keys, f"{group}: the Secret has no key {ref['key']}"
            assert not ref.get("optional"), f"{group}: {name} may be missing"
    # KubeRay names its auth-token Secret after the RayCluster: ours must not be that one
    assert cluster["spec"].get("authOptions", {}).get("mode") == "token"
    assert secret["metadata"]["name"] != cluster["metadata"]["name"]
    assert "AWS_" not in _config_text(docs)


def check_health_checks(docs: list[dict], tmp: Path) -> None:
    """The head starts Ray with exactly the system config a Ray that raydelay starts gets
    (health checks and death timeouts), shell-quoted as one argument of `ray start`."""
    want = ray_system_config(check_config_from_the_configmap(docs, tmp))
    spec = _one(docs, "RayCluster")["spec"]
    raw = spec["headGroupSpec"].get("rayStartParams", {}).get("system-config")
    assert raw, "the head's rayStartParams have no system-config"
    words = shlex.split(raw)  # KubeRay writes `--system-config=<raw>` into a bash line
    assert len(words) == 1, f"system-config is {len(words)} shell words, not 1: quote it"
    assert json.loads(words[0]) == want
    for group in spec.get("workerGroupSpecs", []):  # set on the head, it holds for all nodes
        assert "system-config" not in group.get("rayStartParams", {}), group["groupName"]


def _ray_range() -> SpecifierSet:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ray = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "ray"]
    assert len(ray) == 1
    return ray[0].specifier


def _dockerfile_base() -> tuple[str, str]:
    """(Ray version, Python tag) of the Dockerfile's base image, with its ARG defaults."""
    text = (DEPLOY / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    base = re.search(r"^FROM (\S+)", text, re.M).group(1)
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
    found = re.fullmatch(r"rayproject/ray:(\d+\.\d+\.\d+)-(py3\d+)", base)
    assert found, f"Dockerfile: FROM {base} is not a rayproject/ray:<version>-py3<minor> tag"
    pinned = re.search(r'"ray\[default\]==\$\{RAY_VERSION\}"', text)
    assert pinned, "Dockerfile: pip may replace the image's Ray"
    return found.group(1), found.group(2)


def check_ray_version(docs: list[dict]) -> None:
    """rayVersion, the Dockerfile's base image and the pods' image tag name one Ray, in the
    range raydelay supports, on a Python raydelay runs on."""
    cluster = _one(docs, "RayCluster")
    version = cluster["spec"]["rayVersion"]
    assert version in _ray_range(), f"rayVersion {version} is outside ray {_ray_range()}"
    base, python = _dockerfile_base()
    assert base == version, f"the Dockerfile builds on Ray {base}, rayVersion is {version}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    minor = f"3.{python.removeprefix('py3')}"
    assert SpecifierSet(project["requires-python"]).contains(f"{minor}.0"), python
    for group, container in _ray_containers(cluster).items():
        tag = container["image"].rpartition(":")[2]
        assert tag == f"ray{version}-{python}", f"{group}: image {container['image']}"


# --- the tests ----------------------------------------------------------------------------


def test_the_vendored_schemas_are_the_ones_the_readme_names():
    readme = (DATA / "README.md").read_text()
    assert "KubeRay **v1.7.0**" in readme and "59d663aeec13760646da3db9c1cf8cfe883e30b7" in readme
    assert "Kubernetes **v1.36.0**" in readme
    assert _crd()["metadata"]["name"] == "rayclusters.ray.io"
    listed = re.findall(r"^([0-9a-f]{64})  (\S+)$", readme, re.M)
    sums = {name: digest for digest, name in listed}
    assert sorted(sums) == sorted(
        ["ray.io_rayclusters.yaml", "configmap-v1.json", "secret-v1.json"]
    )
    for name, digest in sums.items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name
    for name in ("configmap-v1.json", "secret-v1.json"):  # standalone: every $ref is inside
        text = (DATA / name).read_text()
        defs = json.loads(text)["$defs"]
        refs = re.findall(r'"\$ref": "([^"]+)"', text)
        assert refs and all(r.startswith("#/$defs/") and r[8:] in defs for r in refs), name


def test_deploy_kuberay_holds_a_raycluster_a_configmap_and_a_secret():
    kinds = sorted(d["kind"] for _, d in DOCUMENTS)
    assert kinds == ["ConfigMap", "RayCluster", "Secret"]


@pytest.mark.parametrize("where,doc", DOCUMENTS, ids=[w for w, _ in DOCUMENTS])
def test_every_document_is_valid_for_its_kind(where, doc):
    assert schema_errors(doc) == [], where


def _set(path: str, value: Any) -> Callable[[dict], None]:
    """A change that sets ``path`` (dots; numbers index lists) of a document to ``value``."""

    def change(doc: dict) -> None:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node = doc
        for p in parents:
            node = node[p]
        node[last] = value

    return change


def _duplicate_env(doc: dict) -> None:
    env = doc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    env.append(dict(env[0]))


HEAD = "spec.headGroupSpec.template.spec.containers.0"
BROKEN_DOCUMENTS = {
    "rayVersion as a number": ("RayCluster", _set("spec.rayVersion", 2.60), "spec.rayVersion"),
    "replicas as text": ("RayCluster", _set("spec.workerGroupSpecs.0.replicas", "two"), "replicas"),
    "a misspelled field": (
        "RayCluster",
        _set(f"{HEAD}.imagePullPolicyy", "Always"),
        "imagePullPolicyy",
    ),
    "a rayStartParams value as a number": (
        "RayCluster",
        _set("spec.workerGroupSpecs.0.rayStartParams", {"num-cpus": 4}),
        "num-cpus",
    ),
    "an env variable twice": ("RayCluster", _duplicate_env, "two entries with name="),
    "a bad metadata field": (
        "RayCluster",
        _set("metadata.labels", ["raydelay"]),
        "metadata.labels",
    ),
    "a ConfigMap value as a number": (
        "ConfigMap",
        lambda doc: doc["data"].update({"raydelay.toml": 1}),
        "data.raydelay.toml",
    ),
    "a Secret field that is not one": ("Secret", _set("strinData", {}), "strinData"),
}


@pytest.mark.parametrize("case", BROKEN_DOCUMENTS)
def test_the_validator_refuses_a_broken_copy(case):
    kind, change, named = BROKEN_DOCUMENTS[case]
    doc = _one(_docs(), kind)
    change(doc)
    errors = schema_errors(doc)
    assert errors and any(named in e for e in errors), errors


def _run_hook(script: str, tmp_path: Path, succeed_on: int) -> tuple[int, list[str]]:
    """Run the hook with a fake `raydelay` that fails until its ``succeed_on``-th call (0:
    never) and a `sleep` that returns at once; the exit code and the calls' arguments."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir(exist_ok=True)
    calls.write_text("")
    fake = bin_dir / "raydelay"
    fake.write_text(
        "#!/bin/bash\n"
        f'echo "$*" >> {calls}\n'
        f"n=$(wc -l < {calls})\n"
        f'[ {succeed_on} -gt 0 ] && [ "$n" -ge {succeed_on} ]\n'
    )
    (bin_dir / "sleep").write_text("#!/bin/sh\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": str(tmp_path)}
    script = script.replace("/tmp/raydelay-up.log", str(tmp_path / "up.log"))
    done = subprocess.run(["bash", "-c", script], env=env, timeout=30, check=False)
    return done.returncode, calls.read_text().splitlines()


def test_the_hook_retries_until_raydelay_is_up_and_gives_up_in_the_end(tmp_path):
    script = check_head_runs_raydelay_up(_docs())
    # Ray is not up for the first two tries: the third `raydelay up` succeeds, and so does
    # the hook (the container may start)
    code, calls = _run_hook(script, tmp_path, succeed_on=3)
    assert (code, calls) == (0, ["up", "up", "up"])
    # never up: the hook fails after its tries, and the kubelet restarts the container
    code, calls = _run_hook(script, tmp_path, succeed_on=0)
    assert code != 0 and len(calls) >= 10 and set(calls) == {"up"}


def test_the_config_comes_from_the_configmap_and_names_an_s3_store(tmp_path):
    check_config_from_the_configmap(_docs(), tmp_path)


def test_the_s3_credentials_come_from_the_secret():
    check_credentials_from_the_secret(_docs())


def test_ray_runs_with_raydelays_health_checks(tmp_path):
    check_health_checks(_docs(), tmp_path)


def test_the_ray_of_the_image_is_one_raydelay_supports():
    check_ray_version(_docs())


Change = Callable[[list[dict]], None]


def _container(docs: list[dict], group: int | None) -> dict:
    """The Ray container of the head (``group`` None) or of a worker group."""
    spec = _one(docs, "RayCluster")["spec"]
    pod = spec["headGroupSpec"] if group is None else spec["workerGroupSpecs"][group]
    return pod["template"]["spec"]["containers"][0]


def _env_entry(name: str, entry: dict | None, group: int | None = None) -> Change:
    """A change that replaces the env variable ``name`` by ``entry`` (None: drops it)."""

    def change(docs: list[dict]) -> None:
        container = _container(docs, group)
        env = [e for e in container["env"] if e["name"] != name]
        container["env"] = env + ([entry] if entry else [])

    return change


def _head_field(field: str, edit: Callable[[Any], Any]) -> Change:
    def change(docs: list[dict]) -> None:
        container = _container(docs, None)
        container[field] = edit(container[field])

    return change


def _edit_param(key: str, edit: Callable[[str], str]) -> Change:
    def change(docs: list[dict]) -> None:
        params = _one(docs, "RayCluster")["spec"]["headGroupSpec"]["rayStartParams"]
        params[key] = edit(params[key])

    return change


def _edit_config(edit: Callable[[str], str]) -> Change:
    def change(docs: list[dict]) -> None:
        data = _one(docs, "ConfigMap")["data"]
        for key in data:
            data[key] = edit(data[key])

    return change


def _rename(kind: str, name: str) -> Change:
    def change(docs: list[dict]) -> None:
        _one(docs, kind)["metadata"]["name"] = name

    return change


def _hook(edit: Callable[[str], str]) -> Change:
    def change(docs: list[dict]) -> None:
        command = _container(docs, None)["lifecycle"]["postStart"]["exec"]["command"]
        command[2] = edit(command[2])

    return change


def _ray_version(version: str) -> Change:
    def change(docs: list[dict]) -> None:
        _one(docs, "RayCluster")["spec"]["rayVersion"] = version

    return change


def _value(name: str, value: str) -> dict:
    return {"name": name, "value": value}


CHECKS: dict[str, Callable[[list[dict], Path], Any]] = {
    "up": lambda docs, tmp: check_head_runs_raydelay_up(docs),
    "config": check_config_from_the_configmap,
    "credentials": lambda docs, tmp: check_credentials_from_the_secret(docs),
    "health": check_health_checks,
    "version": lambda docs, tmp: check_ray_version(docs),
}
BROKEN_SETUPS: dict[str, tuple[str, Change]] = {
    "no RAYDELAY_ADDRESS (up would start a Ray of its own)": (
        "up",
        _env_entry("RAYDELAY_ADDRESS", None),
    ),
    "RAYDELAY_ADDRESS of another port": (
        "up",
        _env_entry("RAYDELAY_ADDRESS", _value("RAYDELAY_ADDRESS", "127.0.0.1:6380")),
    ),
    "a hook that does not run raydelay up": (
        "up",
        _hook(lambda s: s.replace("raydelay up", "raydelay topics list")),
    ),
    "RAYDELAY_CONFIG outside the mount": (
        "config",
        _env_entry("RAYDELAY_CONFIG", _value("RAYDELAY_CONFIG", "/etc/other/raydelay.toml")),
    ),
    "RAYDELAY_CONFIG naming no key of the ConfigMap": (
        "config",
        _env_entry("RAYDELAY_CONFIG", _value("RAYDELAY_CONFIG", "/etc/raydelay/other.toml")),
    ),
    "another ConfigMap mounted": ("config", _rename("ConfigMap", "other")),
    "a key raydelay does not know": ("config", _edit_config(lambda s: s + "\n[ray]\nperiod = 1\n")),
    "a local store": ("config", _edit_config(lambda s: s.replace('kind = "s3"', 'kind = "local"'))),
    "workers without the credentials": (
        "credentials",
        _env_entry("AWS_SECRET_ACCESS_KEY", None, group=0),
    ),
    "a credential written in the manifest": (
        "credentials",
        _env_entry("AWS_ACCESS_KEY_ID", _value("AWS_ACCESS_KEY_ID", "AKIA")),
    ),
    "the Secret named as KubeRay's token Secret": ("credentials", _rename("Secret", "raydelay")),
    "Ray's default health-check period": (
        "health",
        _edit_param("system-config", lambda s: s.replace('period_ms": 1000', 'period_ms": 3000')),
    ),
    "system-config without its shell quotes": (
        "health",
        _edit_param("system-config", lambda s: s.strip("'")),
    ),
    "a Ray outside raydelay's range": ("version", _ray_version("2.57.0")),
    "an image of another Ray": (
        "version",
        _head_field("image", lambda image: image.replace("ray2.60.0", "ray2.59.0")),
    ),
}


@pytest.mark.parametrize("case", BROKEN_SETUPS)
def test_each_check_refuses_a_broken_copy(case, tmp_path):
    check, change = BROKEN_SETUPS[case]
    docs = _docs()
    CHECKS[check](docs, tmp_path)  # the manifests as they are pass it
    change(docs)
    with pytest.raises(AssertionError):
        CHECKS[check](docs, tmp_path)
