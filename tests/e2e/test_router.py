"""`inferd router` end to end: two real `inferd serve` instances (role both) behind the router —
answers equal a direct instance's, round-robin spreads, cache-aware keeps a repeated prompt on
one instance, sessions stick, an instance SIGKILLed mid-stream ends that stream cleanly and the
router routes around it; /health, /v1/models, /metrics, errors. Then the disaggregated flow
(prefill leg, kv_transfer_params to the decode leg, prefill failures, a decode stream cut
mid-way) against small fake instances, so the router's side of the protocol is checked exactly."""
import http.client
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

import openai
import pytest

from conftest import API_KEY, BINARY, Server

LONG = "The history of the lighthouse keepers of the northern coast, told by one of them. " * 24


class Router:
    def __init__(self, *flags, api_key=API_KEY):
        interval = [] if "--health-interval" in flags else ["--health-interval", "0.2"]
        args = [BINARY, "router", "--port", "0"] + interval + list(flags)
        if api_key:
            args += ["--api-key", api_key]
        self.api_key = api_key
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
        self.log = []
        self.port = None
        deadline = time.time() + 30
        while self.port is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("inferd router exited: " + "".join(self.log))
            self.log.append(line)
            m = re.search(r"listening on http://[\d.]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if time.time() > deadline:
                raise RuntimeError("inferd router did not start")
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()
        self.base = f"http://127.0.0.1:{self.port}"

    def wait_healthy(self, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if raw(self, "GET", "/health", key=False)[0] == 200:
                return
            time.sleep(0.05)
        raise AssertionError("router never became healthy: " + "".join(self.log))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def raw(target, method, path, body=None, headers=None, key=True, timeout=120):
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=timeout)
    h = dict(headers or {})
    if key and target.api_key:
        h["Authorization"] = "Bearer " + target.api_key
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
        h["Content-Type"] = "application/json"
    conn.request(method, path, body=body, headers=h)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, dict(r.getheaders()), data


def client(target):
    return openai.OpenAI(base_url=target.base + "/v1", api_key=target.api_key or "none", max_retries=0, timeout=120)


def router_metrics(router):
    status, _, data = raw(router, "GET", "/metrics", key=False)
    assert status == 200
    return data.decode()


def series(text, name, **labels):
    """The value of the series `name` whose labels include `labels` (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def routed(router, instance):
    return series(router_metrics(router), "inferd_router:requests_total", instance=instance.base)


@pytest.fixture(scope="module")
def pair():
    a, b = Server(), Server()
    yield a, b
    a.stop()
    b.stop()


@pytest.fixture
def make_router():
    started = []

    def make(*flags, **kw):
        r = Router(*flags, **kw)
        started.append(r)
        return r

    yield make
    for r in started:
        r.stop()


def fleet(make_router, pair, *flags):
    r = make_router("--instance", pair[0].base, "--instance", pair[1].base, *flags)
    r.wait_healthy()
    return r


def test_answers_equal_a_direct_instance_streamed_or_not(make_router, pair):
    r = fleet(make_router, pair, "--policy", "round-robin")
    direct, routed_client = client(pair[0]), client(r)
    for _ in range(2):  # round-robin: once through each instance
        want = direct.completions.create(model="", prompt="Once upon a time", max_tokens=12, temperature=0)
        got = routed_client.completions.create(model="", prompt="Once upon a time", max_tokens=12, temperature=0)
        assert got.choices[0].text == want.choices[0].text and got.usage == want.usage
        text = "".join(c.choices[0].text for c in routed_client.completions.create(
            model="", prompt="Once upon a time", max_tokens=12, temperature=0, stream=True) if c.choices)
        assert text == want.choices[0].text
        messages = [{"role": "user", "content": "Name three colours."}]
        want = direct.chat.completions.create(model="", messages=messages, max_tokens=12, temperature=0)
        got = routed_client.chat.completions.create(model="", messages=messages, max_tokens=12, temperature=0)
        assert got.choices[0].message.content == want.choices[0].message.content
        chunks = list(routed_client.chat.completions.create(model="", messages=messages, max_tokens=12, temperature=0,
                                                            stream=True, stream_options={"include_usage": True}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
            want.choices[0].message.content
        assert chunks[-1].usage.completion_tokens == want.usage.completion_tokens


def test_stream_headers_pass_through(make_router, pair):
    r = fleet(make_router, pair)
    conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "Hi", "max_tokens": 4, "stream": True}),
                 headers={"Authorization": "Bearer " + API_KEY, "Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/event-stream")
    assert resp.getheader("Transfer-Encoding") == "chunked"
    events = resp.read().decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]


def test_round_robin_spreads_requests_over_both(make_router, pair):
    r = fleet(make_router, pair, "--policy", "round-robin")
    for i in range(6):
        status, _, _ = raw(r, "POST", "/v1/completions", {"prompt": f"Count {i}", "max_tokens": 2})
        assert status == 200
    assert routed(r, pair[0]) == 3 and routed(r, pair[1]) == 3


def test_least_load_is_selectable(make_router, pair):
    r = fleet(make_router, pair, "--policy", "least-load")
    for i in range(3):
        assert raw(r, "POST", "/v1/completions", {"prompt": f"Count {i}", "max_tokens": 2})[0] == 200
    assert routed(r, pair[0]) + routed(r, pair[1]) == 3


def test_cache_aware_keeps_a_repeated_long_prompt_on_one_instance(make_router, pair):
    r = fleet(make_router, pair)  # cache-aware is the default
    before = [routed(r, s) for s in pair]
    assert raw(r, "POST", "/v1/completions", {"prompt": LONG + "First:", "max_tokens": 2})[0] == 200
    first = [routed(r, s) - b for s, b in zip(pair, before)]
    home = first.index(1)
    # Another long prompt goes to the other instance (its index is the smaller one).
    assert raw(r, "POST", "/v1/completions", {"prompt": "Unrelated. " * 150, "max_tokens": 2})[0] == 200
    for i in range(4):
        assert raw(r, "POST", "/v1/completions", {"prompt": LONG + f"Question {i}:", "max_tokens": 2})[0] == 200
    after = [routed(r, s) - b for s, b in zip(pair, before)]
    assert after[home] == 5 and after[1 - home] == 1
    m = router_metrics(r)
    assert series(m, "inferd_router:prefix_matched_chars_total") >= 4 * (len(LONG) // 64) * 64
    assert series(m, "inferd_router:prefix_prompt_chars_total") > series(m, "inferd_router:prefix_matched_chars_total")


def test_session_affinity_keeps_a_session_on_its_instance(make_router, pair):
    r = fleet(make_router, pair, "--policy", "round-robin")
    before = [routed(r, s) for s in pair]
    messages = [{"role": "user", "content": "Hello there."}]
    for _ in range(4):
        status, _, data = raw(r, "POST", "/v1/chat/completions",
                              {"messages": messages, "max_tokens": 4, "session_id": "conversation-1"})
        assert status == 200, data
        messages += [{"role": "assistant", "content": json.loads(data)["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "And then?"}]
    delta = sorted(routed(r, s) - b for s, b in zip(pair, before))
    assert delta == [0, 4]
    # The header works as well.
    before = [routed(r, s) for s in pair]
    for _ in range(3):
        assert raw(r, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2},
                   headers={"X-Session-Id": "conversation-2"})[0] == 200
    assert sorted(routed(r, s) - b for s, b in zip(pair, before)) == [0, 3]


def sse_events(data):
    """A Responses stream's events as (type, payload) pairs."""
    out = []
    for block in data.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines:
            out.append((lines.get("event"), json.loads(lines["data"])))
    return out


def test_responses_continue_on_the_instance_that_stores_them(make_router, pair):
    # Round-robin would send every other turn to the instance that does not store the previous
    # response: a continuation must go where its predecessor is stored.
    r = fleet(make_router, pair, "--policy", "round-robin")
    routed_client = client(r)
    first = routed_client.responses.create(model="", input="Hello there.", max_output_tokens=6, temperature=0)
    previous, turns = first, [first]
    for i in range(5):
        if i % 2:  # streamed turns are remembered from their response.created event
            status, _, data = raw(r, "POST", "/v1/responses",
                                  {"input": f"Go on ({i}).", "previous_response_id": previous.id,
                                   "max_output_tokens": 6, "temperature": 0, "stream": True})
            assert status == 200, data
            events = sse_events(data)
            assert events[0][0] == "response.created" and events[-1][0] in ("response.completed",
                                                                            "response.incomplete")
            previous = routed_client.responses.retrieve(events[0][1]["response"]["id"])
        else:
            previous = routed_client.responses.create(model="", input=f"Go on ({i}).", previous_response_id=previous.id,
                                                      max_output_tokens=6, temperature=0)
        turns.append(previous)
    stored_on = [s for s in pair if raw(s, "GET", "/v1/responses/" + previous.id)[0] == 200]
    assert len(stored_on) == 1
    # The last turn's input items, as the instance that stores it has them.
    items = client(stored_on[0]).responses.input_items.list(previous.id)
    assert [i.content[0].text for i in items.data] == ["Go on (4)."]
    # GET, input_items and DELETE reach the instance that stores the response.
    status, _, data = raw(r, "GET", "/v1/responses/" + first.id)
    assert status == 200 and json.loads(data)["id"] == first.id
    status, _, data = raw(r, "GET", f"/v1/responses/{first.id}/input_items")
    assert status == 200 and json.loads(data)["data"][0]["content"][0]["text"] == "Hello there."
    assert raw(r, "POST", f"/v1/responses/{first.id}/cancel")[0] == 400  # the instance's answer
    status, _, data = raw(r, "DELETE", "/v1/responses/" + previous.id)
    assert status == 200 and json.loads(data)["deleted"] is True
    status, _, data = raw(r, "GET", "/v1/responses/" + previous.id)
    assert status == 404 and json.loads(data)["error"]["param"] == "response_id"
    status, _, data = raw(r, "POST", "/v1/responses", {"input": "x", "previous_response_id": previous.id})
    assert status == 400 and json.loads(data)["error"]["param"] == "previous_response_id"
    assert raw(r, "GET", "/v1/responses/resp_nowhere")[0] == 404
    # An id that would break the router's request line is not looked up: the instance answers.
    status, _, data = raw(r, "POST", "/v1/responses", {"input": "x", "previous_response_id": "a b\r\nX-Evil: 1"})
    assert status == 400 and json.loads(data)["error"]["param"] == "previous_response_id"
    assert series(router_metrics(r), "inferd_router:errors_total") == 0


def test_a_new_router_finds_the_stored_responses(make_router, pair):
    r = fleet(make_router, pair, "--policy", "round-robin")
    ids = [client(r).responses.create(model="", input=f"Remember {i}.", max_output_tokens=3).id for i in range(4)]
    r.stop()
    # A router that never saw them asks the instances: once per response, then it knows.
    r2 = fleet(make_router, pair, "--policy", "round-robin")
    for i in ids[:2]:
        for _ in range(2):
            status, _, data = raw(r2, "POST", "/v1/responses",
                                  {"input": "And?", "previous_response_id": i, "max_output_tokens": 3})
            assert status == 200, data
    for i in ids[2:]:
        for _ in range(2):
            status, _, data = raw(r2, "GET", "/v1/responses/" + i)
            assert status == 200 and json.loads(data)["id"] == i
    assert series(router_metrics(r2), "inferd_router:responses_located_total") == 4


def test_a_continuation_whose_instance_died_is_a_502_naming_it(make_router, make_server, pair):
    doomed = make_server()
    r = make_router("--instance", doomed.base, "--instance", pair[1].base, "--policy", "round-robin",
                    "--health-interval", "60")
    r.wait_healthy()
    stored = None
    for i in range(2):
        resp = client(r).responses.create(model="", input=f"Hi {i}", max_output_tokens=2)
        if raw(doomed, "GET", "/v1/responses/" + resp.id)[0] == 200:
            stored = resp.id
    assert stored is not None
    doomed.proc.send_signal(signal.SIGKILL)
    doomed.proc.wait()
    status, _, data = raw(r, "POST", "/v1/responses", {"input": "More", "previous_response_id": stored})
    assert status == 502
    message = json.loads(data)["error"]["message"]
    assert doomed.base in message and stored in message
    status, _, data = raw(r, "GET", "/v1/responses/" + stored)
    assert status == 502 and doomed.base in json.loads(data)["error"]["message"]
    # Requests that continue nothing still go to the live instance.
    assert raw(r, "POST", "/v1/responses", {"input": "Fresh", "max_output_tokens": 2})[0] == 200


def test_health_models_metrics_and_auth(make_router, pair):
    r = fleet(make_router, pair)
    status, _, data = raw(r, "GET", "/health", key=False)
    assert status == 200
    body = json.loads(data)
    assert body["status"] == "ok" and sorted(i["url"] for i in body["instances"]) == sorted(s.base for s in pair)
    assert [m.id for m in client(r).models.list().data] == [m.id for m in client(pair[0]).models.list().data]
    m = router_metrics(r)
    for s in pair:
        assert series(m, "inferd_router:instance_up", instance=s.base, role="both") == 1
    for name in ("inferd_router:retries_total", "inferd_router:kv_transfer_bytes_total",
                 "inferd_router:prefill_round_trip_seconds_count", "inferd_router:overhead_seconds_count"):
        assert re.search("^" + re.escape(name) + " ", m, re.M), name
    status, headers, data = raw(r, "POST", "/v1/completions", {"prompt": "x"}, key=False)
    assert status == 401 and json.loads(data)["error"]["type"] == "authentication_error"
    assert raw(r, "GET", "/v1/models", key=False)[0] == 401
    assert raw(r, "GET", "/nothing")[0] == 404
    assert raw(r, "GET", "/v1/completions")[0] == 405


def test_bad_bodies_are_400(make_router, pair):
    r = fleet(make_router, pair)
    status, _, data = raw(r, "POST", "/v1/completions", "{not json")
    assert status == 400
    err = json.loads(data)["error"]
    assert set(err) >= {"message", "type", "code"} and err["type"] == "invalid_request_error"
    # The instance's own 400 (an unknown field) passes through as it was.
    want = raw(pair[0], "POST", "/v1/completions", {"prompt": "x", "bogus_field": 1})
    got = raw(r, "POST", "/v1/completions", {"prompt": "x", "bogus_field": 1})
    assert got[0] == want[0] == 400
    assert json.loads(got[2])["error"] == json.loads(want[2])["error"]
    got = raw(r, "POST", "/v1/completions", {"prompt": "x", "bogus_field": 1, "stream": True})
    assert got[0] == 400 and json.loads(got[2])["error"]["param"] == "bogus_field"


def instance_gauge(server, name):
    status, _, data = raw(server, "GET", "/metrics")
    m = re.search("^inferd:" + name + r"(\{[^}]*\})? ([0-9.eE+-]+)$", data.decode(), re.M)
    return float(m.group(2))


def test_a_client_hang_up_aborts_the_instances_request(make_router, pair):
    r = fleet(make_router, pair)
    for stream in (False, True):
        s = socket.create_connection(("127.0.0.1", r.port))
        data = json.dumps({"prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True,
                           "stream": stream}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode() +
                  b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(data)).encode() +
                  b"\r\n\r\n" + data)
        deadline = time.time() + 10
        while sum(instance_gauge(i, "num_requests_running") for i in pair) == 0:
            assert time.time() < deadline, "the request never started"
            time.sleep(0.02)
        s.close()
        deadline = time.time() + 10  # 1500 tokens take far longer: only an abort ends it this soon
        while sum(instance_gauge(i, "num_requests_running") for i in pair) != 0:
            assert time.time() < deadline, "the instance kept generating for a client that left"
            time.sleep(0.05)
    assert series(router_metrics(r), "inferd_router:errors_total", kind="client_gone") >= 1


