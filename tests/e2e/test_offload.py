"""KV offload tiers through the real binary: two inferd processes share a prefix through one
redis-server (the second one's request is a hit, with the same answer), a Redis killed mid-run
fails no request, and a disk tier outlives the process that wrote it."""
import concurrent.futures
import json
import time

from test_server import PER_TIER_SERIES, dashboard_series, metric_value, metrics, raw

SYSTEM = [{"role": "system", "content": "You answer questions about the solar system in one sentence. " * 20}]


def ask(server, question, max_tokens=8):
    body = {"messages": SYSTEM + [{"role": "user", "content": question}], "max_tokens": max_tokens,
            "temperature": 0}
    status, _, data = raw(server, "POST", "/v1/chat/completions", body)
    assert status == 200, data
    return json.loads(data)["choices"][0]["message"]["content"]


def tier_metric(server, name, tier):
    text = metrics(server)
    for line in text.splitlines():
        if line.startswith("inferd:" + name + "{") and f'tier="{tier}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_for_writes(server, tier, at_least, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        writes = tier_metric(server, "kv_offload_writes_total", tier) or 0
        if writes >= at_least:
            return writes
        time.sleep(0.1)
    raise AssertionError(f"{tier} tier wrote fewer than {at_least} blocks")


def test_two_processes_share_a_prefix_through_redis(make_server, redis_server):
    flags = ("--kv-offload-redis", redis_server.url, "--kv-offload-watermark", "0")
    a = make_server(*flags)
    b = make_server(*flags)
    answer = ask(a, "Which planet is largest?")
    wait_for_writes(a, "redis", 10)
    assert tier_metric(b, "kv_offload_reads_total", "redis") == 0
    assert ask(b, "Which planet is largest?") == answer
    assert tier_metric(b, "kv_offload_reads_total", "redis") >= 10
    assert tier_metric(b, "kv_offload_tier_up", "redis") == 1
    assert metric_value(metrics(b), "inferd:prefix_cache_hits_total") >= 10 * 16


def test_redis_killed_mid_run_fails_no_request(make_server, redis_server):
    s = make_server("--kv-offload-redis", redis_server.url, "--kv-offload-watermark", "0")
    expected = ask(s, "Name a moon of Jupiter.")
    questions = [f"Question {i}: how far is planet {i} from the sun?" for i in range(6)]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(ask, s, q, 256) for q in questions]
        time.sleep(0.3)
        redis_server.kill()
        answers = [f.result(timeout=300) for f in futures]
    assert all(answers)
    # New prompts after the outage: their blocks go to the (dead) tier, which must fail softly.
    assert all(ask(s, f"After the outage, question {i}: name a comet.", 16) for i in range(3))
    assert ask(s, "Name a moon of Jupiter.") == expected  # recomputed or from the pool: the same
    deadline = time.time() + 20  # the writer thread notices on its next write
    while tier_metric(s, "kv_offload_tier_up", "redis") != 0 and time.time() < deadline:
        time.sleep(0.1)
    assert tier_metric(s, "kv_offload_tier_up", "redis") == 0
    assert tier_metric(s, "kv_offload_failures_total", "redis") >= 1


def test_disk_tier_outlives_the_process(make_server, tmp_path):
    flags = ("--kv-offload-dir", str(tmp_path), "--kv-offload-watermark", "0")
    a = make_server(*flags)
    answer = ask(a, "Which planet has rings?")
    wait_for_writes(a, "disk", 10)
    assert a.stop() == 0
    b = make_server(*flags)
    assert ask(b, "Which planet has rings?") == answer
    assert tier_metric(b, "kv_offload_reads_total", "disk") >= 10
    used = dashboard_series() & PER_TIER_SERIES
    assert used and all(tier_metric(b, name[len("inferd:"):], "disk") is not None for name in used)


def test_bad_offload_flags_are_one_line_errors(tmp_path):
    import subprocess
    from conftest import BINARY
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for flags, needle in [(["--kv-offload-dir", str(blocker / "sub")], "--kv-offload-dir"),
                          (["--kv-offload-redis", "http://x"], "--kv-offload-redis"),
                          (["--kv-offload-redis", "redis://127.0.0.1:6", "--no-prefix-caching"], "prefix caching")]:
        p = subprocess.run([BINARY, "serve", "--port", "0"] + flags, capture_output=True, text=True, timeout=60)
        assert p.returncode != 0
        assert needle in p.stderr, p.stderr
