"""SLO classes through the real server on the default model: a request picks its class by the
slo_class field, the X-SLO-Class header or its priority; an unknown class is a 400 naming the
field; a class whose time to first token the load would miss is refused early (429 with
Retry-After); per-class TTFT / TPOT histograms and outcome counters are in /metrics."""
import json
import re

from test_server import raw



CLASSES = ("--slo-class", "chat:ttft=20s,tpot=5s,weight=4",
           "--slo-class", "batch:ttft=600s,weight=1",
           "--slo-class", "instant:ttft=1ms,weight=8")


def complete(server, extra=None, headers=None, prompt="Write a story about a fox."):
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    body.update(extra or {})
    status, head, data = raw(server, "POST", "/v1/completions", body, headers)
    return status, {k.title(): v for k, v in head.items()}, json.loads(data)


def series(server, name, **labels):
    status, _, data = raw(server, "GET", "/metrics")
    assert status == 200
    total = None
    for line in data.decode().splitlines():
        m = re.match(r"^" + re.escape(name) + r"\{([^}]*)\} ([0-9.eE+-]+)$", line)
        if not m:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(have.get(k) == v for k, v in labels.items()):
            total = (total or 0) + float(m.group(2))
    return total


def test_classes_by_field_header_and_priority(make_server):
    s = make_server(*CLASSES)
    for _ in range(2):
        status, _, body = complete(s, {"slo_class": "chat"})
        assert status == 200, body
    status, _, body = complete(s, headers={"X-SLO-Class": "batch"})
    assert status == 200, body
    # No class named: priority 1 maps to the class of rank 1 (chat: one class is heavier); no
    # priority either: the default class (the lightest, batch).
    status, _, body = complete(s, {"priority": 1})
    assert status == 200, body
    status, _, body = complete(s)
    assert status == 200, body
    # The body's field wins over the header.
    status, _, body = complete(s, {"slo_class": "batch"}, headers={"X-SLO-Class": "nope"})
    assert status == 200, body
    # The metrics count each request once, in its class, as goodput (well inside the targets).
    assert series(s, "inferd:slo_requests_total", slo_class="chat", outcome="met") == 3
    assert series(s, "inferd:slo_requests_total", slo_class="batch", outcome="met") == 3
    assert series(s, "inferd:slo_time_to_first_token_seconds_count", slo_class="chat") == 3
    assert series(s, "inferd:slo_time_per_output_token_seconds_count", slo_class="batch") == 3
    for cls in ("chat", "batch", "instant"):
        assert series(s, "inferd:slo_requests_total", slo_class=cls, outcome="refused") is not None
    # n > 1: every sample runs in the request's class (the forks inherit it).
    status, _, body = complete(s, {"slo_class": "chat", "n": 3, "temperature": 1, "seed": 5})
    assert status == 200 and len(body["choices"]) == 3, body
    assert series(s, "inferd:slo_requests_total", slo_class="chat", outcome="met") == 6
    # An unknown class is a 400 naming the field, from the body or the header.
    status, _, body = complete(s, {"slo_class": "nope"})
    assert status == 400 and body["error"]["param"] == "slo_class", body
    assert "'chat'" in body["error"]["message"]
    status, _, body = complete(s, headers={"X-SLO-Class": "nope"})
    assert status == 400 and body["error"]["param"] == "slo_class", body
    status, _, body = complete(s, {"slo_class": 3})
    assert status == 400 and body["error"]["param"] == "slo_class", body
    s.stop()


def test_a_class_the_load_would_miss_is_refused_early(make_server):
    s = make_server(*CLASSES)
    status, _, body = complete(s, {"slo_class": "chat"})  # the engine measures its prefill rate
    assert status == 200, body
    # 1 ms to the first token can not be met by a prompt of ~100 tokens: 429 at arrival.
    status, head, body = complete(s, {"slo_class": "instant"}, prompt="Tell me about foxes. " * 20)
    assert status == 429, body
    assert body["error"]["code"] == "slo_unattainable"
    assert "instant" in body["error"]["message"]
    assert int(head["Retry-After"]) >= 1
    assert series(s, "inferd:slo_requests_total", slo_class="instant", outcome="refused") == 1
    # Other classes are served as before.
    status, _, body = complete(s, {"slo_class": "batch"})
    assert status == 200, body
    s.stop()


def test_a_server_without_classes_refuses_the_field(server):
    status, _, body = complete(server, {"slo_class": "chat"})
    assert status == 400 and body["error"]["param"] == "slo_class", body
    assert "--slo-class" in body["error"]["message"]
    status, _, body = complete(server, headers={"X-SLO-Class": "chat"})
    assert status == 400 and body["error"]["param"] == "slo_class", body
    assert series(server, "inferd:slo_requests_total") is None


def test_the_dashboard_row_per_class_queries_series_we_export(make_server):
    from test_server import SLO_SERIES, dashboard_series
    used = dashboard_series() & SLO_SERIES
    assert used == SLO_SERIES
    s = make_server(*CLASSES)
    status, _, data = raw(s, "GET", "/metrics")
    for name in used:
        assert re.search("^" + re.escape(name) + r"(_bucket|_sum|_count)?\{", data.decode(), re.M), name
    s.stop()
