"""deploy/k8s: every manifest valid against the Kubernetes API schemas (kubernetes-validate, strict:
no unknown fields), the alert rules valid for Prometheus (promtool), the pieces consistent with
each other (selectors, port names, the router's instances against the autoscaler's maximum, the
drain against the grace period, the Redis address, the adapter's metric), and the same topology
run as processes on loopback from the manifests' own command lines: Redis, the StatefulSet's
replicas, the router in front; the probes answer, requests through the router complete, the
metrics the alerts and the autoscaler read exist, and a replica drained with SIGTERM loses no
request."""
import glob
import http.client
import json
import os
import re
import signal
import subprocess
import time

import kubernetes_validate
import pytest
import yaml

from conftest import BINARY, RedisServer, free_port
from test_install import default_model_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(ROOT, "deploy", "k8s")
KUBERNETES = kubernetes_validate.latest_version()


def documents():
    docs = []
    for path in sorted(glob.glob(os.path.join(K8S, "*.yaml"))):
        with open(path) as f:
            docs += [(os.path.basename(path), d) for d in yaml.safe_load_all(f) if d]
    return docs


def find(kind, name=None):
    found = [d for _, d in documents() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert found, (kind, name)
    return found[0]


def container(workload):
    return workload["spec"]["template"]["spec"]["containers"][0]


def flag(command, name):
    return command[command.index(name) + 1]


def test_every_manifest_is_valid_for_the_kubernetes_api():
    kinds = []
    for path, doc in documents():
        kinds.append(doc["kind"])
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # the Prometheus Operator's resources: checked below
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    for kind in ["StatefulSet", "Service", "Deployment", "HorizontalPodAutoscaler", "ServiceMonitor",
                 "PrometheusRule", "ConfigMap", "PersistentVolumeClaim"]:
        assert kind in kinds, kind
    # The check sees a broken manifest: a misspelled field and a wrong type.
    broken = json.loads(json.dumps(find("StatefulSet")))
    broken["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)
    broken = json.loads(json.dumps(find("Deployment", "inferd-router")))
    broken["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_alert_rules_and_scrape_config_are_valid(tmp_path):
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(find("PrometheusRule")["spec"]))
    p = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS: 6 rules found" in p.stdout, p.stdout
    alerts = {r["alert"]: r["expr"] for r in find("PrometheusRule")["spec"]["groups"][0]["rules"]}
    for what in ["time_to_first_token_seconds", "num_requests_waiting", "kv_cache_usage_perc",
                 "request_errors_total"]:
        assert any(what in e for e in alerts.values()), what
    # promtool sees a broken rule.
    rules.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [{"alert": "A", "expr": "rate(x[5m]"}]}]}))
    assert subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True).returncode != 0
    # The plain Prometheus job keeps the replicas' pods and their http port (Debian's promtool has no
    # Kubernetes discovery to check the file with).
    with open(os.path.join(K8S, "prometheus-scrape.yml")) as f:
        job = yaml.safe_load(f)["scrape_configs"][0]
    pod = find("StatefulSet", "inferd")["spec"]["template"]
    labels = pod["metadata"]["labels"]
    keep = job["relabel_configs"][0]
    assert keep["regex"] == labels["app.kubernetes.io/name"] + ";" + labels["app.kubernetes.io/component"]
    assert job["relabel_configs"][1]["regex"] in [p["name"] for p in container(find("StatefulSet"))["ports"]]


