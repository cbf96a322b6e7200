"""Structured output and tool calls through the official openai client, on the default model:
every constrained answer parses and matches its schema, streamed or not."""
import json
import re

import openai
import pytest


MESSAGES = [{"role": "user", "content": "Describe a person as JSON."}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}


def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key=server.api_key or "none", max_retries=0, timeout=120)


def check_person(doc):
    p = json.loads(doc)
    assert set(p) <= set(PERSON["properties"]) and {"name", "age", "role"} <= set(p)
    assert isinstance(p["name"], str) and len(p["name"]) <= 20
    assert isinstance(p["age"], int) and 0 <= p["age"] <= 120
    assert p["role"] in ("admin", "user", "guest")
    assert all(isinstance(t, str) and len(t) <= 10 for t in p.get("tags", [])) and len(p.get("tags", [])) <= 3


def text_of(response, stream):
    if not stream:
        return response.choices[0].message.content, response.choices[0].finish_reason
    text, finish = "", None
    for c in response:
        if c.choices:
            text += c.choices[0].delta.content or ""
            finish = c.choices[0].finish_reason or finish
    return text, finish


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_answers_always_validate(server, stream, temperature):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for seed in range(3):
        r = client(server).chat.completions.create(model="", messages=MESSAGES, max_tokens=120,
                                                   temperature=temperature, seed=seed, response_format=fmt,
                                                   stream=stream)
        text, finish = text_of(r, stream)
        assert finish == "stop", text
        check_person(text)


def test_vllm_constraint_fields(server):
    cl = client(server)
    r = cl.completions.create(model="", prompt="The answer is", max_tokens=10, temperature=1, seed=3,
                              extra_body={"guided_choice": ["yes", "no", "maybe"]})
    assert r.choices[0].text in ("yes", "no", "maybe") and r.choices[0].finish_reason == "stop"
    r = cl.completions.create(model="", prompt="A date:", max_tokens=20, temperature=1, seed=4,
                              extra_body={"structured_outputs": {"regex": "[0-9]{4}-[0-9]{2}-[0-9]{2}"}})
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", r.choices[0].text)
    r = cl.completions.create(model="", prompt="Colour:", max_tokens=20, temperature=1, seed=5,
                              extra_body={"guided_grammar": 'root ::= "red" | "green" | "blue"'})
    assert r.choices[0].text in ("red", "green", "blue")
    r = cl.chat.completions.create(model="", messages=MESSAGES, max_tokens=200, temperature=0,
                                   response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    with pytest.raises(openai.BadRequestError) as e:
        cl.chat.completions.create(model="", messages=MESSAGES, max_tokens=5, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "patternProperties": {}}}})
    assert e.value.body["param"] == "response_format" and "patternProperties" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        cl.completions.create(model="", prompt="x", max_tokens=5, extra_body={"guided_grammar": "root ::= ("})
    assert e.value.body["param"] == "guided_grammar"


def test_json_layout_options(server):
    # vLLM's layout options: no whitespace at all, or a whitespace pattern (here newlines and
    # indents) at every structural position; each answer still validates.
    cl = client(server)
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    r = cl.chat.completions.create(model="", messages=MESSAGES, max_tokens=120, temperature=1, seed=2,
                                   response_format=fmt, extra_body={"structured_outputs": {"disable_any_whitespace": True}})
    text = r.choices[0].message.content
    check_person(text)
    assert text == json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False), text
    seen_newline = False
    for seed in range(4):
        r = cl.chat.completions.create(model="", messages=MESSAGES, max_tokens=160, temperature=1, seed=seed,
                                       response_format=fmt, extra_body={"guided_whitespace_pattern": "(\\n {0,4})?"})
        text = r.choices[0].message.content
        if r.choices[0].finish_reason == "stop":
            check_person(text)
        outside = re.sub(r'"(\\.|[^"\\])*"', '""', text)  # whitespace outside strings: newline + indent only
        assert not re.search(r"[ ]{5,}|\t|  \n", outside), text
        seen_newline |= "\n" in outside
    assert seen_newline, "the pattern's newlines were never used"
    with pytest.raises(openai.BadRequestError) as e:
        cl.completions.create(model="", prompt="x", max_tokens=4,
                              extra_body={"guided_regex": "a+", "guided_whitespace_pattern": " *"})
    assert e.value.body["param"] == "guided_whitespace_pattern"


def nested_schema(levels):
    schema = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


