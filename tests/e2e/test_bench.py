"""`inferd bench serve` against the real server (every request accounted for, TTFT <= E2E,
output tokens equal to what the server counted, plots written), and against servers that refuse
connections, answer with errors, or stall mid-stream: reported, never hung on."""
import json
import os
import socket
import subprocess
import threading
import time

from conftest import API_KEY, BINARY
from test_server import metric_value, metrics


def bench(*flags, timeout=300):
    return subprocess.run([BINARY, "bench", "serve", "--no-progress", *flags], capture_output=True, text=True,
                          timeout=timeout)


def test_bench_serve_accounts_for_every_request(server, tmp_path):
    out = tmp_path / "result.json"
    plots = tmp_path / "plots"
    generated_before = metric_value(metrics(server), "inferd:generation_tokens_total")
    p = bench("--base-url", server.base, "--api-key", API_KEY, "--num-prompts", "8", "--input-len", "32",
              "--output-len", "8", "--range-ratio", "0.5", "--max-concurrency", "4", "--request-rate", "20",
              "--slo", "ttft=60s,tpot=10s", "--result-json", str(out), "--plot", str(plots))
    assert p.returncode == 0, p.stderr
    assert "Serving Benchmark Result" in p.stdout and "Mean TTFT (ms)" in p.stdout
    r = json.loads(out.read_text())
    assert r["completed"] == 8 and r["failed"] == 0 and len(r["requests"]) == 8
    assert r["max_concurrent_requests"] <= 4
    assert r["request_goodput"] == r["request_throughput"]  # the SLOs are loose: every request is good
    for q in r["requests"]:
        assert q["success"] and q["error"] == ""
        assert 0 < q["ttft"] <= q["latency"]
        assert q["output_tokens"] == q["expected_output_tokens"]  # ignore_eos: exactly what was asked
        assert len(q["itl"]) >= 1
        # chunks are timed as they arrive, not when the response ends
        assert abs(q["latency"] - q["ttft"] - sum(q["itl"])) < 0.5
    assert r["mean_itl_ms"] > 1
    assert r["total_output_tokens"] == sum(q["output_tokens"] for q in r["requests"])
    generated = metric_value(metrics(server), "inferd:generation_tokens_total") - generated_before
    assert generated == r["total_output_tokens"]  # the usage chunks agree with the server's own count
    assert r["p99_ttft_ms"] >= r["median_ttft_ms"] > 0
    for png in ["ttft_cdf.png", "latency_over_time.png"]:
        assert (plots / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_chat_multi_turn_and_sweep(server, tmp_path):
    out = tmp_path / "sweep.json"
    p = bench("--base-url", server.base, "--api-key", API_KEY, "--endpoint", "/v1/chat/completions",
              "--dataset", "multi-turn", "--turns", "2", "--num-prompts", "4", "--input-len", "16",
              "--output-len", "4", "--sweep-concurrency", "1,2", "--result-json", str(out), "--plot", str(tmp_path))
    assert p.returncode == 0, p.stderr
    sweep = json.loads(out.read_text())["sweep"]
    assert len(sweep) == 2
    for run in sweep:
        assert run["completed"] == 4 and run["failed"] == 0
        # turn 2 resends turn 1 and its answer: its prompt is longer
        assert run["requests"][1]["prompt_tokens"] > run["requests"][0]["prompt_tokens"]
    assert sweep[0]["max_concurrent_requests"] == 1
    assert (tmp_path / "throughput_vs_ttft_p99.png").exists()
    assert "| max concurrency |" in p.stdout


def test_session_ids_pin_each_conversation(make_server):
    """--session-ids: each conversation's turns carry one session_id, so the server pins its
    finished turns' blocks (the session_pinned_blocks gauge rises); without it nothing is pinned.
    A server of its own: the pins would hold KV of the shared one for the session TTL."""
    server = make_server()

    def pinned():
        return metric_value(metrics(server), "inferd:session_pinned_blocks")
    before = pinned()
    flags = ["--base-url", server.base, "--api-key", API_KEY, "--endpoint", "/v1/chat/completions",
             "--dataset", "multi-turn", "--turns", "2", "--num-prompts", "3", "--input-len", "40",
             "--output-len", "4", "--max-concurrency", "1"]
    p = bench(*flags, "--seed", "41")
    assert p.returncode == 0, p.stderr
    assert pinned() == before
    p = bench(*flags, "--seed", "42", "--session-ids")
    assert p.returncode == 0, p.stderr
    assert pinned() > before


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refused_connections_are_reported(tmp_path):
    out = tmp_path / "r.json"
    t0 = time.time()
    p = bench("--base-url", f"http://127.0.0.1:{free_port()}", "--model", "m", "--num-prompts", "3",
              "--input-len", "8", "--output-len", "2", "--result-json", str(out), timeout=60)
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert r["completed"] == 0 and r["failed"] == 3
    assert all("refused" in e for e in r["errors"]), r["errors"]
    assert "3 of 3 requests failed" in p.stderr
    assert time.time() - t0 < 30


def test_error_answers_are_reported(server, tmp_path):
    out = tmp_path / "r.json"
    p = bench("--base-url", server.base, "--model", "x", "--num-prompts", "2", "--input-len", "8",
              "--output-len", "2", "--result-json", str(out))  # no API key: 401
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert r["failed"] == 2 and all(e.startswith("HTTP 401") for e in r["errors"]), r["errors"]


def test_a_server_that_stalls_mid_stream_times_out(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    held = []

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            event = b'data: {"choices":[{"index":0,"text":"a"}]}\n\n'
            conn.sendall(b"%x\r\n%s\r\n" % (len(event), event))  # one chunk, then silence

    threading.Thread(target=serve, daemon=True).start()
    out = tmp_path / "r.json"
    t0 = time.time()
    p = bench("--base-url", f"http://127.0.0.1:{port}", "--model", "m", "--num-prompts", "2", "--input-len", "8",
              "--output-len", "4", "--request-timeout", "2", "--result-json", str(out), timeout=60)
    listener.close()
    assert p.returncode == 0, p.stderr
    assert time.time() - t0 < 20
    r = json.loads(out.read_text())
    assert r["failed"] == 2 and all("timed out" in e for e in r["errors"]), r["errors"]
    assert all(q["ttft"] > 0 for q in r["requests"])  # the one chunk was seen before the stall


def test_bad_flags_are_one_line_errors():
    for flags, needle in [(["--endpoint", "/v2/x"], "--endpoint"), (["--request-rate", "fast"], "--request-rate"),
                          (["--slo", "ttft"], "--slo"), (["--dataset", "nope"], "--dataset"),
                          (["--base-url", "https://x"], "--base-url")]:
        p = bench("--model", "m", *flags, timeout=60)
        assert p.returncode != 0
        assert needle in p.stderr, p.stderr