def test_the_pieces_fit_together():
    # Each Service selects the pods of a workload and names one of their ports.
    for svc in [d for _, d in documents() if d["kind"] == "Service"]:
        sel = svc["spec"]["selector"]
        pods = [w for _, w in documents() if w["kind"] in ("StatefulSet", "Deployment")
                and sel.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(pods) == 1, svc["metadata"]["name"]
        names = [p["name"] for p in container(pods[0])["ports"]]
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in names, (svc["metadata"]["name"], port)
    sts = find("StatefulSet", "inferd")
    headless = find("Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    serve = container(sts)["command"]
    # The drain fits the grace period; the probes: ready on /health, alive on /v2/health/live.
    assert float(flag(serve, "--shutdown-grace")) < sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert container(sts)["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container(sts)["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    # The model comes read-only from the volume.
    mount = container(sts)["volumeMounts"][0]
    assert mount["readOnly"] and flag(serve, "--model").startswith(mount["mountPath"] + "/")
    # The Redis tier's address is the Redis Service.
    redis = find("Service", "redis")
    assert flag(serve, "--kv-offload-redis") == f"redis://redis:{redis['spec']['ports'][0]['port']}"
    # The router lists every replica the autoscaler may start, by the StatefulSet's stable names.
    hpa = find("HorizontalPodAutoscaler", "inferd")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "inferd"}
    router = container(find("Deployment", "inferd-router"))["command"]
    instances = [router[i + 1] for i, w in enumerate(router) if w == "--instance"]
    port = headless["spec"]["ports"][0]["port"]
    assert instances == [f"http://inferd-{i}.inferd:{port}" for i in range(hpa["spec"]["maxReplicas"])]
    assert sts["spec"]["replicas"] == hpa["spec"]["minReplicas"]
    # The adapter exposes the HPA's metric from the server's gauge.
    adapter = yaml.safe_load(find("ConfigMap", "prometheus-adapter-inferd")["data"]["config.yaml"])["rules"][0]
    assert adapter["name"]["as"] == hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert adapter["seriesQuery"].startswith("inferd:num_requests_waiting{")


def post(port, path, body, timeout=120):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def wait_ok(port, path, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, f"exited with {proc.returncode}"
        try:
            if get(port, path)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{path} on {port} never answered 200")


def metric(text, name):
    return sum(float(m.group(1)) for m in re.finditer(r"^" + re.escape(name) + r"(?:\{[^}]*\})? (\S+)$", text, re.M))


def test_the_topology_runs_as_processes_on_loopback(tmp_path):
    """The manifests' command lines with what a cluster provides replaced by loopback: service
    names by 127.0.0.1 and free ports, the model volume by the default model; the KV cache shrunk
    to 256 MiB per replica (the tests share one machine)."""
    sts = find("StatefulSet", "inferd")
    replicas = sts["spec"]["replicas"]
    redis_cmd = container(find("Deployment", "redis"))["command"]
    redis = RedisServer()
    redis.port = free_port()
    redis.url = f"redis://127.0.0.1:{redis.port}"
    procs = []
    try:
        args = list(redis_cmd)
        args[args.index("--port") + 1] = str(redis.port)
        procs.append(subprocess.Popen(args + ["--bind", "127.0.0.1"], stdout=subprocess.DEVNULL))
        redis.proc = procs[-1]
        ports = [free_port() for _ in range(4)]  # inferd-0 ... inferd-3; only `replicas` run
        for i in range(replicas):
            cmd = list(container(sts)["command"])
            cmd[0] = BINARY
            cmd[cmd.index("--model") + 1] = default_model_path()
            cmd[cmd.index("--host") + 1] = "127.0.0.1"
            cmd[cmd.index("--port") + 1] = str(ports[i])
            cmd[cmd.index("--kv-offload-redis") + 1] = redis.url
            cmd[cmd.index("--kv-cache-memory") + 1] = "256MiB"
            procs.append(subprocess.Popen(cmd, stderr=subprocess.DEVNULL))
        router_cmd = list(container(find("Deployment", "inferd-router"))["command"])
        router_cmd[0] = BINARY
        router_port = free_port()
        router_cmd[router_cmd.index("--host") + 1] = "127.0.0.1"
        router_cmd[router_cmd.index("--port") + 1] = str(router_port)
        for i in range(4):
            at = router_cmd.index(f"http://inferd-{i}.inferd:8000")
            router_cmd[at] = f"http://127.0.0.1:{ports[i]}"
        router_cmd[router_cmd.index("--instance"):router_cmd.index("--instance")] = ["--health-interval", "0.5"]
        replica_procs = procs[1:]
        for i, p in enumerate(replica_procs):
            wait_ok(ports[i], container(sts)["readinessProbe"]["httpGet"]["path"], p)
            assert get(ports[i], container(sts)["livenessProbe"]["httpGet"]["path"])[0] == 200
        procs.append(subprocess.Popen(router_cmd, stderr=subprocess.DEVNULL))
        wait_ok(router_port, "/health", procs[-1])
        time.sleep(1.5)  # a few health rounds: the replicas not running are marked down

        sent = 0
        for n in range(8):
            status, data = post(router_port, "/v1/completions", {"model": "smollm2", "prompt": f"Request {n}: " * 20,
                                                                  "max_tokens": 4, "temperature": 0})
            assert status == 200, data
            sent += 1
        served = []
        for i in range(replicas):
            text = get(ports[i], "/metrics")[1].decode()
            served.append(metric(text, "inferd:request_success_total"))
            assert metric(text, "inferd:kv_offload_tier_up") == 1  # the Redis tier answers
            assert "inferd:num_requests_waiting" in text  # the autoscaler's and the alert's series
            assert "inferd:request_errors_total" in text
        assert sum(served) == sent, served

        # A replica drained (what the kubelet does on scale-down) exits 0 within the grace period,
        # and the router goes on serving through the other.
        grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        replica_procs[-1].send_signal(signal.SIGTERM)
        assert replica_procs[-1].wait(timeout=grace) == 0
        time.sleep(1.5)
        for n in range(3):
            status, data = post(router_port, "/v1/completions", {"model": "smollm2", "prompt": f"After {n}",
                                                                  "max_tokens": 4})
            assert status == 200, data
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
