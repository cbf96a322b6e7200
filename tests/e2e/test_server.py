"""`inferd serve` end to end with the official openai client and raw HTTP: the API, streaming,
usage, sampling fields, concurrency, cancellation, errors, authentication, metrics and drain."""
import http.client
import os
import json
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

import openai
import pytest

from conftest import API_KEY, BINARY, ROOT, require

MESSAGES = [{"role": "user", "content": "Name three colours."}]


def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key=server.api_key or "none", max_retries=0, timeout=120)


def raw(server, method, path, body=None, headers=None, key=True):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    h = dict(headers or {})
    if key and server.api_key:
        h["Authorization"] = "Bearer " + server.api_key
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
        h["Content-Type"] = "application/json"
    conn.request(method, path, body=body, headers=h)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, dict(r.getheaders()), data


def metrics(server):
    status, _, data = raw(server, "GET", "/metrics")
    assert status == 200
    return data.decode()


def metric_value(text, name):
    m = re.search(r"^" + re.escape(name) + r"(\{[^}]*\})? ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(2)) if m else None


def tokenize_messages(server, messages):
    status, _, data = raw(server, "POST", "/tokenize", {"messages": messages})
    assert status == 200
    return json.loads(data)["count"]


def test_models_and_health(server):
    models = client(server).models.list()
    assert len(models.data) == 1 and models.data[0].id
    status, _, _ = raw(server, "GET", "/health", key=False)  # open without the key
    assert status == 200


def test_chat_usage_matches_the_tokenizer(server):
    r = client(server).chat.completions.create(model=client(server).models.list().data[0].id, messages=MESSAGES,
                                               max_tokens=12, temperature=0)
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content
    assert c.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == tokenize_messages(server, MESSAGES)
    assert 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_equals_non_stream(server):
    cl = client(server)
    whole = cl.chat.completions.create(model="", messages=MESSAGES, max_tokens=16, temperature=0)
    chunks = list(cl.chat.completions.create(model="", messages=MESSAGES, max_tokens=16, temperature=0, stream=True,
                                             stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_lengths_and_prompt_forms(server):
    cl = client(server)
    r = cl.completions.create(model="", prompt="The capital of France is", max_tokens=5, temperature=0,
                              extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    status, _, data = raw(server, "POST", "/tokenize", {"prompt": "The capital of France is"})
    assert r.usage.prompt_tokens == json.loads(data)["count"]
    ids = json.loads(data)["tokens"]
    by_ids = cl.completions.create(model="", prompt=ids, max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    assert by_ids.choices[0].text == r.choices[0].text
    two = cl.completions.create(model="", prompt=["Hello", "One, two,"], max_tokens=3, temperature=0,
                                extra_body={"ignore_eos": True})
    assert [c.index for c in two.choices] == [0, 1] and two.usage.completion_tokens == 6


def test_stop_string_ends_the_text_before_it(server):
    cl = client(server)
    base = cl.completions.create(model="", prompt="1, 2, 3, 4,", max_tokens=20, temperature=0,
                                 extra_body={"ignore_eos": True}).choices[0].text
    assert len(base) > 6
    stop = base[3:6]
    r = cl.completions.create(model="", prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == base[:base.index(stop)]


def test_n_samples_and_seed_reproducibility(server):
    cl = client(server)
    kw = dict(model="", messages=MESSAGES, max_tokens=10, temperature=1.0, seed=1234, n=3)
    a = cl.chat.completions.create(**kw)
    b = cl.chat.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert len({c.message.content for c in a.choices}) > 1
    streamed = {}
    for chunk in cl.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
    assert [streamed[i] for i in range(3)] == [c.message.content for c in a.choices]


def test_logprobs(server):
    cl = client(server)
    r = cl.chat.completions.create(model="", messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True,
                                   top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].logprob == pytest.approx(e.logprob)  # greedy picks the best
    c = cl.completions.create(model="", prompt="Hello", max_tokens=4, temperature=0, logprobs=2,
                              extra_body={"ignore_eos": True})
    assert len(c.choices[0].logprobs.token_logprobs) == 4
    assert all(len(t) <= 2 for t in c.choices[0].logprobs.top_logprobs)


def test_sixty_four_concurrent_streams(server):
    results, errors = [], []

    def one(i):
        try:
            cl = client(server)
            text = ""
            n = 0
            for chunk in cl.completions.create(model="", prompt=f"Story {i}:", max_tokens=8, temperature=0, stream=True,
                                               extra_body={"ignore_eos": True}):
                if chunk.choices:
                    text += chunk.choices[0].text
                    n += 1
            results.append(text)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 64


def wait_idle(server, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = metrics(server)
        if metric_value(m, "inferd:kv_cache_usage_perc") == 0 and metric_value(m, "inferd:num_requests_running") == 0:
            return m
        time.sleep(0.05)
    raise AssertionError("KV cache never emptied: " + metrics(server))


def test_cancellation_mid_stream_frees_the_kv_cache(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 1000, "stream": True, "ignore_eos": True})
    conn.request("POST", "/v1/completions", body=body,
                 headers={"Authorization": "Bearer " + API_KEY, "Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    got = b""
    while got.count(b"data:") < 3:
        got += r.read1(4096) if hasattr(r, "read1") else r.fp.read1(4096)
    usage = metric_value(metrics(server), "inferd:kv_cache_usage_perc")
    assert usage > 0
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    m = wait_idle(server)
    assert 'finished_reason="abort"' in m


def test_cancellation_while_waiting_for_a_non_streamed_answer(server):
    s = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode() +
              b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    deadline = time.time() + 10
    while metric_value(metrics(server), "inferd:kv_cache_usage_perc") == 0 and time.time() < deadline:
        time.sleep(0.02)
    s.close()
    wait_idle(server)


def error_of(status, data):
    body = json.loads(data)
    assert set(body["error"]) >= {"message", "type", "param", "code"}
    return status, body["error"]


@pytest.mark.parametrize("body,param", [
    ({"messages": MESSAGES, "temperature": "hot"}, "temperature"),
    ({"messages": MESSAGES, "top_p": 2}, "top_p"),
    ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
    ({"messages": MESSAGES, "n": 1000}, "n"),
    ({"messages": MESSAGES, "stop": 5}, "stop"),
    ({"messages": MESSAGES, "logprobs": "yes"}, "logprobs"),
    ({"messages": MESSAGES, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({}, "messages"),
])
def test_bad_fields_are_400_naming_the_field(server, body, param):
    status, err = error_of(*raw(server, "POST", "/v1/chat/completions", body)[::2])
    assert status == 400 and err["param"] == param


def test_unknown_and_unimplemented_fields_are_400_informational_ones_accepted(server):
    status, err = error_of(*raw(server, "POST", "/v1/chat/completions",
                                {"messages": MESSAGES, "max_tokens": 2, "frobnicate": {"x": 1}})[::2])
    assert status == 400 and err["param"] == "frobnicate"
    status, err = error_of(*raw(server, "POST", "/v1/completions",
                                {"prompt": "x", "max_tokens": 2, "logits_processors": ["mod.fn"]})[::2])
    assert status == 400 and err["param"] == "logits_processors" and "not supported" in err["message"]
    status, _, data = raw(server, "POST", "/v1/chat/completions",
                          {"messages": MESSAGES, "max_tokens": 2, "user": "u1", "metadata": {"a": "b"},
                           "store": False})
    assert status == 200, data


def test_context_overflow_names_both_numbers(server):
    status, err = error_of(*raw(server, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 5000})[::2])
    assert status == 400 and "2048" in err["message"] and "5000" in err["message"]


def test_bad_json_unknown_model_and_endpoint(server):
    assert error_of(*raw(server, "POST", "/v1/completions", "{not json")[::2])[0] == 400
    status, err = error_of(*raw(server, "POST", "/v1/completions", {"model": "gpt-9", "prompt": "x"})[::2])
    assert status == 404 and err["code"] == "model_not_found"
    # The model is checked before the input side's errors, though both run off the I/O thread now.
    status, err = error_of(*raw(server, "POST", "/v1/completions",
                                {"model": "gpt-9", "prompt": "x", "max_tokens": 5000})[::2])
    assert status == 404 and err["code"] == "model_not_found"
    assert raw(server, "GET", "/v2/nothing")[0] == 404


def test_api_key(server):
    status, headers, data = raw(server, "POST", "/v1/completions", {"prompt": "x"}, key=False)
    assert status == 401 and error_of(status, data)[1]["type"] == "authentication_error"
    status, _, _ = raw(server, "POST", "/v1/completions", {"prompt": "x"}, key=False,
                       headers={"Authorization": "Bearer wrong"})
    assert status == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.base + "/v1", api_key="wrong", max_retries=0).models.list()
    assert raw(server, "GET", "/metrics", key=False)[0] == 200  # open by default


def test_protected_metrics_leave_health_open_for_probes(make_server):
    s = make_server("--protect-metrics")
    assert raw(s, "GET", "/metrics", key=False)[0] == 401
    assert raw(s, "GET", "/health", key=False)[0] == 200
    assert raw(s, "GET", "/metrics")[0] == 200
    assert raw(s, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 1}, key=False)[0] == 401


def test_http_1_0_stream_is_not_chunked(server):
    """RFC 9112 forbids chunked coding towards an HTTP/1.0 client: the events come raw and the
    connection closes after [DONE]."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    data = json.dumps({"prompt": "Once upon a time", "max_tokens": 8, "stream": True, "temperature": 0}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.0\r\nAuthorization: Bearer " + API_KEY.encode() +
                 b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(data)).encode() +
                 b"\r\n\r\n" + data)
    reply = b""
    while chunk := sock.recv(65536):
        reply += chunk
    sock.close()
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200")
    assert b"chunked" not in head.lower()
    events = body.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    texts = [json.loads(e[len("data: "):])["choices"][0]["text"] for e in events[:-2]]
    assert len(texts) >= 2 and all(e.startswith("data: ") for e in events[:-1])
    # The same request over HTTP/1.1 gives the same text.
    same = client(server).completions.create(model="", prompt="Once upon a time", max_tokens=8, temperature=0)
    assert "".join(texts) == same.choices[0].text


def test_body_limit_and_malformed_http(make_server):
    s = make_server("--max-body", "2KiB")
    status, err = error_of(*raw(s, "POST", "/v1/completions", {"prompt": "x" * 5000})[::2])
    assert status == 413
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    sock.sendall(b"THIS IS NOT HTTP\r\n\r\n")
    reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 400")
    sock.close()
    assert raw(s, "GET", "/health")[0] == 200  # still serving


def test_stalled_client_is_disconnected(make_server):
    s = make_server("--header-timeout", "1")
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and never finishes
    t0 = time.time()
    assert sock.recv(4096) == b""  # the server closed it
    assert time.time() - t0 < 5
    sock.close()


def open_request(server, body):
    """Sends a request on a raw socket and returns the socket without reading the answer."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode() +
                 b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(data)).encode() +
                 b"\r\n\r\n" + data)
    return sock


def wait_metric(server, name, value, timeout=20):
    deadline = time.time() + timeout
    while metric_value(metrics(server), name) != value:
        assert time.time() < deadline, f"{name} never reached {value}"
        time.sleep(0.02)


def test_queue_limit_gives_429_with_retry_after(make_server):
    s = make_server("--max-queue", "1", "--max-num-seqs", "1")
    long = {"prompt": "Hello", "max_tokens": 1000, "ignore_eos": True}
    running = open_request(s, long)
    wait_metric(s, "inferd:num_requests_running", 1)
    waiting = open_request(s, long)
    wait_metric(s, "inferd:num_requests_waiting", 1)
    status, headers, data = raw(s, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert status == 429 and headers.get("Retry-After") == "1"
    assert error_of(status, data)[1]["code"] == "queue_full"
    running.close()
    waiting.close()
    wait_idle(s)
    assert raw(s, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})[0] == 200


def wait_log_line(server, predicate, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for line in list(server.log):
            if predicate(line):
                return line
        time.sleep(0.05)
    raise AssertionError("no such log line in: " + "".join(server.log))


def test_one_json_log_line_per_finished_request(make_server):
    s = make_server("--log-format", "json")
    r = client(s).completions.create(model="", prompt=["Hi", "Ho"], max_tokens=3, temperature=0, n=2)
    line = wait_log_line(s, lambda l: r.id in l)
    entry = json.loads(line)
    assert entry["level"] == "info" and entry["msg"] == "request finished" and entry["id"] == r.id
    assert entry["prompt_tokens"] == r.usage.prompt_tokens
    assert entry["generation_tokens"] == r.usage.completion_tokens == 12
    assert entry["finish_reason"] == "length,length,length,length"
    assert 0 <= entry["queue_s"] <= entry["ttft_s"] <= entry["e2e_s"]
    for other in list(s.log):  # every line the server wrote is a JSON object
        assert isinstance(json.loads(other), dict), other


def test_log_level_warning_keeps_request_lines_out(make_server):
    s = make_server("--log-level", "warning")
    client(s).completions.create(model="", prompt="Hi", max_tokens=2, temperature=0)
    time.sleep(0.3)
    assert not [l for l in s.log if "request finished" in l]
    s.stop()
    assert not [l for l in s.log if "shutting down" in l]  # info, dropped too


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "seed": 7, "top_k": 40}])
def test_same_request_through_serve_generate_and_run_gives_the_same_ids(make_server, tmp_path, sampling):
    """The one request front end: the server, `inferd generate` and `inferd run` take the same
    request through the same input and output sides and the engine. A model without a tokenizer
    answers with token ids, so the ids themselves are compared."""
    model = os.path.join(ROOT, "tests", "fixtures", "tiny", "llama_tied", "model-f32.gguf")
    prompt = [5, 17, 3, 99, 42]
    s = make_server("--model", model)
    status, _, data = raw(s, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 12, **sampling})
    assert status == 200, data
    served = [int(t) for t in json.loads(data)["choices"][0]["text"].split()]

    line = json.dumps({"prompt_ids": prompt, "max_tokens": 12, **sampling})
    (tmp_path / "in.jsonl").write_text(line + "\n")
    subprocess.run([BINARY, "generate", "--model", model, "-i", str(tmp_path / "in.jsonl"), "-o",
                    str(tmp_path / "out.jsonl"), "--kv-cache-memory", "8MiB", "-t", "2"], check=True,
                   capture_output=True)
    generated = json.loads((tmp_path / "out.jsonl").read_text())["token_ids"]

    flags = ["--temperature", str(sampling["temperature"])]
    if "seed" in sampling:
        flags += ["--seed", str(sampling["seed"]), "--top-k", str(sampling["top_k"])]
    run = subprocess.run([BINARY, "run", "--model", model, "--prompt-ids", ",".join(map(str, prompt)), "-n", "12",
                          "-t", "2", *flags], check=True, capture_output=True, text=True)
    ran = [int(t) for t in run.stdout.strip().split(",")]
    assert len(served) == 12
    assert served == generated == ran


def test_queue_limit_counts_every_prompt_and_sample(make_server):
    s = make_server("--max-queue", "4", "--max-num-seqs", "1", "--max-prompts", "8")
    status, err = error_of(*raw(s, "POST", "/v1/completions", {"prompt": ["Hi"] * 9, "max_tokens": 1})[::2])
    assert status == 400 and err["param"] == "prompt" and "at most 8" in err["message"]
    status, err = error_of(*raw(s, "POST", "/v1/completions", {"prompt": ["Hi"] * 5, "max_tokens": 1})[::2])
    assert status == 400 and err["param"] == "prompt"
    status, err = error_of(*raw(s, "POST", "/v1/chat/completions", {"messages": MESSAGES, "n": 5,
                                                                     "max_tokens": 1})[::2])
    assert status == 400 and err["param"] == "n"
    # One request of 4 prompts: one runs, three wait; a request of 2 more prompts does not fit.
    long = open_request(s, {"prompt": ["Hello", "Bye", "Yes", "No"], "max_tokens": 1000, "ignore_eos": True})
    wait_metric(s, "inferd:num_requests_running", 1)
    status, headers, data = raw(s, "POST", "/v1/completions", {"prompt": ["Hi", "Ho"], "max_tokens": 2})
    assert status == 429 and headers.get("Retry-After") == "1"
    assert error_of(status, data)[1]["code"] == "queue_full"
    long.close()
    wait_idle(s)
    status, _, data = raw(s, "POST", "/v1/completions", {"prompt": ["Hi"] * 4, "max_tokens": 2})
    assert status == 200 and len(json.loads(data)["choices"]) == 4


def test_ten_thousand_prompts_are_refused_at_once(server):
    """The hostile probe's request: it used to queue whole and starve every other client."""
    t0 = time.time()
    status, err = error_of(*raw(server, "POST", "/v1/completions", {"prompt": ["Hi"] * 10000, "max_tokens": 1})[::2])
    assert status == 400 and err["param"] == "prompt"
    assert raw(server, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1})[0] == 200
    assert time.time() - t0 < 30


def test_metrics_pass_promtool_and_follow_vllm_names(server):
    client(server).completions.create(model="", prompt="Hi", max_tokens=3, temperature=0)
    text = metrics(server)
    for name in ["time_to_first_token_seconds", "time_per_output_token_seconds", "inter_token_latency_seconds",
                 "e2e_request_latency_seconds", "request_queue_time_seconds", "request_prefill_time_seconds",
                 "request_decode_time_seconds", "request_prompt_tokens", "request_generation_tokens"]:
        assert f"# TYPE inferd:{name} histogram" in text, name
    for name in ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"]:
        assert f"# TYPE inferd:{name} gauge" in text, name
    for name in ["prompt_tokens_total", "generation_tokens_total", "request_success_total", "num_preemptions_total",
                 "prefix_cache_queries_total", "prefix_cache_hits_total"]:
        assert re.search(r"^inferd:" + name + r"\{", text, re.M), name
    assert metric_value(text, "inferd:generation_tokens_total") >= 3
    if shutil.which("promtool"):
        # Exit 1 would be a format error. Exit 3 is lint: promtool objects to ':' in names (it reserves
        # it for recording rules), which vLLM's names, and so ours, use on purpose; nothing else may show.
        p = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        problems = [l for l in (p.stdout + p.stderr).splitlines() if l.strip()]
        assert p.returncode in (0, 3), p.stdout + p.stderr
        assert all("metric names should not contain ':'" in l for l in problems), problems


def test_vllm_prefix(make_server):
    s = make_server("--metrics-prefix", "vllm")
    text = metrics(s)
    assert "vllm:time_to_first_token_seconds_bucket" in text and "inferd:" not in text


def test_scraped_by_a_real_prometheus(server):
    require(shutil.which("prometheus") is not None, "prometheus is not installed (scripts/setup installs it)")
    client(server).completions.create(model="", prompt="Hi", max_tokens=2, temperature=0)
    with tempfile.TemporaryDirectory() as d:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            prom_port = probe.getsockname()[1]
        config = f"""global:
  scrape_interval: 1s
scrape_configs:
  - job_name: inferd
    metrics_path: /metrics
    static_configs:
      - targets: ["127.0.0.1:{server.port}"]
"""
        with open(f"{d}/prometheus.yml", "w") as f:
            f.write(config)
        prom = subprocess.Popen(["prometheus", f"--config.file={d}/prometheus.yml", f"--storage.tsdb.path={d}/data",
                                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 60
            value = None
            while time.time() < deadline:
                try:
                    q = urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/api/v1/query?query="
                                               "inferd:generation_tokens_total", timeout=2)
                    result = json.loads(q.read())["data"]["result"]
                    if result:
                        value = float(result[0]["value"][1])
                        break
                except Exception:
                    pass
                time.sleep(0.5)
            assert value is not None and value >= 2
        finally:
            prom.terminate()
            prom.wait(timeout=30)


def test_sigterm_drains_in_flight_requests(make_server):
    s = make_server("--shutdown-grace", "30")
    out = {}

    def one():
        out["r"] = client(s).completions.create(model="", prompt="Count:", max_tokens=40, temperature=0,
                                                extra_body={"ignore_eos": True})

    t = threading.Thread(target=one)
    t.start()
    deadline = time.time() + 10
    while metric_value(metrics(s), "inferd:num_requests_running") == 0 and time.time() < deadline:
        time.sleep(0.02)
    s.proc.send_signal(signal.SIGTERM)
    t.join()
    assert out["r"].choices[0].finish_reason == "length" and out["r"].usage.completion_tokens == 40
    assert s.proc.wait(timeout=30) == 0


def test_sigterm_aborts_what_outlives_the_grace(make_server):
    s = make_server("--shutdown-grace", "0.2")
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "Go", "max_tokens": 1500, "stream": True,
                                                             "ignore_eos": True}),
                 headers={"Authorization": "Bearer " + API_KEY, "Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    body = r.fp.read1(100)
    s.proc.send_signal(signal.SIGTERM)
    body += r.fp.read()  # the rest of the stream (raw chunks), until the server closes it
    assert s.proc.wait(timeout=30) == 0
    conn.close()
    # The stream was cut by the abort after the grace, not finished: its last choice says so.
    events = [json.loads(e) for e in re.findall(r"data: (\{.*?\})\n\n", body.decode())]
    reasons = [e["choices"][0]["finish_reason"] for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert reasons == ["abort"]
    assert len(events) < 1500


def test_the_grafana_dashboard_queries_only_series_we_export(server):
    used = dashboard_series()
    assert len(used) >= 10
    text = metrics(server)
    for name in used:
        if name in PER_TIER_SERIES | SLO_SERIES:
            continue  # exported once a tier / an SLO class is configured: test_offload / test_slo_classes check them
        assert re.search("^" + re.escape(name) + r"(_bucket|_sum|_count)?[{ ]", text, re.M), name


# Offload series labelled by tier: a server without --kv-offload-* has none yet.
PER_TIER_SERIES = {"inferd:kv_offload_" + n for n in
                   ["writes_total", "write_bytes_total", "reads_total", "read_bytes_total", "failures_total",
                    "corrupt_blocks_total", "tier_up"]}


# Series labelled by SLO class: a server without --slo-class has none.
SLO_SERIES = {"inferd:slo_" + n for n in
              ["requests_total", "time_to_first_token_seconds", "time_per_output_token_seconds"]}


def dashboard_series():
    import os
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "deploy", "grafana", "inferd-dashboard.json")) as f:
        dashboard = json.load(f)
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v.get("query", "") if isinstance(v.get("query"), str) else v.get("query", {}).get("query", "")
              for v in dashboard.get("templating", {}).get("list", [])]
    return {re.sub(r"_(bucket|count|sum)$", "", n) for e in exprs for n in re.findall(r"inferd:[a-z0-9_]+", e)}


