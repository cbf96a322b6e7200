"""Starts real `inferd serve` processes for the end-to-end tests and stops them after."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.environ.get("INFERD_BINARY", os.path.join(ROOT, "build", "inferd"))
API_KEY = "test-key"
QWEN_TEMPLATE = os.path.join(ROOT, "tests", "fixtures", "chat_templates", "qwen2.5-instruct.jinja")


def require(available, what):
    """Skips the test when a prerequisite is missing; fails it in CI (CI=true) and in scripts/test
    (INFERD_REQUIRE_PREREQUISITES), where every prerequisite must be installed."""
    if available:
        return
    if os.environ.get("CI") == "true" or "INFERD_REQUIRE_PREREQUISITES" in os.environ:
        pytest.fail("missing prerequisite: " + what)
    pytest.skip(what)


def post_json(server, path, body, timeout=120):
    """POSTs `body` as JSON with the server's API key: (status, the parsed answer), errors included."""
    req = urllib.request.Request(server.base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + (server.api_key or "none")})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


class Server:
    def __init__(self, *flags, api_key=API_KEY):
        # A server that logs below info does not print the line with its port: give it one.
        quiet = "--log-level" in flags
        defaults = {"--port": str(free_port()) if quiet else "0", "-t": "2", "--kv-cache-memory": "96MiB",
                    "--max-model-len": "2048"}
        args = [BINARY, "serve"]
        for flag, value in defaults.items():  # a flag the test gives replaces its default
            if flag not in flags:
                args += [flag, value]
        if api_key:
            args += ["--api-key", api_key]
        self.api_key = api_key
        self.proc = subprocess.Popen(args + list(flags), stderr=subprocess.PIPE, text=True)
        self.log = []
        deadline = time.time() + 60
        self.port = int(args[args.index("--port") + 1]) if quiet else None
        while self.port is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("inferd serve exited: " + "".join(self.log))
            self.log.append(line)
            m = re.search(r"listening on http://[\d.]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if time.time() > deadline:
                raise RuntimeError("inferd serve did not start")
        self.base = f"http://127.0.0.1:{self.port}"
        while True:  # /health: 503 while loading, then 200
            try:
                req = urllib.request.Request(self.base + "/health")
                if api_key:
                    req.add_header("Authorization", "Bearer " + api_key)
                with urllib.request.urlopen(req, timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("inferd serve never became ready")
            time.sleep(0.05)
        # Keep reading stderr so the server never blocks on a full pipe.
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tool_server():
    """A server that parses hermes tool calls (the Qwen2.5 template), for the tool-call tests."""
    s = Server("--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--chat-template", QWEN_TEMPLATE)
    yield s
    s.stop()


@pytest.fixture
def make_server():
    started = []

    def make(*flags, **kw):
        s = Server(*flags, **kw)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop(signal.SIGKILL)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A real redis-server (Debian's) on a free loopback port, without persistence."""

    def __init__(self):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--loglevel", "warning"],
                                     stdout=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def redis_server():
    require(shutil.which("redis-server") is not None, "redis-server is not installed (scripts/setup installs it)")
    r = RedisServer()
    r.start()
    yield r
    r.kill()
