"""OpenAI's Responses API (/v1/responses) through the official openai client, on the default model:
the answer is the chat completion of the same conversation, streamed as typed events; stored
responses continue with previous_response_id; tool calls, reasoning, logprobs and structured
output come back as Responses items; what the server cannot do is a 400 naming the field."""
import json
import urllib.error
import urllib.request

import openai
import pytest


def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key=server.api_key or "none", max_retries=0, timeout=120)


def raw(server, method, path, body=None):
    """(status, parsed JSON or the SSE text) of one request."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(server.base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + server.api_key})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            text = r.read().decode()
            return r.status, (text if r.headers["Content-Type"] == "text/event-stream" else json.loads(text))
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode())


def chat(server, messages, **kw):
    return client(server).chat.completions.create(model="", messages=messages, temperature=0, **kw)


@pytest.mark.parametrize("stream", [False, True])
def test_answer_is_the_chat_completion_of_the_conversation(server, stream):
    kw = dict(model="", instructions="Answer in one sentence.", input="What is the capital of France?",
              max_output_tokens=40, temperature=0)
    want = chat(server, [{"role": "system", "content": "Answer in one sentence."},
                         {"role": "user", "content": "What is the capital of France?"}], max_tokens=40)
    if stream:
        with client(server).responses.stream(**kw) as s:
            deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
            final = s.get_final_response() if want.choices[0].finish_reason == "stop" else None
        assert "".join(deltas) == want.choices[0].message.content
        if final is None:
            return
        r = final
    else:
        r = client(server).responses.create(**kw)
    assert r.object == "response" and r.id.startswith("resp_") and r.instructions == "Answer in one sentence."
    assert r.output_text == want.choices[0].message.content
    assert [o.type for o in r.output] == ["message"] and r.output[0].role == "assistant"
    assert r.status == ("completed" if want.choices[0].finish_reason == "stop" else "incomplete")
    assert r.usage.input_tokens == want.usage.prompt_tokens
    assert r.usage.output_tokens == want.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def sse_events(text):
    events = []
    for block in text.strip().split("\n\n"):
        lines = block.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        data = json.loads(lines[1][len("data: "):])
        assert data["type"] == lines[0][len("event: "):]
        events.append(data)
    return events


def test_stream_events_are_numbered_and_nested(server):
    # max_output_tokens runs out: the stream ends with response.incomplete, and no [DONE].
    status, text = raw(server, "POST", "/v1/responses",
                       {"input": "Tell me a long story.", "stream": True, "max_output_tokens": 12, "temperature": 0})
    assert status == 200 and "[DONE]" not in text
    events = sse_events(text)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    last = events[-1]["response"]
    assert last["status"] == "incomplete" and last["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["usage"]["output_tokens"] == 12
    text_deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text_deltas == last["output"][0]["content"][0]["text"] == events[-4]["text"]
    item_id = events[2]["item"]["id"]
    assert all(e["item_id"] == item_id for e in events if "item_id" in e)


def test_previous_response_id_continues_the_conversation(server):
    cl = client(server)
    first = cl.responses.create(model="", instructions="Be brief.", input="Name a fruit.", max_output_tokens=20,
                                temperature=0)
    second = cl.responses.create(model="", previous_response_id=first.id, input="Name another one.",
                                 max_output_tokens=20, temperature=0)
    # The instructions do not carry over; the earlier turns do, with the first answer as the model wrote it.
    want = chat(server, [{"role": "user", "content": "Name a fruit."},
                         {"role": "assistant", "content": first.output_text},
                         {"role": "user", "content": "Name another one."}], max_tokens=20)
    assert second.previous_response_id == first.id and second.instructions is None
    assert second.output_text == want.choices[0].message.content
    assert second.usage.input_tokens == want.usage.prompt_tokens
    # The prefix cache served the first turn's tokens again.
    assert 0 < second.usage.input_tokens_details.cached_tokens < second.usage.input_tokens

    got = cl.responses.retrieve(first.id)
    assert got.model_dump() == first.model_dump()
    items = cl.responses.input_items.list(second.id).data
    assert len(items) == 1 and items[0].role == "user" and items[0].content[0].text == "Name another one."
    cl.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        cl.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as e:
        cl.responses.create(model="", previous_response_id=first.id, input="Again.", max_output_tokens=5)
    assert e.value.body["param"] == "previous_response_id"
    unstored = cl.responses.create(model="", input="Hi", max_output_tokens=5, store=False)
    with pytest.raises(openai.NotFoundError):
        cl.responses.retrieve(unstored.id)
    status, body = raw(server, "POST", "/v1/responses/" + second.id + "/cancel")
    assert status == 400 and "background" in body["error"]["message"]


def test_the_store_keeps_the_newest(make_server):
    s = make_server("--max-stored-responses", "2")
    ids = [client(s).responses.create(model="", input=f"Say {k}.", max_output_tokens=3).id for k in range(3)]
    assert raw(s, "GET", "/v1/responses/" + ids[0])[0] == 404
    assert [raw(s, "GET", "/v1/responses/" + i)[1]["id"] for i in ids[1:]] == ids[1:]


def test_logprobs_are_the_chat_logprobs(server):
    r = client(server).responses.create(model="", input="Say hello.", max_output_tokens=10, temperature=0,
                                        include=["message.output_text.logprobs"], top_logprobs=2)
    want = chat(server, [{"role": "user", "content": "Say hello."}], max_tokens=10, logprobs=True, top_logprobs=2)
    got = r.output[0].content[0].logprobs
    expected = want.choices[0].logprobs.content
    assert [(g.token, g.bytes) for g in got] == [(w.token, w.bytes) for w in expected]
    assert [g.logprob for g in got] == pytest.approx([w.logprob for w in expected], abs=1e-5)
    assert all(len(g.top_logprobs) == 2 for g in got)
    assert "".join(g.token for g in got) == r.output_text


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.mark.parametrize("stream", [False, True])
def test_text_format_json_schema(server, stream):
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    kw = dict(model="", input="Describe a person as JSON.", max_output_tokens=80, temperature=1,
              text={"format": fmt}, extra_body={"seed": 3})
    if stream:
        with client(server).responses.stream(**kw) as s:
            for _ in s:
                pass
            r = s.get_final_response()
    else:
        r = client(server).responses.create(**kw)
    assert r.status == "completed" and r.text.format.type == "json_schema"
    person = json.loads(r.output_text)
    assert set(person) == {"name", "age"} and 0 <= person["age"] <= 120


WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object",
                          "properties": {"city": {"type": "string", "maxLength": 30},
                                         "unit": {"enum": ["celsius", "fahrenheit"]}},
                          "required": ["city", "unit"], "additionalProperties": False}}
TIME = {"type": "function", "name": "get_time", "description": "The time in a zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}},
                       "required": ["zone"], "additionalProperties": False}}
ASK = "What is the weather in Paris and in Tokyo, and what time is it in Tokyo?"


def check_call(item):
    args = json.loads(item.arguments)
    assert item.type == "function_call" and item.call_id.startswith("call_") and item.id.startswith("fc_")
    if item.name == "get_weather":
        assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    else:
        assert item.name == "get_time" and set(args) == {"zone"}


def test_function_calls_streamed_equal_the_calls(tool_server):
    cl = client(tool_server)
    multi = 0
    for seed in range(4):
        kw = dict(model="", input=ASK, tools=[WEATHER, TIME], tool_choice="required", max_output_tokens=200,
                  temperature=1, parallel_tool_calls=True, extra_body={"seed": seed})
        whole = cl.responses.create(**kw)
        if whole.status != "completed":
            continue
        calls = [o for o in whole.output if o.type == "function_call"]
        assert calls and all(o.type == "function_call" for o in whole.output)
        for c in calls:
            check_call(c)
        with cl.responses.stream(**kw) as s:
            events = list(s)
            streamed = s.get_final_response()
        assert [(o.name, o.arguments) for o in streamed.output] == [(c.name, c.arguments) for c in calls]
        args = {}
        for e in events:
            if e.type == "response.function_call_arguments.delta":
                args[e.item_id] = args.get(e.item_id, "") + e.delta
        assert list(args.values()) == [c.arguments for c in calls]
        multi += len(calls) >= 2
    assert multi >= 1, "no answer with two or more calls among four seeds"


def test_function_call_round_trip(tool_server):
    cl = client(tool_server)
    first = cl.responses.create(model="", input="What is the weather in Paris?", tools=[WEATHER, TIME],
                                tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=100,
                                temperature=0)
    assert [o.type for o in first.output] == ["function_call"] and first.output[0].name == "get_weather"
    check_call(first.output[0])
    result = {"type": "function_call_output", "call_id": first.output[0].call_id, "output": "18 degrees, sunny"}
    stored = cl.responses.create(model="", previous_response_id=first.id, input=[result], tools=[WEATHER, TIME],
                                 tool_choice="none", max_output_tokens=30, temperature=0)
    # The same turn sent whole, as a stateless client does (store false): the same answer.
    items = [{"role": "user", "content": "What is the weather in Paris?"},
             first.output[0].model_dump(exclude_none=True), result]
    stateless = cl.responses.create(model="", input=items, tools=[WEATHER, TIME], tool_choice="none",
                                    max_output_tokens=30, temperature=0, store=False)
    assert stored.output_text and stored.output_text == stateless.output_text
    assert stored.usage.input_tokens == stateless.usage.input_tokens
    # And as chat completions renders it.
    want = client(tool_server).chat.completions.create(
        model="", temperature=0, max_tokens=30, tool_choice="none",
        tools=[{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in (WEATHER, TIME)],
        messages=[{"role": "user", "content": "What is the weather in Paris?"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [{"id": first.output[0].call_id, "type": "function",
                                   "function": {"name": "get_weather", "arguments": first.output[0].arguments}}]},
                  {"role": "tool", "tool_call_id": first.output[0].call_id, "content": "18 degrees, sunny"}])
    assert stored.output_text == want.choices[0].message.content


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_comes_back_as_a_reasoning_item(make_server, stream):
    # deepseek_r1's rules start the output inside <think>: SmolLM2 never closes it, so the whole
    # answer is reasoning, as chat completions' reasoning_content has it.
    s = make_server("--reasoning-parser", "deepseek_r1")
    want = chat(s, [{"role": "user", "content": "Why is the sky blue?"}], max_tokens=10)
    kw = dict(model="", input="Why is the sky blue?", max_output_tokens=10, temperature=0)
    if stream:
        status, text = raw(s, "POST", "/v1/responses", dict(kw, stream=True))
        events = sse_events(text)
        deltas = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
        assert deltas == want.choices[0].message.reasoning_content
        r = events[-1]["response"]
    else:
        r = client(s).responses.create(**kw).model_dump()
    assert [o["type"] for o in r["output"]] == ["reasoning"]
    assert r["output"][0]["content"][0]["text"] == want.choices[0].message.reasoning_content
    assert r["usage"]["output_tokens_details"]["reasoning_tokens"] == r["usage"]["output_tokens"] == 10


@pytest.mark.parametrize("body,param", [
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "p", "schema": 5}}}, "text.format"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "function_call", "call_id": "c"}]}, "input[0].name"),
    ({"input": "x", "reasoning": {"effort": "low"}}, "reasoning.effort"),
    ({"input": "x", "reasoning": {"summary": "detailed"}}, "reasoning.summary"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ({"input": "x", "frobnicate": 1}, "frobnicate"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    ({}, "input"),
])
def test_what_cannot_be_served_is_a_400_naming_the_field(server, body, param):
    status, answer = raw(server, "POST", "/v1/responses", body)
    assert status == 400 and answer["error"]["param"] == param, answer


def test_unknown_model_and_methods(server):
    assert raw(server, "POST", "/v1/responses", {"model": "nope", "input": "x"})[0] == 404
    assert raw(server, "GET", "/v1/responses/resp_none")[0] == 404
    assert raw(server, "PUT", "/v1/responses/resp_none")[0] == 405
    assert raw(server, "GET", "/v1/responses")[0] == 405
