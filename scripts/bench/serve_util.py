"""Starting `inferd serve` for the benchmark scripts."""
import os
import re
import socket
import subprocess
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INFERD = os.path.join(ROOT, "build", "inferd")
PEER_DIR = os.path.expanduser(os.environ.get("INFERD_PEER_DIR", "~/.cache/inferd-peer"))


def peer_build():
    """Which llama.cpp build the peer is, as scripts/peer/build_llama_cpp.sh recorded it (variant,
    why, CPU): printed with every comparison, so that a figure names the build it was won against."""
    try:
        with open(os.path.join(PEER_DIR, "BUILD")) as f:
            fields = dict(line.rstrip("\n").split(": ", 1) for line in f if ": " in line)
    except OSError:
        return "unknown build (no BUILD file: rebuild with scripts/peer/build_llama_cpp.sh)"
    return (f"llama.cpp of llama-cpp-python {fields.get('llama-cpp-python', '?')}, {fields.get('variant', '?')} build "
            f"({fields.get('why', '?')}) on {fields.get('cpu', '?')}")


def start_server(*flags, log=None):
    """Starts `inferd serve` on a free port with 2 threads; returns (process, port) once ready.
    log: a file its stderr goes on to (else dropped)."""
    p = subprocess.Popen([INFERD, "serve", "--port", "0", "-t", "2", *flags], stderr=subprocess.PIPE, text=True)
    port = None
    while True:
        line = p.stderr.readline()
        if not line:
            raise RuntimeError("inferd serve exited before it was ready")
        m = re.search(r"listening on http://[\d.]+:(\d+)", line)
        port = port or (int(m.group(1)) if m else None)
        if "ready:" in line:
            threading.Thread(target=lambda: [log and log.write(x) for x in p.stderr], daemon=True).start()
            return p, port


def free_port():
    """A loopback port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc, port, timeout=300, what="the server"):
    """Returns once the server on `port` answers /health 200; exits if it stops or never does."""
    import time
    import urllib.request
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited before it was ready")
        time.sleep(0.2)
    raise SystemExit(f"{what} never became ready")
