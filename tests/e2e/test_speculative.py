"""Speculative decoding (--speculative-config: prompt lookup, and a draft model) through the
server: concurrent requests, streamed and not, greedy and seeded, give the answers of a server
without it; the spec_decode counters show drafts proposed and accepted; a draft model made by
`inferd prune` serves as one; a bad config or draft is a one-line error naming the problem. The tiny Qwen2 fixture has no tokenizer: prompts and answers are token ids."""
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


def test_a_draft_model_changes_no_answer_and_its_drafts_are_accepted(tmp_path):
    plain = Server("--model", BASE, "--served-model-name", "tiny")
    try:
        want = answers(plain)
    finally:
        assert plain.stop() == 0
    # The same weights in bfloat16 (agrees mostly), and the model without its first layer, made by
    # `inferd prune` (agrees less).
    pruned = str(tmp_path / "one-layer.gguf")
    made = subprocess.run([BINARY, "prune", "-i", os.path.join(BASE, "model-f32.gguf"), "-o", pruned,
                           "--drop-layers", "0"], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert "layers 2 -> 1," in made.stderr, made.stderr
    for draft in (BASE + "_bf16", pruned):
        config = json.dumps({"method": "draft_model", "model": draft, "num_speculative_tokens": 3,
                             "disable_by_batch_size": 16})
        spec = Server("--model", BASE, "--served-model-name", "tiny", "--speculative-config", config)
        try:
            assert answers(spec) == want, draft
            drafted = counter(spec, "spec_decode_num_draft_tokens_total")
            accepted = counter(spec, "spec_decode_num_accepted_tokens_total")
            assert counter(spec, "spec_decode_num_drafts_total") > 0
            assert 0 < accepted <= drafted, (draft, accepted, drafted)
        finally:
            assert spec.stop() == 0


def test_a_bad_draft_or_layer_list_is_a_clear_error(tmp_path):
    smollm2 = subprocess.run([BINARY, "info"], capture_output=True, text=True, timeout=60)
    assert smollm2.returncode == 0, smollm2.stderr  # the default model is there
    default = json.loads(smollm2.stdout)["path"]  # 49,152 tokens against the fixture's 256
    cases = [('{"method": "draft_model", "model": "/nonexistent/draft.gguf"}', "/nonexistent/draft.gguf"),
             (json.dumps({"method": "draft_model", "model": default}), "vocabulary")]
    for config, needle in cases:
        bad = subprocess.run([BINARY, "serve", "--model", BASE, "--port", "0", "--speculative-config", config],
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode != 0, config
        assert "--speculative-config" in bad.stderr and needle in bad.stderr, bad.stderr
    for layers, needle in [("7", "out of range"), ("0-1", "every layer"), ("x", "x")]:
        bad = subprocess.run([BINARY, "prune", "-i", os.path.join(BASE, "model-f32.gguf"), "-o",
                              str(tmp_path / "p.gguf"), "--drop-layers", layers],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and needle in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_a_bad_speculative_config_is_a_clear_error():
    for config, needle in [('{"method": "eagle"}', "eagle"),
                           ('{"method": "draft_model"}', "model"),
                           ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
                           ('{"method": "ngram", "typo": 1}', "typo"), ("not json", "JSON")]:
        bad = subprocess.run([BINARY, "serve", "--model", BASE, "--port", "0", "--speculative-config", config],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0, config
        assert "--speculative-config" in bad.stderr and needle in bad.stderr, bad.stderr
