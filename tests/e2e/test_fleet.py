"""A fleet as a fleet is deployed: a prefill instance, a decode instance and the router, each a
host of its own (a network namespace with a veth link to a bridge), KV moving over UCX's TCP
transport between the hosts' addresses. Greedy outputs through router -> prefill -> decode equal
one `both` instance's; faults (a prefill killed mid-transfer, a decode killed mid-stream, a link
down, a corrupt transfer) lose no request and leak no KV block on any instance."""
import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import BINARY, Server, require

PREFIX = f"ifd{os.getpid() % 10000}"
BRIDGE = PREFIX + "br"
SUBNET = "10.213.{}.".format(os.getpid() % 200 + 20)
# One long prompt per request (past the router's --disagg-min-tokens) and some short ones.
STORY = ("In the valley below the old mill, the river ran slow and brown through the autumn, and the "
         "children of the village came down each evening to watch the herons stand in the shallows. ")


def sh(*args, check=True):
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


class Fleet:
    """Network namespaces joined by a bridge in the root namespace (which the test talks from)."""

    def __init__(self):
        self.hosts = {}
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", SUBNET + "1/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")

    def add_host(self, name, index):
        ns, veth = f"{PREFIX}{name}", f"{PREFIX}{name}v"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", veth, "master", BRIDGE, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{SUBNET}{index}/24", "dev", "eth0")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        self.hosts[name] = (ns, SUBNET + str(index), veth)
        return self.hosts[name]

    def link(self, name, up):
        sh("ip", "link", "set", self.hosts[name][2], "up" if up else "down")

    def slow(self, name, rate):
        """Caps what the host sends (a token bucket: this kernel has no netem), so a pull takes seconds."""
        ns = self.hosts[name][0]
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate,
           "burst", "32kbit", "latency", "400ms")

    def close(self):
        for ns, _, veth in self.hosts.values():
            sh("ip", "link", "del", veth, check=False)
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", BRIDGE, check=False)


class Host:
    """One inferd process (serve or router) in a namespace, listening on its own address."""

    def __init__(self, fleet, name, args, env=None):
        self.ns, self.addr, _ = fleet.hosts[name]
        self.base = f"http://{self.addr}:8000"
        e = dict(os.environ, UCX_TLS="tcp", **(env or {}))
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.ns, BINARY] + args, stderr=subprocess.PIPE,
                                     text=True, env=e)
        self.log = []
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{name} did not start: " + "".join(self.log))
            time.sleep(0.1)

    def metrics(self):
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            out[name] = out.get(name, 0.0) + float(value)
        return out

    def metric(self, pattern):
        return sum(v for k, v in self.metrics().items() if re.search(pattern, k))

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


SERVE = ["serve", "--host", "0.0.0.0", "--port", "8000", "-t", "1", "--kv-cache-memory", "96MiB",
         "--max-model-len", "2048", "--kv-load-timeout", "3"]


def prefill_args(addr):
    # --kv-port 0: any free port (answers name it); a fixed one may still be held by the connections
    # of the previous test's instance.
    return SERVE + ["--role", "prefill", "--kv-host", addr, "--kv-port", "0"]


def post(base, path, body, timeout=120):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def stream(base, body, timeout=120):
    """The streamed text and whether the stream ended in an error event."""
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(dict(body, stream=True)).encode(),
                                 headers={"Content-Type": "application/json"})
    text, error = "", None
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                error = event["error"]
                continue
            for c in event.get("choices", []):
                text += c.get("text", "")
    return text, error


def prompt(i, repeats=6):
    return f"Story {i}. " + STORY * repeats + "Then one evening"


