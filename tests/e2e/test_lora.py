"""LoRA adapters through the server: --lora-modules, requests picking an adapter by `model`, a
batch mixing three adapters and the base (row by row the ids each request gets alone, streamed
and not), the prefix cache keyed by adapter, /v1/load_lora_adapter and /v1/unload_lora_adapter
behind the API key, residency (--max-loras) with reloads from disk, and the per-adapter metrics.
The tiny Qwen2 fixture has no tokenizer: prompts and answers are token ids."""
import concurrent.futures
import http.client
import json
import os
import re

from conftest import ROOT, Server

BASE = os.path.join(ROOT, "tests", "fixtures", "tiny", "qwen2")
LORA = os.path.join(ROOT, "tests", "fixtures", "tiny_lora")
ADAPTERS = {"all": "qwen2_all", "mixed": "qwen2_mixed", "attn": "qwen2_attn"}
MODULES = [f"{name}={os.path.join(LORA, d)}" for name, d in ADAPTERS.items()]
# 40 tokens: two full KV blocks of 16 that the prefix cache may keep.
PROMPT = [(7 * i + 3) % 256 for i in range(40)]


def request(server, method, path, body=None, key=True):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + server.api_key
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def ids(server, model, prompt=PROMPT, stream=False, n=12):
    body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True,
            "stream": stream}
    status, data = request(server, "POST", "/v1/completions", body)
    assert status == 200, data
    if not stream:
        answer = json.loads(data)
        assert answer["model"] == model
        return [int(t) for t in answer["choices"][0]["text"].split()]
    text = ""
    for line in data.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            event = json.loads(line[6:])
            assert event["model"] == model
            text += "".join(c.get("text", "") for c in event["choices"])
    return [int(t) for t in text.split()]


def serve(*flags):
    return Server("--model", BASE, "--served-model-name", "qwen2-tiny", *flags)


def test_a_batch_mixing_adapters_and_the_base_gives_each_request_its_own_answer():
    s = serve("--lora-modules", *MODULES, "--no-prefix-caching")
    try:
        status, data = request(s, "GET", "/v1/models")
        assert status == 200
        models = {m["id"]: m for m in json.loads(data)["data"]}
        assert set(models) == {"qwen2-tiny", "all", "mixed", "attn"}
        assert models["all"]["parent"] == "qwen2-tiny" and models["all"]["root"].endswith("qwen2_all")
        assert models["qwen2-tiny"]["parent"] is None
        names = ["qwen2-tiny", "all", "mixed", "attn"]
        alone = {m: ids(s, m) for m in names}
        assert len({tuple(v) for v in alone.values()}) == 4, alone  # every adapter changes the answer
        # All four at once, twice over, half of them streamed: the engine batches them together.
        jobs = [(m, k % 2 == 1) for k in range(2) for m in names]
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
            got = list(pool.map(lambda job: ids(s, job[0], stream=job[1]), jobs))
        for (m, streamed), answer in zip(jobs, got):
            assert answer == alone[m], (m, streamed)
        metrics = request(s, "GET", "/metrics")[1].decode()
        assert re.search(r"^inferd:lora_load_seconds_count\{[^}]*\} 3$", metrics, re.M), metrics  # at start-up
        for m in ["all", "mixed", "attn"]:
            assert re.search(r'^inferd:lora_requests_total\{[^}]*lora_name="%s"[^}]*\} 3$' % m, metrics, re.M), m
        status, data = request(s, "POST", "/v1/completions", {"model": "nope", "prompt": PROMPT, "max_tokens": 1})
        assert status == 404
        assert json.loads(data)["error"]["code"] == "model_not_found"
    finally:
        assert s.stop() == 0


def test_the_prefix_cache_never_shares_kv_between_adapters():
    plain = serve("--lora-modules", *MODULES, "--no-prefix-caching")
    try:
        want = {m: ids(plain, m) for m in ["qwen2-tiny", "all", "mixed"]}
    finally:
        plain.stop()
    s = serve("--lora-modules", *MODULES)
    try:
        for m in ["all", "mixed", "qwen2-tiny", "mixed", "all"]:  # each after the others cached the prompt
            assert ids(s, m) == want[m], m
        status, data = request(s, "GET", "/metrics")
        hits = float(re.search(r"^inferd:prefix_cache_hits_total\{[^}]*\} (\S+)$", data.decode(), re.M).group(1))
        assert hits >= 2 * 32  # the repeats hit their own adapter's blocks
    finally:
        assert s.stop() == 0