def test_idle_keep_alive_connection_is_closed(make_server):
    s = make_server("--idle-timeout", "1")
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode() + b"\r\n\r\n")
    reply = b""
    while b"\r\n\r\n" not in reply or not reply.endswith(b"}"):
        reply += sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 200")
    t0 = time.time()
    assert sock.recv(4096) == b""  # kept alive, then closed once idle for 1 s
    assert 0.5 < time.time() - t0 < 5
    sock.close()


def test_oversized_headers_are_431(server):
    status, _, data = raw(server, "GET", "/health", headers={"X-Junk": "a" * 40000})
    assert status == 431 and error_of(status, data)[0] == 431


def test_session_pin_survives_traffic_that_evicts_unpinned_blocks(make_server):
    """A small pool (16 MiB: about 45 blocks of SmolLM2's f16 KV) and three unrelated ~400-token
    prompts between two turns of a chat. Without a session the traffic evicts the first turn's
    cached blocks (the control, which shows the traffic is enough); with a session (header on
    the first turn, body field on the second) they stay pinned and the second turn hits."""
    s = make_server("--kv-cache-memory", "16MiB")

    def chat(messages, **kw):
        status, _, data = raw(s, "POST", "/v1/chat/completions", {"messages": messages, "max_tokens": 4, **kw.get("body", {})},
                              headers=kw.get("headers"))
        assert status == 200
        return json.loads(data)["choices"][0]["message"]["content"]

    def flood(tag):
        for k in range(3):
            prompt = f"Report {tag}{k}: " + " ".join(f"{tag}{k}x{i}" for i in range(100))
            status, _, data = raw(s, "POST", "/tokenize", {"prompt": prompt})
            assert 250 < json.loads(data)["count"] < 560
            assert raw(s, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 1})[0] == 200

    def two_turns(system, session):
        first = [{"role": "system", "content": system}, {"role": "user", "content": "Hello"}]
        answer = chat(first, headers={"X-Session-Id": session} if session else None)
        if session:
            text = metrics(s)
            assert metric_value(text, "inferd:active_sessions") >= 1
            assert metric_value(text, "inferd:session_pinned_blocks") > 0
        flood("s" if session else "c")
        hits_before = metric_value(metrics(s), "inferd:prefix_cache_hits_total")
        second = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And then?"}]
        chat(second, body={"session_id": session} if session else {})
        return metric_value(metrics(s), "inferd:prefix_cache_hits_total") - hits_before

    assert two_turns("You are a terse assistant. " * 20, None) < 16 * 4  # evicted
    assert two_turns("You are a careful assistant. " * 20, "conversation-7") >= 16 * 4  # pinned