def test_embeddings_pass_through_and_survive_a_dead_instance(make_router, make_server, pair):
    r = fleet(make_router, pair)
    texts = ["routed embeddings", "a second input"]
    want = client(pair[0]).embeddings.create(model="", input=texts, encoding_format="float")
    for _ in range(3):
        got = client(r).embeddings.create(model="", input=texts, encoding_format="float")
        assert [d.embedding for d in got.data] == [d.embedding for d in want.data]
        assert got.usage == want.usage
    status, _, data = raw(r, "POST", "/v1/embeddings", {"input": "x", "dimensions": 3})
    assert status == 400 and json.loads(data)["error"]["param"] == "dimensions"  # the instance's answer
    assert raw(r, "GET", "/v1/embeddings")[0] == 405
    status, _, data = raw(r, "POST", "/rerank", {"query": "routed", "documents": texts})
    direct = raw(pair[0], "POST", "/rerank", {"query": "routed", "documents": texts})
    assert status == 200 and json.loads(data)["results"] == json.loads(direct[2])["results"]
    # /classify reaches an instance (whose model has no classification head: its 400 comes back).
    status, _, data = raw(r, "POST", "/v1/classify", {"input": "x"})
    assert status == 400 and "classification head" in json.loads(data)["error"]["message"]
    # An instance that died since its last health check is ejected and the next one serves the
    # request (the first listed is tried first: both are idle).
    doomed = make_server()
    r2 = make_router("--instance", doomed.base, "--instance", pair[1].base, "--health-interval", "60")
    r2.wait_healthy()
    doomed.proc.send_signal(signal.SIGKILL)
    doomed.proc.wait()
    status, _, data = raw(r2, "POST", "/v1/embeddings", {"input": texts})
    assert status == 200, data
    assert [d["embedding"] for d in json.loads(data)["data"]] == [d.embedding for d in want.data]
    m = router_metrics(r2)
    assert series(m, "inferd_router:instance_up", instance=doomed.base) == 0
    assert series(m, "inferd_router:ejections_total", instance=doomed.base) >= 1