def test_adapters_load_and_unload_at_run_time_and_reload_from_disk_beyond_max_loras():
    s = serve("--enable-lora", "--max-loras", "2")
    try:
        assert ids(s, "qwen2-tiny")
        load = {"lora_name": "all", "lora_path": os.path.join(LORA, "qwen2_all")}
        status, _ = request(s, "POST", "/v1/load_lora_adapter", load, key=False)
        assert status == 401  # behind the API key
        status, data = request(s, "POST", "/v1/load_lora_adapter", load)
        assert status == 200 and b"added" in data, data
        status, data = request(s, "POST", "/v1/load_lora_adapter", load)
        assert status == 400 and b"already loaded" in data
        status, data = request(s, "POST", "/v1/load_lora_adapter",
                               {"lora_name": "qwen3", "lora_path": os.path.join(LORA, "qwen3_all")})
        assert status == 400 and b"do not fit" in data, data
        status, data = request(s, "POST", "/v1/load_lora_adapter", {"lora_name": "x", "path": "y"})
        assert status == 400 and json.loads(data)["error"]["param"] == "path"
        first = ids(s, "all")
        # load_inplace: a bad replacement keeps the old adapter; a good one takes the name.
        status, _ = request(s, "POST", "/v1/load_lora_adapter",
                            {"lora_name": "all", "lora_path": os.path.join(LORA, "qwen3_all"), "load_inplace": True})
        assert status == 400
        assert ids(s, "all") == first
        status, _ = request(s, "POST", "/v1/load_lora_adapter",
                            {"lora_name": "all", "lora_path": os.path.join(LORA, "qwen2_attn"), "load_inplace": True})
        assert status == 200
        assert ids(s, "all") != first
        status, _ = request(s, "POST", "/v1/load_lora_adapter", dict(load, load_inplace=True))
        assert status == 200
        assert ids(s, "all") == first
        for name in ["mixed", "attn"]:
            status, _ = request(s, "POST", "/v1/load_lora_adapter",
                                {"lora_name": name, "lora_path": os.path.join(LORA, ADAPTERS[name])})
            assert status == 200
        # Three adapters, two resident: "all" (least recently used) was dropped and loads again.
        metrics = request(s, "GET", "/metrics")[1].decode()
        assert re.search(r"^inferd:lora_resident_adapters\{[^}]*\} 2$", metrics, re.M), metrics
        assert ids(s, "all") == first
        assert ids(s, "mixed") != first
        metrics = request(s, "GET", "/metrics")[1].decode()
        loads = float(re.search(r"^inferd:lora_load_seconds_count\{[^}]*\} (\S+)$", metrics, re.M).group(1))
        assert loads >= 6  # all, two replacements, mixed, attn, then "all" again
        requests = re.search(r'^inferd:lora_requests_total\{[^}]*lora_name="all"[^}]*\} (\S+)$', metrics, re.M)
        assert requests and float(requests.group(1)) == 5
        tokens = re.search(r'^inferd:lora_generation_tokens_total\{[^}]*lora_name="all"[^}]*\} (\S+)$', metrics,
                           re.M)
        assert tokens and float(tokens.group(1)) == 5 * 12
        status, data = request(s, "POST", "/v1/unload_lora_adapter", {"lora_name": "all"})
        assert status == 200 and b"removed" in data
        status, _ = request(s, "POST", "/v1/unload_lora_adapter", {"lora_name": "all"})
        assert status == 404
        status, data = request(s, "POST", "/v1/completions", {"model": "all", "prompt": PROMPT, "max_tokens": 1})
        assert status == 404
        status, data = request(s, "GET", "/v1/models")
        assert {m["id"] for m in json.loads(data)["data"]} == {"qwen2-tiny", "mixed", "attn"}
    finally:
        assert s.stop() == 0


def test_lora_admin_endpoints_say_so_when_lora_is_off():
    s = serve()
    try:
        status, data = request(s, "POST", "/v1/load_lora_adapter",
                               {"lora_name": "all", "lora_path": os.path.join(LORA, "qwen2_all")})
        assert status == 400 and b"--enable-lora" in data
    finally:
        assert s.stop() == 0


def test_a_bad_adapter_at_start_up_is_a_clear_error():
    import subprocess
    from conftest import BINARY
    bad = subprocess.run([BINARY, "serve", "--model", BASE, "--port", "0", "--lora-modules",
                          "q3=" + os.path.join(LORA, "qwen3_all")], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0
    assert "--lora-modules q3=" in bad.stderr and "do not fit" in bad.stderr, bad.stderr


def test_embeddings_of_an_adapter_are_its_own():
    s = serve("--lora-modules", *MODULES)
    try:
        got = {}
        for m in ["qwen2-tiny", "all", "attn"]:
            status, data = request(s, "POST", "/v1/embeddings", {"model": m, "input": [PROMPT, PROMPT[:9]]})
            assert status == 200, data
            answer = json.loads(data)
            assert answer["model"] == m
            got[m] = [d["embedding"] for d in answer["data"]]
        assert got["all"] != got["qwen2-tiny"] and got["attn"] != got["all"]  # each adapter changes them
        # Mixed in one batch, each request still gets its adapter's embedding.
        jobs = ["qwen2-tiny", "all", "attn"] * 2
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
            answers = list(pool.map(lambda m: json.loads(request(s, "POST", "/v1/embeddings",
                                                                 {"model": m, "input": [PROMPT, PROMPT[:9]]})[1]),
                                    jobs))
        for m, answer in zip(jobs, answers):
            vectors = [d["embedding"] for d in answer["data"]]
            assert all(max(abs(a - b) for a, b in zip(u, v)) < 1e-5 for u, v in zip(vectors, got[m])), m
        status, data = request(s, "POST", "/v1/embeddings", {"model": "nope", "input": PROMPT})
        assert status == 404 and json.loads(data)["error"]["code"] == "model_not_found"
    finally:
        s.stop()
