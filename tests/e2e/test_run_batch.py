"""`inferd run-batch`: an OpenAI batch file (vLLM's run-batch format) through the server's own
endpoints. The answers equal a running server's (greedy), come back in input order with their
custom_id, and a line that is no request, or a request the endpoint refuses, gets its error line
without stopping the batch."""
import json
import subprocess

import openai

from conftest import API_KEY, BINARY

CHAT = [{"role": "user", "content": "Name three colours."}]


def run_batch(tmp_path, lines, *flags):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines))
    p = subprocess.run([BINARY, "run-batch", "-i", str(src), "-o", str(out), *flags], capture_output=True,
                       text=True, timeout=300)
    return p, ([json.loads(l) for l in out.read_text().splitlines()] if out.exists() else None)


def line(custom_id, url, body):
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def test_answers_equal_the_servers_in_input_order(tmp_path, server):
    lines = [line(f"chat-{i}", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 10 + i, "temperature": 0})
             for i in range(6)]
    lines += [line("cmpl", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "n": 2}),
              line("emb", "/v1/embeddings", {"input": ["first text", "second text"]}),
              line("resp", "/v1/responses", {"input": "Name three colours.", "max_output_tokens": 10, "temperature": 0})]
    p, out = run_batch(tmp_path, lines, "--max-concurrency", "4")
    assert p.returncode == 0, p.stderr
    assert "requests=9 succeeded=9 failed=0" in p.stderr
    assert [o["custom_id"] for o in out] == [l["custom_id"] for l in lines]
    assert len({o["id"] for o in out}) == len(out)
    assert all(o["error"] is None and o["response"]["status_code"] == 200 for o in out)
    c = openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0)
    for i in range(6):
        want = c.chat.completions.create(model="", messages=CHAT, max_tokens=10 + i, temperature=0)
        body = out[i]["response"]["body"]
        assert body["choices"][0]["message"]["content"] == want.choices[0].message.content
        assert body["usage"]["completion_tokens"] == want.usage.completion_tokens
        assert out[i]["response"]["request_id"] == body["id"]
    want = c.completions.create(model="", prompt="Once upon a time", max_tokens=8, temperature=0, n=2)
    assert [ch["text"] for ch in out[6]["response"]["body"]["choices"]] == [ch.text for ch in want.choices]
    want = c.embeddings.create(model="", input=["first text", "second text"], encoding_format="float")
    assert [d["embedding"] for d in out[7]["response"]["body"]["data"]] == [d.embedding for d in want.data]
    assert out[8]["response"]["body"]["output"][0]["content"][0]["text"] == \
        out[0]["response"]["body"]["choices"][0]["message"]["content"]


def test_bad_lines_and_refused_requests_get_their_error_lines(tmp_path):
    lines = ["not json",
             line("ok", "/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
             line("url", "/v1/models", {}),
             line("stream", "/v1/completions", {"prompt": "Hi", "stream": True}),
             {"custom_id": "extra", "url": "/v1/completions", "body": {}, "priority": 1},
             line("field", "/v1/chat/completions", {"messages": CHAT, "temperature": "hot"}),
             line("model", "/v1/completions", {"prompt": "Hi", "model": "gpt-4o-mini"}),
             "",  # blank lines are skipped
             line("last", "/v1/completions", {"prompt": "Bye", "max_tokens": 2})]
    p, out = run_batch(tmp_path, lines)
    assert p.returncode == 0, p.stderr
    assert "requests=8 succeeded=2 failed=6" in p.stderr
    assert [o["custom_id"] for o in out] == [None, "ok", "url", "stream", "extra", "field", "model", "last"]
    by_id = {o["custom_id"]: o for o in out}
    assert out[0]["error"]["code"] == "invalid_request" and "not a JSON object" in out[0]["error"]["message"]
    assert "'url' /v1/models is not supported" in by_id["url"]["error"]["message"]
    assert "'body.stream'" in by_id["stream"]["error"]["message"]
    assert "unknown field 'priority'" in by_id["extra"]["error"]["message"]
    for key in ("url", "stream", "extra"):
        assert by_id[key]["response"] is None
    # The endpoint's own refusals, as the server answers them.
    assert by_id["field"]["response"]["status_code"] == 400
    assert by_id["field"]["response"]["body"]["error"]["param"] == "temperature"
    assert by_id["model"]["response"]["status_code"] == 404
    assert by_id["model"]["response"]["body"]["error"]["code"] == "model_not_found"
    assert by_id["last"]["response"]["status_code"] == 200 and by_id["last"]["error"] is None


def test_a_missing_input_file_is_a_one_line_error(tmp_path):
    p = subprocess.run([BINARY, "run-batch", "-i", str(tmp_path / "none.jsonl"), "-o", str(tmp_path / "o.jsonl")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert p.stderr.startswith("inferd: error:") and "none.jsonl" in p.stderr
    assert not (tmp_path / "o.jsonl").exists()
    p = subprocess.run([BINARY, "run-batch", "-o", str(tmp_path / "o.jsonl")], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0 and "--input-file" in p.stderr
