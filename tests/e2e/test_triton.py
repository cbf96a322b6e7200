"""The KServe v2 / Triton endpoints of `inferd serve`: health, server and model metadata and
readiness through tritonclient's HTTP client (what Triton users run), and the generate extension
(/generate, /generate_stream) with Triton's request shapes over raw HTTP (tritonclient has no
generate call): the same text as /v1/completions, streamed events that add up to it, every field
mapped or refused by name, and errors in Triton's {"error": ...} shape."""
import http.client
import json

import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from conftest import API_KEY
from test_server import metrics, raw

AUTH = {"Authorization": "Bearer " + API_KEY}


def model_name(server):
    status, _, data = raw(server, "GET", "/v1/models")
    assert status == 200
    return json.loads(data)["data"][0]["id"]


def client(server):
    return triton.InferenceServerClient(f"127.0.0.1:{server.port}")


def test_health_and_metadata_through_tritonclient(server):
    c = client(server)
    name = model_name(server)
    # Probes need no key, like /health.
    assert c.is_server_live()
    assert c.is_server_ready()
    meta = c.get_server_metadata(headers=AUTH)
    assert meta["name"] == "inferd" and "generate" in meta["extensions"]
    assert c.is_model_ready(name, headers=AUTH)
    assert c.is_model_ready(name, "1", headers=AUTH)
    assert not c.is_model_ready("no-such-model", headers=AUTH)
    assert not c.is_model_ready(name, "2", headers=AUTH)
    m = c.get_model_metadata(name, headers=AUTH)
    assert m["name"] == name and m["versions"] == ["1"]
    assert [t["name"] for t in m["inputs"]] == ["text_input"]
    assert [t["name"] for t in m["outputs"]] == ["text_output"]
    with pytest.raises(InferenceServerException):  # everything but the probes needs the key
        c.get_model_metadata(name)


def generate(server, body, stream=False, name=None, key=True):
    path = f"/v2/models/{name or model_name(server)}/generate" + ("_stream" if stream else "")
    return raw(server, "POST", path, body, key=key)


def completion_text(server, prompt, **params):
    status, _, data = raw(server, "POST", "/v1/completions",
                          {"model": model_name(server), "prompt": prompt, **params})
    assert status == 200, data
    return json.loads(data)["choices"][0]["text"]


def test_generate_answers_what_completions_answer(server):
    name = model_name(server)
    prompt = "The capital of France is"
    want = completion_text(server, prompt, max_tokens=12, temperature=0)
    status, headers, data = generate(server, {"text_input": prompt, "id": "q1",
                                              "parameters": {"max_tokens": 12, "temperature": 0}})
    assert status == 200, data
    assert headers["Content-Type"] == "application/json"
    r = json.loads(data)
    assert r == {"model_name": name, "model_version": "1", "text_output": want, "finish_reason": "length", "id": "q1"}
    # The parameters may also stand at the top level (as Triton's TensorRT-LLM ensemble takes them),
    # and a version in the URL is the same model.
    status, _, data = raw(server, "POST", f"/v2/models/{name}/versions/1/generate",
                          {"text_input": prompt, "max_tokens": 12, "temperature": 0})
    assert status == 200 and json.loads(data)["text_output"] == want
    # exclude_input_in_output: false returns the prompt first; a stop string ends the text.
    status, _, data = generate(server, {"text_input": prompt, "parameters": {
        "max_tokens": 12, "temperature": 0, "exclude_input_in_output": False}})
    assert status == 200 and json.loads(data)["text_output"] == prompt + want
    cut = want.strip()[:3]
    status, _, data = generate(server, {"text_input": prompt, "parameters": {
        "max_tokens": 12, "temperature": 0, "stop": cut}})
    r = json.loads(data)
    assert status == 200 and r["finish_reason"] == "stop" and cut not in r["text_output"]
    assert want.startswith(r["text_output"])


def stream_events(server, body, name=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", f"/v2/models/{name or model_name(server)}/generate_stream", body=json.dumps(body),
                 headers={**AUTH, "Content-Type": "application/json"})
    r = conn.getresponse()
    raw_body = r.read().decode()
    conn.close()
    events = [json.loads(line[len("data: "):]) for line in raw_body.split("\n\n") if line.startswith("data: ")]
    return r.status, r.getheader("Content-Type"), raw_body, events


def test_generate_stream_adds_up_to_the_answer(server):
    prompt = "Name three colours:"
    want = completion_text(server, prompt, max_tokens=16, temperature=0)
    status, ctype, body, events = stream_events(server, {"text_input": prompt, "id": "s1",
                                                         "parameters": {"max_tokens": 16, "temperature": 0}})
    assert status == 200 and ctype.startswith("text/event-stream")
    assert "[DONE]" not in body
    assert len(events) >= 2
    assert all(e["model_version"] == "1" and e["id"] == "s1" for e in events)
    assert [e["done"] for e in events] == [False] * (len(events) - 1) + [True]
    assert events[-1]["finish_reason"] == "length"
    assert "".join(e["text_output"] for e in events) == want


def errors_counted(server, status):
    """inferd:request_errors_total{status=...}: the requests answered with that error status."""
    total = 0.0
    for line in metrics(server).splitlines():
        if line.startswith("inferd:request_errors_total{") and f'status="{status}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_bad_requests_get_tritons_error_shape(server):
    name = model_name(server)
    before = {s: errors_counted(server, s) for s in ("400", "404", "405")}
    cases = [
        ({"parameters": {"max_tokens": 4}}, 400, "text_input"),
        ({"text_input": "a", "parameters": {"beam_width": 2}}, 400, "beam_width"),
        ({"text_input": "a", "bad_words": ""}, 400, "bad_words"),
        ({"text_input": "a", "parameters": {"temperature": -1}}, 400, "temperature"),
        ({"text_input": "a", "parameters": {"max_tokens": "many"}}, 400, "max_tokens"),
        ({"text_input": "a", "parameters": {"stream": True}}, 400, "generate_stream"),
        ("{not json", 400, "JSON"),
    ]
    for body, want_status, needle in cases:
        status, _, data = generate(server, body, name=name)
        assert status == want_status, (body, data)
        err = json.loads(data)
        assert list(err) == ["error"] and needle in err["error"], (body, err)
    status, _, data = generate(server, {"text_input": "a"}, name="no-such-model")
    assert status == 404 and "no-such-model" in json.loads(data)["error"]
    status, _, data = raw(server, "POST", f"/v2/models/{name}/versions/9/generate", {"text_input": "a"})
    assert status == 404 and "version" in json.loads(data)["error"]
    status, _, data = raw(server, "GET", f"/v2/models/{name}/generate")
    assert status == 405 and "error" in json.loads(data)
    status, _, data = raw(server, "POST", f"/v2/models/{name}/infer", {"inputs": []})
    assert status == 404 and "error" in json.loads(data)
    status, _, data = generate(server, {"text_input": "a"}, name=name, key=False)
    assert status == 401 and "API key" in json.loads(data)["error"]
    # Every error is counted by its status (the alert rules read this counter).
    assert errors_counted(server, "400") - before["400"] == len(cases)
    assert errors_counted(server, "404") - before["404"] == 3
    assert errors_counted(server, "405") - before["405"] == 1
    # The server goes on serving.
    status, _, data = generate(server, {"text_input": "a", "max_tokens": 2}, name=name)
    assert status == 200 and json.loads(data)["finish_reason"] in ("length", "stop")