def test_no_healthy_instance_is_503(make_router):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    r = make_router("--instance", f"http://127.0.0.1:{dead}")
    time.sleep(0.5)
    assert raw(r, "GET", "/health", key=False)[0] == 503
    status, _, data = raw(r, "POST", "/v1/completions", {"prompt": "x"})
    assert status == 503 and json.loads(data)["error"]["type"] == "service_unavailable"


def test_instance_killed_mid_stream(make_router, make_server):
    a, b = make_server(), make_server()
    r = make_router("--instance", a.base, "--instance", b.base, "--policy", "round-robin")
    r.wait_healthy()
    conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=30)
    conn.request("POST", "/v1/completions",
                 body=json.dumps({"prompt": "Tell me a long story.", "max_tokens": 1500, "stream": True,
                                  "ignore_eos": True, "temperature": 0}),
                 headers={"Authorization": "Bearer " + API_KEY, "Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    got = b""
    while got.count(b"data:") < 3:
        got += resp.read1(4096)
    m = router_metrics(r)
    serving = next(s for s in (a, b) if series(m, "inferd_router:instance_in_flight", instance=s.base) == 1)
    other = b if serving is a else a
    serving.proc.send_signal(signal.SIGKILL)
    serving.proc.wait()
    started = time.time()
    got += resp.read()  # must end: the router closes the stream, it never hangs
    assert time.time() - started < 20
    events = [e for e in got.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][len("data: "):])
    if "error" in last:  # cut mid-way: the router says which instance failed
        assert last["error"]["code"] == 502 and last["error"]["type"] == "server_error"
        assert serving.base in last["error"]["message"] and "mid-stream" in last["error"]["message"]
    else:
        assert last["choices"][0]["finish_reason"] == "length"
    # The next requests succeed on the other instance; the router reports the killed one down.
    before = routed(r, other)
    for i in range(4):
        status, _, data = raw(r, "POST", "/v1/completions", {"prompt": f"Again {i}", "max_tokens": 2})
        assert status == 200, data
    assert routed(r, other) - before == 4
    m = router_metrics(r)
    assert series(m, "inferd_router:instance_up", instance=serving.base) == 0
    assert series(m, "inferd_router:ejections_total", instance=serving.base) >= 1
    status, _, data = raw(r, "GET", "/health", key=False)
    assert status == 200
    down = [i for i in json.loads(data)["instances"] if not i["up"]]
    assert [i["url"] for i in down] == [serving.base]


def test_instances_file_is_reread_when_it_changes(make_router, pair, tmp_path):
    path = tmp_path / "fleet.txt"
    path.write_text(f"# the fleet\nboth {pair[0].base}\n")
    r = make_router("--instances-file", str(path), "--policy", "round-robin")
    r.wait_healthy()
    for _ in range(2):
        assert raw(r, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 1})[0] == 200
    assert routed(r, pair[0]) == 2 and routed(r, pair[1]) == 0
    time.sleep(0.05)
    path.write_text(f"both {pair[1].base}\n")
    os.utime(path, (time.time() + 5, time.time() + 5))  # a new mtime even on a coarse clock
    deadline = time.time() + 10
    while time.time() < deadline:
        urls = [i["url"] for i in json.loads(raw(r, "GET", "/health", key=False)[2]).get("instances", [])]
        if urls == [pair[1].base] and raw(r, "GET", "/health", key=False)[0] == 200:
            break
        time.sleep(0.1)
    for _ in range(2):
        assert raw(r, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 1})[0] == 200
    assert routed(r, pair[0]) == 2 and routed(r, pair[1]) == 2


