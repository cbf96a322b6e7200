"""StreamingLLM windows through the real server on the default model: a request with
streaming_llm runs past both the KV pool and --max-model-len that refuse it without one, its
answer does not depend on the batch, and a bad window is a 400 naming the key."""
import concurrent.futures
import json
import os
import urllib.error
import urllib.request

from conftest import ROOT

TEXT = open(os.path.join(ROOT, "tests", "fixtures", "text", "evaluation.txt")).read()


def complete(server, body):
    req = urllib.request.Request(server.base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + (server.api_key or "none")})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_window_runs_past_the_pool_and_the_context(make_server):
    # SmolLM2 keeps 23 KiB of f16 K/V per token: 8 MiB is ~350 tokens, below prompt + output.
    s = make_server("--kv-cache-memory", "8MiB", "--max-model-len", "384", "--max-num-batched-tokens", "256")
    prompts = [TEXT[i * 900:i * 900 + 1300] for i in range(2)]  # ~300 tokens each
    window = {"sink_tokens": 4, "window_tokens": 64}

    def ask(prompt):
        status, body = complete(s, {"prompt": prompt, "max_tokens": 400, "temperature": 0, "ignore_eos": True,
                                    "streaming_llm": window})
        assert status == 200, body
        assert body["usage"]["completion_tokens"] == 400
        assert body["usage"]["prompt_tokens"] + 400 > 384  # past the context and the pool (~350)
        return body["choices"][0]["text"]

    alone = [ask(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        together = list(pool.map(ask, prompts))
    assert together == alone
    # The same request without the window does not fit the context.
    status, body = complete(s, {"prompt": prompts[0], "max_tokens": 400, "temperature": 0})
    assert status == 400, body
    assert body["error"]["param"] == "max_tokens"
    for bad, param in (({"sink_tokens": 4}, "streaming_llm.window_tokens"),
                       ({"window_tokens": 8}, "streaming_llm.window_tokens"),
                       ({"window_tokens": 64, "sink": 4}, "streaming_llm.sink"),
                       ({"window_tokens": 300, "sink_tokens": 100}, "streaming_llm")):
        status, body = complete(s, {"prompt": "x", "max_tokens": 2, "streaming_llm": bad})
        assert status == 400, (bad, body)
        assert body["error"]["param"] == param, (bad, body)
    s.stop()
