"""Speculative decoding (--speculative-config, prompt lookup) through the server: concurrent
requests, streamed and not, greedy and seeded, give the answers of a server without it; the
spec_decode counters show drafts proposed and accepted; a bad config is a one-line error naming
the field. The tiny Qwen2 fixture has no tokenizer: prompts and answers are token ids."""
import concurrent.futures
import http.client
import json
import os
import re
import subprocess

from conftest import BINARY, ROOT, Server

BASE = os.path.join(ROOT, "tests", "fixtures", "tiny", "qwen2")
SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                   "prompt_lookup_max": 3, "disable_by_batch_size": 16})


def prompts():
    out = []
    for i in range(6):
        doc = [(11 * k + 5 * i + 3) % 256 for k in range(24)]
        out.append(doc + doc[:12])  # a document and the start of its copy
    return out


def request(server, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    headers = {"Authorization": "Bearer " + server.api_key, "Content-Type": "application/json"}
    conn.request("POST" if body is not None else "GET", path, json.dumps(body) if body is not None else None,
                 headers)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def answer(server, prompt, stream, seed):
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 24, "ignore_eos": True, "stream": stream,
            "temperature": 0 if seed is None else 0.1, "logprobs": 1}
    if seed is not None:
        body["seed"] = seed
    status, data = request(server, "/v1/completions", body)
    assert status == 200, data
    if not stream:
        choice = json.loads(data)["choices"][0]
        return choice["text"].split(), choice["logprobs"]["token_logprobs"]
    text, logprobs = "", []
    for line in data.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for c in json.loads(line[6:])["choices"]:
                text += c.get("text", "")
                logprobs += (c.get("logprobs") or {}).get("token_logprobs") or []
    return text.split(), logprobs


def answers(server):
    jobs = [(p, stream, seed) for p in prompts() for stream in (False, True) for seed in (None, 7)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda j: answer(server, *j), jobs))


def counter(server, name):
    status, data = request(server, "/metrics")
    assert status == 200
    m = re.search(r"^inferd:%s(?:\{[^}]*\})? ([0-9.e+]+)$" % name, data.decode(), re.M)
    assert m, name
    return float(m.group(1))


def test_speculation_changes_no_answer_and_counts_its_drafts():
    plain = Server("--model", BASE, "--served-model-name", "tiny")
    try:
        want = answers(plain)
        assert counter(plain, "spec_decode_num_drafts_total") == 0
    finally:
        assert plain.stop() == 0
    spec = Server("--model", BASE, "--served-model-name", "tiny", "--speculative-config", SPEC)
    try:
        got = answers(spec)
        assert got == want
        drafted = counter(spec, "spec_decode_num_draft_tokens_total")
        accepted = counter(spec, "spec_decode_num_accepted_tokens_total")
        assert counter(spec, "spec_decode_num_drafts_total") > 0
        assert 0 < accepted < drafted, (accepted, drafted)
    finally:
        assert spec.stop() == 0


def test_a_bad_speculative_config_is_a_clear_error():
    for config, needle in [('{"method": "draft_model", "model": "x"}', "draft_model"),
                           ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
                           ('{"method": "ngram", "typo": 1}', "typo"), ("not json", "JSON")]:
        bad = subprocess.run([BINARY, "serve", "--model", BASE, "--port", "0", "--speculative-config", config],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0, config
        assert "--speculative-config" in bad.stderr and needle in bad.stderr, bad.stderr