def test_hostile_grammars_are_400_and_others_are_served(server):
    """Grammars that used to overflow the stack or run for minutes (tests/grammar/grammar_limits_test.cpp),
    sent while another request streams: each is a 400 naming its field, a huge valid grammar is
    compiled off the I/O thread and served, and the stream completes. Then bodies nested a million
    deep: 400, and the server serves on."""
    import concurrent.futures
    cl = client(server)
    chain = "root ::= r0\n" + "".join(f'r{i} ::= r{i + 1} "x"\n' for i in range(200000)) + 'r200000 ::= "y"\n'

    def stream():
        r = cl.completions.create(model="", prompt="Once upon a time", max_tokens=64, temperature=0,
                                  stream=True, extra_body={"ignore_eos": True})
        return [c.choices[0].finish_reason for c in r if c.choices and c.choices[0].finish_reason]

    def refused(max_tokens=5, **kw):
        with pytest.raises(openai.BadRequestError) as e:
            cl.completions.create(model="", prompt="x", max_tokens=max_tokens, **kw)
        return e.value.body

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        streamed = pool.submit(stream)
        parens = "root ::= " + "(" * 100000 + '"a"' + ")" * 100000
        deep_gbnf = pool.submit(refused, extra_body={"guided_grammar": parens})
        stars = pool.submit(refused, extra_body={"guided_grammar": 'root ::= "a"' + "*" * 100000})
        deep_regex = pool.submit(refused, extra_body={"guided_regex": "(" * 100000 + "a" + ")" * 100000})
        deep_schema = pool.submit(refused, extra_body={"guided_json": nested_schema(300)})
        big = pool.submit(lambda: cl.completions.create(model="", prompt="x", max_tokens=6, temperature=1, seed=1,
                                                        extra_body={"guided_grammar": chain}))
        # Each "a" doubles the parses alive: past 16384 the request fails with the reason, alone.
        doubling = pool.submit(refused, max_tokens=40, extra_body={"guided_grammar": 'root ::= "a" root "c" | "a" root "d"'})
        # 20,000 alternatives alive from the first byte: refused when compiled.
        wide = pool.submit(refused, extra_body={"guided_grammar": "root ::= " + " | ".join(
            f'"x{i}"' for i in range(20000))})
        # 50,000 choices share their prefixes (one parse alive), and are served.
        options = ["".join(chr(97 + (i * 7919 + k * 104729) % 26) for k in range(8)) + str(i) for i in range(50000)]
        choice = pool.submit(lambda: cl.completions.create(model="", prompt="Pick one:", max_tokens=20, temperature=1,
                                                           seed=3, extra_body={"guided_choice": options}))
        for f, param, words in ((deep_gbnf, "guided_grammar", "groups nested deeper than 256"),
                                (stars, "guided_grammar", "repetitions nested deeper than 256"),
                                (deep_regex, "guided_regex", "groups nested deeper than 128"),
                                (deep_schema, "guided_json", "nested deeper than 64 levels")):
            body = f.result()
            assert body["param"] == param and words in body["message"], body
        assert "the output grammar is too ambiguous" in doubling.result()["message"], doubling.result()
        assert "too ambiguous" in wide.result()["message"] and wide.result()["param"] == "guided_grammar", wide.result()
        assert choice.result().choices[0].text in set(options), choice.result()
        answer = big.result().choices[0]
        assert answer.finish_reason == "length" and re.fullmatch("yx*", answer.text), answer
        assert streamed.result() == ["length"]
    # A body of a million nested brackets (2 MB): it overflowed the server's stack, and UCX's crash
    # handler then hung the process in malloc instead of letting it die.
    import urllib.error
    import urllib.request
    n = 1000000
    for body in ('{"model": "", "prompt": ' + "[" * n + "]" * n + "}",
                 '{"model": "", "messages": [{"role": "user", "content": ' + "[" * n + "]" * n + "}]}"):
        req = urllib.request.Request(server.base + "/v1/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {server.api_key}"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=120)
        assert e.value.code == 400
        assert "nests arrays and objects deeper than 512 levels" in json.loads(e.value.read())["error"]["message"]
    r = cl.completions.create(model="", prompt="Hello", max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 4


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}},
                                       "required": ["zone"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_call(name, arguments):
    args = json.loads(arguments)
    if name == "get_weather":
        assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
        assert isinstance(args["city"], str) and len(args["city"]) <= 30
    else:
        assert name == "get_time" and set(args) == {"zone"}


def test_tool_round_trip(tool_server):
    cl = client(tool_server)
    r = cl.chat.completions.create(model="", messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                   max_tokens=100, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_") and call.type == "function"
    check_call(call.function.name, call.function.arguments)
    history = ASK + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}]
    answer = cl.chat.completions.create(model="", messages=history, tools=[WEATHER, TIME], tool_choice="none",
                                        max_tokens=20, temperature=0)
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    named = cl.chat.completions.create(model="", messages=ASK, tools=[WEATHER, TIME], max_tokens=100,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert [c.function.name for c in named.choices[0].message.tool_calls] == ["get_time"]
    check_call("get_time", named.choices[0].message.tool_calls[0].function.arguments)


def streamed_calls(cl, **kw):
    calls, finish = {}, None
    for c in cl.chat.completions.create(stream=True, **kw):
        if not c.choices:
            continue
        finish = c.choices[0].finish_reason or finish
        for d in c.choices[0].delta.tool_calls or []:
            if d.id:
                assert d.index not in calls and d.function.name
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
            calls[d.index]["arguments"] += d.function.arguments or ""
    return [(calls[i]["id"], calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)], finish


@pytest.mark.parametrize("parallel", [True, False])
def test_tool_calls_streamed_equal_the_calls(tool_server, parallel):
    cl = client(tool_server)
    kw = dict(model="", messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=150,
              temperature=1, seed=7, parallel_tool_calls=parallel)
    whole = cl.chat.completions.create(**kw).choices[0]
    streamed, finish = streamed_calls(cl, **kw)
    assert finish == "tool_calls"
    got = [(name, arguments) for _, name, arguments in streamed]
    assert got == [(t.function.name, t.function.arguments) for t in whole.message.tool_calls]
    assert len(got) >= 1 and (parallel or len(got) == 1)
    for name, arguments in got:
        check_call(name, arguments)


ASK_THREE = [{"role": "user", "content": "What is the weather in Paris and in Tokyo, and what time is it in Tokyo?"}]


def test_parallel_tool_calls_in_one_answer(tool_server):
    # A question that needs three calls: with parallel_tool_calls the model answers with several
    # <tool_call> blocks in one turn, each parsed into its own call (distinct ids, valid arguments),
    # streamed as the same calls; without it, the grammar allows exactly one.
    cl = client(tool_server)
    multi = 0
    for seed in range(6):
        kw = dict(model="", messages=ASK_THREE, tools=[WEATHER, TIME], tool_choice="required", max_tokens=200,
                  temperature=1, seed=seed)
        whole = cl.chat.completions.create(parallel_tool_calls=True, **kw).choices[0]
        if whole.finish_reason != "tool_calls":
            assert whole.finish_reason == "length"
            continue
        calls = whole.message.tool_calls
        assert len({c.id for c in calls}) == len(calls)
        for c in calls:
            check_call(c.function.name, c.function.arguments)
        got, finish = streamed_calls(cl, parallel_tool_calls=True, **kw)
        assert finish == "tool_calls"
        assert [(n, a) for _, n, a in got] == [(c.function.name, c.function.arguments) for c in calls]
        multi += len(calls) >= 2
        single = cl.chat.completions.create(parallel_tool_calls=False, **kw).choices[0]
        assert single.finish_reason == "tool_calls" and len(single.message.tool_calls) == 1
        check_call(single.message.tool_calls[0].function.name, single.message.tool_calls[0].function.arguments)
    assert multi >= 2, "no answer with two or more tool calls among six seeds"


def test_legacy_functions_round_trip(tool_server):
    # OpenAI's older function calling, as the openai client still sends it: the call comes back in
    # message.function_call (finish_reason "function_call"), streamed as function_call deltas, and
    # the conversation goes on with a "function" message.
    cl = client(tool_server)
    functions = [WEATHER["function"], TIME["function"]]
    kw = dict(model="", messages=ASK, functions=functions, function_call={"name": "get_weather"}, max_tokens=100,
              temperature=1, seed=11)
    choice = cl.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "function_call" and choice.message.tool_calls is None
    call = choice.message.function_call
    assert call.name == "get_weather"
    check_call(call.name, call.arguments)
    name, arguments, finish = None, "", None
    for c in cl.chat.completions.create(stream=True, **kw):
        if not c.choices:
            continue
        finish = c.choices[0].finish_reason or finish
        d = c.choices[0].delta
        assert not d.tool_calls
        if d.function_call:
            if d.function_call.name:
                assert name is None
                name = d.function_call.name
            arguments += d.function_call.arguments or ""
    assert (name, arguments, finish) == (call.name, call.arguments, "function_call")
    history = ASK + [{"role": "assistant", "content": None, "function_call": {"name": call.name,
                                                                              "arguments": call.arguments}},
                     {"role": "function", "name": call.name, "content": "18 degrees, sunny"}]
    answer = cl.chat.completions.create(model="", messages=history, functions=functions, function_call="none",
                                        max_tokens=20, temperature=0).choices[0]
    assert answer.message.content and answer.message.function_call is None
    with pytest.raises(openai.BadRequestError) as e:
        cl.chat.completions.create(model="", messages=ASK, functions=functions, tools=[WEATHER], max_tokens=5)
    assert e.value.body["param"] == "functions"


def test_malformed_tools_are_400(tool_server):
    cl = client(tool_server)
    bad = {"type": "function", "function": {"name": "no spaces allowed"}}
    with pytest.raises(openai.BadRequestError) as e:
        cl.chat.completions.create(model="", messages=ASK, tools=[bad], max_tokens=5)
    assert e.value.body["param"] == "tools[0].function.name"
    with pytest.raises(openai.BadRequestError) as e:
        cl.chat.completions.create(model="", messages=ASK, tools=[WEATHER], max_tokens=5,
                                   tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice"


def test_tools_need_the_parser_flags(server):
    with pytest.raises(openai.BadRequestError) as e:
        client(server).chat.completions.create(model="", messages=ASK, tools=[WEATHER], max_tokens=5)
    assert e.value.body["param"] == "tools" and "--tool-call-parser" in e.value.body["message"]
