"""Writes the schemas in this folder, as vendored (tests/data/kuberay/README.md says from
where). Kept to show how they were made, and to redo it for newer versions:

    git clone https://github.com/ray-project/kuberay && git -C kuberay checkout v1.7.0
    pip download kubernetes-validate==1.37.0 --no-deps -d /tmp/kv
    python tests/data/kuberay/vendor.py kuberay /tmp/kv/kubernetes_validate-1.37.0-py3-none-any.whl

- ``ray.io_rayclusters.yaml``: KubeRay's CRD, copied byte for byte.
- ``configmap-v1.json``, ``secret-v1.json``: the strict JSON schemas of Kubernetes v1.36.0
  that kubernetes-validate ships (made from Kubernetes' OpenAPI spec), each made
  standalone: the definitions it refers to (ObjectMeta and what that refers to) copied
  into its own ``$defs``, and nothing else.
"""

import json
import shutil
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
K8S = "v1.36.0-local-strict"
CRD = "ray-operator/config/crd/bases/ray.io_rayclusters.yaml"
KINDS = ("configmap-v1", "secret-v1")
LOCAL = "/api/_definitions.json#/$defs/"


def standalone(kind: dict, defs: dict) -> dict:
    """``kind`` with every definition it reaches copied into ``$defs``, refs made local."""
    wanted: dict[str, dict] = {}

    def visit(node):
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                name = ref.removeprefix(LOCAL).removeprefix("#/$defs/")
                node["$ref"] = f"#/$defs/{name}"
                if name not in wanted:
                    wanted[name] = json.loads(json.dumps(defs[name]))
                    visit(wanted[name])
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(kind)
    return {**kind, "$defs": dict(sorted(wanted.items()))}


def main(kuberay: str, wheel: str) -> None:
    shutil.copyfile(Path(kuberay) / CRD, HERE / "ray.io_rayclusters.yaml")
    root = f"kubernetes_validate/kubernetes-json-schema/{K8S}/"
    with zipfile.ZipFile(wheel) as whl:
        defs = json.loads(whl.read(root + "_definitions.json"))["$defs"]
        for name in KINDS:
            kind = json.loads(whl.read(f"{root}{name}.json"))
            text = json.dumps(standalone(kind, defs), indent=1, sort_keys=True)
            (HERE / f"{name}.json").write_text(text + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
