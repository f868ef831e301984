"""The container and Kubernetes files under deploy/ and the Dockerfile
(issue #67, part 4): the manifests validate against the Kubernetes API's
schemas (`kubernetes-validate --strict`, from PyPI), hang together (the
pool, Service and autoscaler select the pods and ports the StatefulSet
makes), and every `ferrum serve` flag they pass exists."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import BIN, ROOT  # noqa: E402

yaml = pytest.importorskip("yaml")
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
DOCKERFILE = ROOT / "Dockerfile"


def documents(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def serve_flags():
    out = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", out))


def test_manifests_validate_against_the_kubernetes_schemas():
    exe = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("kubernetes-validate is not installed (pip install kubernetes-validate)")
    out = subprocess.run([exe, "--strict", *map(str, MANIFESTS)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    core = [d for p in MANIFESTS for d in documents(p) if "." not in d["apiVersion"].split("/")[0]
            or d["apiVersion"].startswith(("apps/", "autoscaling/"))]
    passed = re.findall(r"passed for resource", out.stdout + out.stderr)
    assert len(passed) == len(core) >= 6, out.stdout + out.stderr


@pytest.mark.parametrize("path", [p for p in MANIFESTS if p.name.startswith("ferrum-")], ids=lambda p: p.name)
def test_a_deployment_hangs_together(path):
    docs = {d["kind"]: d for d in documents(path)}
    sts, svc, hpa = docs["StatefulSet"], docs["Service"], docs["HorizontalPodAutoscaler"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["selector"].items() <= labels.items()
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                             "name": sts["metadata"]["name"]}
    [c] = sts["spec"]["template"]["spec"]["containers"]
    [port] = c["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": port["name"]}, probe
    args = c["args"]
    assert args[0] == "serve" and args[args.index("--port") + 1] == str(port["containerPort"])
    unknown = {a for a in args if a.startswith("--")} - serve_flags()
    assert not unknown, f"ferrum serve has no {unknown}"
    # The drain (--shutdown-timeout) and the preStop pause fit in the grace period.
    drain = int(args[args.index("--shutdown-timeout") + 1])
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > drain + 5
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert "/models" in mounts and "/tmp" in mounts  # the root filesystem is read-only


def test_the_inference_pool_selects_the_cpu_replicas():
    pool = next(d for d in documents(ROOT / "deploy/kubernetes/inferencepool.yaml") if d["kind"] == "InferencePool")
    sts = next(d for d in documents(ROOT / "deploy/kubernetes/ferrum-cpu.yaml") if d["kind"] == "StatefulSet")
    spec = pool["spec"]
    # inference.networking.k8s.io/v1's required fields.
    assert {"selector", "targetPorts", "endpointPickerRef"} <= spec.keys()
    assert spec["selector"]["matchLabels"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    [c] = sts["spec"]["template"]["spec"]["containers"]
    assert spec["targetPorts"] == [{"number": c["ports"][0]["containerPort"]}]
    assert spec["endpointPickerRef"]["name"] and spec["endpointPickerRef"]["port"]["number"] == 9002


def test_the_dockerfile_serves_what_its_health_check_reads():
    text = DOCKERFILE.read_text()
    assert re.search(r"^USER 10001$", text, re.M), "the container runs as a non-root user"
    assert "HEALTHCHECK" in text and "http://127.0.0.1:8000/health" in text
    assert re.search(r'^VOLUME \["/models"\]$', text, re.M) and "FERRUM_MODELS=/models" in text
    cmd = re.search(r"^CMD (\[.*\])$", text, re.M).group(1)
    args = json.loads(cmd)
    assert args[:2] == ["serve", "smollm2"] and args[args.index("--port") + 1] == "8000"
    assert not {a for a in args if a.startswith("--")} - serve_flags()