def wait_idle(host, timeout=30):
    """KV usage back to 0 with nothing running: no block leaked."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = host.metrics()
        used = sum(v for k, v in m.items() if "kv_cache_usage_perc" in k)
        running = sum(v for k, v in m.items() if "num_requests_running" in k or "num_requests_waiting" in k)
        if used == 0 and running == 0:
            return
        time.sleep(0.2)
    pytest.fail(f"{host.base}: KV usage {used} / requests {running} never went back to 0")


@pytest.fixture(scope="module")
def fleet():
    require(os.geteuid() == 0 and shutil.which("ip") is not None, "root and iproute2 (ip netns) for fleet tests")
    f = Fleet()
    try:
        for i, name in enumerate(["prefill", "decode", "router", "both"], start=2):
            f.add_host(name, i)
        yield f
    finally:
        f.close()


@pytest.fixture(scope="module")
def reference(fleet):
    h = Host(fleet, "both", SERVE)
    yield h
    h.stop()


def start_roles(fleet, prefill_env=None, decode_flags=()):
    started = []
    try:
        p = Host(fleet, "prefill", prefill_args(fleet.hosts["prefill"][1]), env=prefill_env)
        started.append(p)
        decode = SERVE + ["--role", "decode"]
        if "--kv-load-timeout" in decode_flags:  # the test's own replaces the default
            i = decode.index("--kv-load-timeout")
            del decode[i:i + 2]
        d = Host(fleet, "decode", decode + list(decode_flags))
        started.append(d)
        r = Host(fleet, "router", ["router", "--host", "0.0.0.0", "--port", "8000", "--prefill", p.base,
                                   "--decode", d.base, "--disagg-min-tokens", "64", "--health-interval", "0.5"])
        return p, d, r
    except Exception:
        for h in started:
            h.kill()
        raise


def logs(*hosts, lines=60):
    """The last lines each host wrote to stderr (for a failure's message)."""
    return "\n".join(f"--- {h.base}\n" + "".join(h.log[-lines:]) for h in hosts)


def stop_all(*hosts):
    for h in hosts:
        h.stop()


def test_router_prefill_decode_equals_one_instance(fleet, reference):
    p, d, r = start_roles(fleet)
    try:
        bodies = [{"prompt": prompt(i), "max_tokens": 24, "temperature": 0} for i in range(3)]
        bodies.append({"prompt": "Short question: what is two and two?", "max_tokens": 12, "temperature": 0})
        for body in bodies:
            want = post(reference.base, "/v1/completions", body)["choices"][0]["text"]
            got = post(r.base, "/v1/completions", body)
            assert got["choices"][0]["text"] == want
            text, error = stream(r.base, body)
            assert error is None and text == want
        chat = {"messages": [{"role": "user", "content": prompt(9)}], "max_tokens": 16, "temperature": 0}
        want = post(reference.base, "/v1/chat/completions", chat)["choices"][0]["message"]["content"]
        assert post(r.base, "/v1/chat/completions", chat)["choices"][0]["message"]["content"] == want
        # The long prompts went through the prefill instance and their KV over UCX: pulled, never
        # recomputed (the decode instance's prefix hits cover the pulled tokens).
        pulls = d.metric(r"kv_transfer_pulls_total.*side=\"decode\"")
        assert pulls >= 4, d.metrics()
        assert p.metric(r"kv_transfer_pulls_total.*side=\"prefill\"") == pulls
        assert d.metric(r"kv_transfer_failures_total") == 0
        assert d.metric(r"kv_load_failures_total") == 0
        assert d.metric(r"prefix_cache_hits_total") >= 4 * 200
        wait_idle(p)
        wait_idle(d)
        assert p.metric("kv_export_entries") == 0
    finally:
        stop_all(r, d, p)


def test_corrupt_transfer_is_recomputed(fleet, reference):
    p, d, r = start_roles(fleet, prefill_env={"INFERD_FAULT_CORRUPT_KV_EXPORT": "1"})
    try:
        body = {"prompt": prompt(21), "max_tokens": 16, "temperature": 0}
        want = post(reference.base, "/v1/completions", body)["choices"][0]["text"]
        assert post(r.base, "/v1/completions", body)["choices"][0]["text"] == want
        assert d.metric("kv_transfer_corrupt_blocks_total") == 1
        assert d.metric("kv_load_failures_total") == 1
        wait_idle(d)
        wait_idle(p)
    finally:
        stop_all(r, d, p)
        sh("ip", "netns", "exec", fleet.hosts["prefill"][0], "tc", "qdisc", "del", "dev", "eth0", "root",
           check=False)


def run_many(base, n, streamed, max_tokens=40, repeats=None, timeout=120):
    """n concurrent requests; returns (completed, clear errors, anything else). repeats(i): the
    length of request i's prompt in STORYs (default 6); timeout: what each may wait for a byte."""

    def one(i):
        text = prompt(100 + i) if repeats is None else prompt(100 + i, repeats(i))
        body = {"prompt": text, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        start = time.time()
        try:
            if streamed:
                text, error = stream(base, body, timeout)
                return "error" if error else ("ok" if text else "empty")
            out = post(base, "/v1/completions", body, timeout)
            return "ok" if out["choices"][0]["text"] else "empty"
        except urllib.error.HTTPError as e:
            payload = json.loads(e.read())
            return "error" if e.code >= 400 and payload.get("error", {}).get("message") else "bad-error"
        except Exception as e:  # a hang or a dropped connection
            return f"lost after {time.time() - start:.0f} s: {e!r}"

    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        results = list(ex.map(one, range(n)))
    return results


def test_prefill_killed_mid_transfer_loses_no_request(fleet):
    p, d, r = start_roles(fleet)
    try:
        results = []
        # Prompts of ~110 to ~1,000 tokens: the shortest is computed and pulled while the longer
        # ones are still being computed on the prefill instance's one thread. A fixed delay was
        # not enough: on a fast CPU all six were done within it (seen in CI). Together they fit the
        # decode instance's KV pool (~4,300 tokens), which computes what the prefill instance did
        # not: 13 s here in a Release build, but longer prompts that overfilled the pool took past
        # 120 s under ASan and under load (seen in check-fresh and CI), so each request may wait
        # 300 s: what counts is that none is lost, not how fast a loaded machine answers.
        t = threading.Thread(target=lambda: results.extend(
            run_many(r.base, 6, streamed=False, repeats=lambda i: 3 + 5 * i, timeout=300)))
        t.start()
        deadline = time.time() + 60
        while time.time() < deadline and p.metric(r'kv_transfer_pulls_total.*side="prefill"') < 1:
            time.sleep(0.02)
        p.kill()  # some prompts are being computed, some pulled, some queued
        t.join(timeout=400)
        assert not t.is_alive(), "requests hung after the prefill instance died"
        assert all(x in ("ok", "error") for x in results), (results, d.metrics(), logs(r, d))
        assert results.count("ok") >= 1, results
        # The kill hit requests in flight: the router saw the prefill instance fail, or a pull did.
        assert r.metric("errors_total") + d.metric("kv_load_failures_total") >= 1
        print("prefill killed:", results, "router errors", r.metric("errors_total"),
              "decode pull failures", d.metric("kv_load_failures_total"))
        # With the prefill instance gone, requests still complete on the decode instance.
        assert run_many(r.base, 2, streamed=True) == ["ok", "ok"]
        wait_idle(d)
    finally:
        stop_all(r, d, p)


def wait_for_pull(d, timeout=60):
    """Until the decode instance holds a request waiting for its KV (a pull in flight)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if d.metric("num_requests_waiting") > 0 and d.metric("num_requests_running") == 0:
            return
        time.sleep(0.05)
    pytest.fail("no pull was ever in flight")


def test_prefill_killed_mid_pull_recomputes(fleet, reference):
    # A slow prefill link: the pull of a 14 MB prompt KV takes seconds, and the kill lands inside it.
    fleet.slow("prefill", "20mbit")
    p, d, r = start_roles(fleet, decode_flags=["--kv-load-timeout", "60"])
    try:
        body = {"prompt": prompt(400, repeats=16), "max_tokens": 12, "temperature": 0}
        want = post(reference.base, "/v1/completions", body)["choices"][0]["text"]
        result = {}
        t = threading.Thread(target=lambda: result.update(post(r.base, "/v1/completions", body)))
        t.start()
        wait_for_pull(d)
        p.kill()
        t.join(timeout=120)
        assert not t.is_alive()
        assert result["choices"][0]["text"] == want
        assert d.metric("kv_load_failures_total") == 1
        assert d.metric(r"kv_transfer_failures_total") == 1
        wait_idle(d)
    finally:
        stop_all(r, d, p)
        sh("ip", "netns", "exec", fleet.hosts["prefill"][0], "tc", "qdisc", "del", "dev", "eth0", "root",
           check=False)


def test_decode_killed_mid_stream_ends_streams_clearly(fleet):
    p, d, r = start_roles(fleet)
    try:
        results = []
        # Long answers, and the kill waits until the decode instance is streaming them: a fixed sleep
        # let fast machines finish every stream before the kill (CI saw four "ok").
        t = threading.Thread(target=lambda: results.extend(run_many(r.base, 4, streamed=True, max_tokens=1500)))
        t.start()
        deadline = time.time() + 90
        while time.time() < deadline and d.metric("generation_tokens_total") < 16:
            time.sleep(0.05)
        assert d.metric("generation_tokens_total") >= 16, "the decode instance never started streaming"
        d.kill()
        t.join(timeout=120)
        assert not t.is_alive(), "streams hung after the decode instance died"
        assert all(x in ("ok", "error") for x in results), results
        assert "error" in results, results
        # Which kind the router counted (mid_stream, or connect when a stream had not started yet)
        # depends on timing: slower builds (the sanitizers) kill before the first byte.
        assert r.metric(r"errors_total") >= 1
        wait_idle(p)
        assert p.metric("kv_export_entries") == 0 or p.metric("kv_export_entries") <= 4  # dropped at lease end
    finally:
        stop_all(r, d, p)


def test_link_down_for_seconds_loses_no_request(fleet):
    fleet.slow("prefill", "50mbit")  # pulls take a second or two: the outage hits them
    p, d, r = start_roles(fleet)
    try:
        results = []
        t = threading.Thread(target=lambda: results.extend(run_many(r.base, 4, streamed=True)))
        t.start()
        wait_for_pull(d)
        fleet.link("prefill", False)  # the prefill host drops off the network
        time.sleep(4)
        fleet.link("prefill", True)
        t.join(timeout=300)
        assert not t.is_alive(), "requests hung across the link outage"
        assert all(x in ("ok", "error") for x in results), (results, logs(r, d))
        assert results.count("ok") >= 1, results
        print("link down:", results, "router errors", r.metric("errors_total"), "decode KV timeouts",
              d.metric("kv_load_timeouts_total"), "failures", d.metric("kv_load_failures_total"))
        time.sleep(2)  # health checks see the prefill instance again
        body = {"prompt": prompt(300), "max_tokens": 8, "temperature": 0}
        assert post(r.base, "/v1/completions", body)["choices"][0]["text"]
        wait_idle(d)
        wait_idle(p)
    finally:
        stop_all(r, d, p)
        sh("ip", "netns", "exec", fleet.hosts["prefill"][0], "tc", "qdisc", "del", "dev", "eth0", "root",
           check=False)