def test_prompt_tokens_details_report_the_cached_prompt(server, make_server):
    # Off by default, as in vLLM: usage has no prompt_tokens_details.
    plain = client(server).chat.completions.create(model="", messages=[{"role": "user", "content": "Hi"}],
                                                   max_tokens=2)
    assert plain.usage.prompt_tokens_details is None
    s = make_server("--enable-prompt-tokens-details")
    system = "You answer questions about lighthouses and their keepers, briefly. " * 12
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Who keeps them?"}]
    c = client(s)
    first = c.chat.completions.create(model="", messages=messages, max_tokens=3)
    assert first.usage.prompt_tokens_details.cached_tokens == 0  # a fresh server: nothing cached
    second = c.chat.completions.create(model="", messages=messages, max_tokens=3)
    cached = second.usage.prompt_tokens_details.cached_tokens
    # Whole blocks of the same prompt come from the cache; the last token is always recomputed.
    assert first.usage.prompt_tokens - 16 <= cached < first.usage.prompt_tokens and cached % 16 == 0
    # The streamed usage chunk says the same; n > 1 counts the prompt once.
    chunks = list(c.chat.completions.create(model="", messages=messages, max_tokens=3, n=2, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == cached
    # Completions: two prompts, one seen before (its cache) and one new.
    prompt = "The keeper climbed the stairs of the lighthouse every evening to light the lamp. " * 6
    assert c.completions.create(model="", prompt=prompt, max_tokens=1).usage.prompt_tokens_details.cached_tokens == 0
    both = c.completions.create(model="", prompt=[prompt, "A new and unrelated prompt."], max_tokens=1)
    again = c.completions.create(model="", prompt=prompt, max_tokens=1)
    assert both.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens_details.cached_tokens > 0