def test_a_bad_instances_file_names_its_line(tmp_path):
    path = tmp_path / "fleet.txt"
    path.write_text("both http://127.0.0.1:1\nworker http://127.0.0.1:2\n")
    p = subprocess.run([BINARY, "router", "--port", "0", "--instances-file", str(path)], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 1 and f"{path} line 2: unknown role 'worker'" in p.stderr


# ---- the disaggregated flow against fake instances ----------------------------------------------

class FakeInstance:
    """A tiny HTTP/1.1 instance: /health, /metrics, /v1/models, and the completions endpoints
    answering as `mode` says, recording every body it was sent."""

    def __init__(self, role):
        self.role = role
        self.mode = "ok"  # ok, fail500, fail400, cut (streams two events, then drops the connection)
        self.bodies = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def send(self, status, body, content_type="application/json"):
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/health":
                    self.send(200, '{"status":"ok"}')
                elif self.path == "/metrics":
                    self.send(200, "inferd:num_requests_running{model_name=\"m\"} 0\n", "text/plain")
                else:
                    self.send(200, '{"object":"list","data":[{"id":"fake","object":"model"}]}')

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.bodies.append(body)
                if fake.mode == "fail500":
                    return self.send(500, '{"error":{"message":"boom","type":"server_error","code":null}}')
                if fake.mode == "fail400":
                    return self.send(400, '{"error":{"message":"bad n","type":"invalid_request_error",'
                                          '"param":"n","code":null}}')
                text = f"answer from {fake.role}"
                if not body.get("stream"):
                    reply = {"object": "text_completion", "choices": [{"index": 0, "text": text}]}
                    if body.get("kv_transfer_params", {}).get("do_remote_decode"):
                        reply["kv_transfer_params"] = {"remote_host": "127.0.0.1", "remote_port": 41234,
                                                       "transfer_id": "5f0c2a9e1b3d4c77", "num_tokens": 812,
                                                       "first_token": 4512, "num_blocks": 51, "bytes": 18800640,
                                                       "lease_seconds": 30}
                    return self.send(200, json.dumps(reply))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                events = [f'data: {{"choices":[{{"index":0,"text":"{w} "}}]}}\n\n' for w in text.split()]
                events.append("data: [DONE]\n\n")
                if self.path == "/v1/responses":  # typed events, numbered; no [DONE]
                    response = {"id": "resp_fake", "object": "response", "store": True, "output": []}
                    events = [f"event: response.created\ndata: " + json.dumps(
                        {"type": "response.created", "response": response, "sequence_number": 0}) + "\n\n"]
                    events += [f"event: response.output_text.delta\ndata: " + json.dumps(
                        {"type": "response.output_text.delta", "delta": w + " ", "sequence_number": n + 1}) + "\n\n"
                        for n, w in enumerate(text.split())]
                for i, e in enumerate(events):
                    if fake.mode == "cut" and i == 2:
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        self.close_connection = True
                        return
                    self.wfile.write(f"{len(e):x}\r\n{e}\r\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fakes():
    made = [FakeInstance("prefill"), FakeInstance("decode")]
    yield made
    for f in made:
        f.stop()


def stream_text(data):
    events = [e[len("data: "):] for e in data.decode().split("\n\n") if e.startswith("data: {")]
    return "".join(json.loads(e)["choices"][0]["text"] for e in events)


def long_prompt(tag):
    """A long prompt whose first chunk differs from every other tag's (no shared prefix)."""
    return f"{tag}. " + LONG


def disagg_router(make_router, fakes):
    r = make_router("--prefill", fakes[0].base, "--decode", fakes[1].base, "--disagg-min-tokens", "64",
                    api_key=None)
    r.wait_healthy()
    return r


def test_disaggregated_request_goes_prefill_then_decode(make_router, fakes):
    prefill, decode = fakes
    r = disagg_router(make_router, fakes)
    body = {"prompt": LONG, "max_tokens": 20, "stream": True, "stream_options": {"include_usage": True}}
    status, _, data = raw(r, "POST", "/v1/completions", body)
    assert status == 200
    assert data.decode().endswith("data: [DONE]\n\n") and "answer" in data.decode()
    # The prefill leg: the client's body, not streamed, with do_remote_decode.
    assert len(prefill.bodies) == 1
    sent = prefill.bodies[0]
    assert sent["stream"] is False and "stream_options" not in sent
    assert sent["kv_transfer_params"] == {"do_remote_decode": True} and sent["prompt"] == LONG
    # The decode leg: the client's body as it came, plus the prefill's kv_transfer_params.
    assert len(decode.bodies) == 1
    got = dict(decode.bodies[0])
    params = got.pop("kv_transfer_params")
    assert got == body and params["transfer_id"] == "5f0c2a9e1b3d4c77" and params["num_tokens"] == 812
    m = router_metrics(r)
    assert series(m, "inferd_router:kv_transfer_bytes_total") == 18800640
    assert series(m, "inferd_router:disagg_decisions_total", decision="disaggregated") == 1
    assert series(m, "inferd_router:prefill_round_trip_seconds_count") == 1
    # A short prompt, or a field that rules disaggregation out, goes straight to the decode instance.
    for extra in ({"prompt": "short"}, {"prompt": LONG + "x", "n": 2}, {"prompt": LONG + "y", "max_tokens": 1}):
        status, _, data = raw(r, "POST", "/v1/completions", extra)
        assert status == 200 and json.loads(data)["choices"][0]["text"] == "answer from decode"
        assert "kv_transfer_params" not in decode.bodies[-1]
    assert len(prefill.bodies) == 1
    m = router_metrics(r)
    assert series(m, "inferd_router:disagg_decisions_total", decision="direct", reason="short_prompt") == 1
    assert series(m, "inferd_router:disagg_decisions_total", decision="direct", reason="n") == 1
    assert series(m, "inferd_router:disagg_decisions_total", decision="direct", reason="max_tokens") == 1


def test_a_failed_prefill_is_ejected_and_the_decode_instance_recomputes(make_router, fakes):
    prefill, decode = fakes
    r = disagg_router(make_router, fakes)
    prefill.mode = "fail400"  # a 4xx is the client's answer, as it was
    status, _, data = raw(r, "POST", "/v1/completions", {"prompt": long_prompt(1), "max_tokens": 5})
    assert status == 400 and json.loads(data)["error"]["param"] == "n"
    assert decode.bodies == []
    prefill.mode = "fail500"
    status, _, data = raw(r, "POST", "/v1/completions", {"prompt": long_prompt(2), "max_tokens": 5})
    assert status == 200 and json.loads(data)["choices"][0]["text"] == "answer from decode"
    assert "kv_transfer_params" not in decode.bodies[-1]
    m = router_metrics(r)
    assert series(m, "inferd_router:instance_up", instance=prefill.base) == 0
    assert series(m, "inferd_router:ejections_total", instance=prefill.base) == 1
    # Ejected: the next long prompt goes straight to decode until a health check brings it back.
    prefill.mode = "ok"
    deadline = time.time() + 10
    while series(router_metrics(r), "inferd_router:instance_up", instance=prefill.base) != 1:
        assert time.time() < deadline
        time.sleep(0.05)
    assert raw(r, "POST", "/v1/completions", {"prompt": long_prompt(3), "max_tokens": 5})[0] == 200
    assert "kv_transfer_params" in decode.bodies[-1]


def test_a_decode_stream_cut_mid_way_ends_with_an_error_event(make_router, fakes):
    prefill, decode = fakes
    r = disagg_router(make_router, fakes)
    decode.mode = "cut"
    status, _, data = raw(r, "POST", "/v1/completions", {"prompt": "short", "stream": True}, timeout=30)
    assert status == 200
    events = [e for e in data.decode().split("\n\n") if e]
    assert events[:2] == ['data: {"choices":[{"index":0,"text":"answer "}]}',
                          'data: {"choices":[{"index":0,"text":"from "}]}']
    err = json.loads(events[2][len("data: "):])["error"]
    assert err["code"] == 502 and err["type"] == "server_error"
    assert decode.base in err["message"] and "mid-stream" in err["message"]
    assert events[3] == "data: [DONE]"
    assert series(router_metrics(r), "inferd_router:errors_total", kind="mid_stream") == 1


def test_a_responses_stream_cut_mid_way_ends_with_an_error_event(make_router, fakes):
    prefill, decode = fakes
    r = disagg_router(make_router, fakes)
    decode.mode = "cut"
    status, _, data = raw(r, "POST", "/v1/responses", {"input": LONG, "stream": True}, timeout=30)
    assert status == 200
    events = sse_events(data)
    assert [e[0] for e in events] == ["response.created", "response.output_text.delta", "error"]
    err = events[-1][1]
    assert err["type"] == "error" and err["code"] == "server_error" and err["sequence_number"] == 2
    assert decode.base in err["message"] and "mid-stream" in err["message"]
    assert b"[DONE]" not in data
    # A Responses request is never disaggregated: the prefill instance saw nothing.
    assert prefill.bodies == [] and decode.bodies[-1]["input"] == LONG
    assert series(router_metrics(r), "inferd_router:disagg_decisions_total", decision="direct",
                  reason="responses") == 1


def test_a_failure_before_any_byte_is_retried_then_502(make_router):
    first, second = FakeInstance("first"), FakeInstance("second")
    try:
        r = make_router("--instance", first.base, "--instance", second.base, "--policy", "round-robin",
                        api_key=None)
        r.wait_healthy()
        first.mode = "fail500"
        status, _, data = raw(r, "POST", "/v1/completions", {"prompt": "x", "stream": True})
        assert status == 200 and stream_text(data) == "answer from second "
        assert series(router_metrics(r), "inferd_router:retries_total") == 1
        # Both failing: a 502 naming the instances and the error.
        second.mode = "fail500"
        deadline = time.time() + 10
        while raw(r, "GET", "/health", key=False)[0] != 200 or \
                series(router_metrics(r), "inferd_router:instance_up", instance=first.base) != 1:
            assert time.time() < deadline
            time.sleep(0.05)
        status, _, data = raw(r, "POST", "/v1/completions", {"prompt": "x"})
        assert status == 502
        message = json.loads(data)["error"]["message"]
        assert "HTTP 500" in message and (first.base in message or second.base in message)
    finally:
        first.stop()
        second.stop()
