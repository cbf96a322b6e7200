"""Request fields that shape the answer, through the official openai client: logit_bias, echo,
include_stop_str_in_output, chat_template_kwargs, and the reasoning parsers' split."""
import json
import urllib.request

import openai
import pytest


MESSAGES = [{"role": "user", "content": "Name three colours."}]


def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key=server.api_key or "none", max_retries=0, timeout=120)


def test_logit_bias_bans_and_forces_tokens(server):
    cl = client(server)
    base = cl.completions.create(model="", prompt="1, 2, 3,", max_tokens=4, temperature=0, logprobs=0,
                                 extra_body={"ignore_eos": True})
    first = base.choices[0].logprobs.tokens[0]
    ids = post(server, "/tokenize", {"prompt": first, "add_special_tokens": False})["tokens"]
    assert len(ids) == 1
    banned = cl.completions.create(model="", prompt="1, 2, 3,", max_tokens=4, temperature=0, logprobs=0,
                                   logit_bias={str(ids[0]): -100}, extra_body={"ignore_eos": True})
    assert banned.choices[0].logprobs.tokens[0] != first
    forced = cl.completions.create(model="", prompt="1, 2, 3,", max_tokens=3, temperature=1, seed=1,
                                   logit_bias={"42": 100}, extra_body={"ignore_eos": True})
    assert forced.choices[0].text == post(server, "/detokenize", {"tokens": [42, 42, 42]})["prompt"]
    with pytest.raises(openai.BadRequestError) as e:
        cl.completions.create(model="", prompt="x", max_tokens=1, logit_bias={"10000000": 1})
    assert e.value.body["param"] == "logit_bias"
    with pytest.raises(openai.BadRequestError) as e:
        cl.completions.create(model="", prompt="x", max_tokens=1, logit_bias={"1": 101})
    assert e.value.body["param"] == "logit_bias"


def post(server, path, body):
    req = urllib.request.Request(server.base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + server.api_key})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_echo_puts_the_prompt_first_streamed_and_not(server):
    cl = client(server)
    plain = cl.completions.create(model="", prompt="Once upon", max_tokens=5, temperature=0).choices[0].text
    echoed = cl.completions.create(model="", prompt="Once upon", max_tokens=5, temperature=0, echo=True)
    assert echoed.choices[0].text == "Once upon" + plain
    chunks = cl.completions.create(model="", prompt="Once upon", max_tokens=5, temperature=0, echo=True,
                                   stream=True)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Once upon" + plain
    with pytest.raises(openai.BadRequestError) as e:
        cl.completions.create(model="", prompt="x", max_tokens=1, echo=True, logprobs=1, stream=True)
    assert e.value.body["param"] == "echo"


def test_include_stop_str_in_output(server):
    cl = client(server)
    base = cl.completions.create(model="", prompt="1, 2, 3, 4,", max_tokens=20, temperature=0,
                                 extra_body={"ignore_eos": True}).choices[0].text
    stop = base[3:6]
    for stream in (False, True):
        r = cl.completions.create(model="", prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=[stop],
                                  stream=stream, extra_body={"include_stop_str_in_output": True})
        text = "".join(c.choices[0].text for c in r if c.choices) if stream else r.choices[0].text
        assert text == base[:base.index(stop)] + stop


def test_chat_template_kwargs_reach_the_template(server):
    cl = client(server)
    with_prompt = cl.chat.completions.create(model="", messages=MESSAGES, max_tokens=1)
    without = cl.chat.completions.create(model="", messages=MESSAGES, max_tokens=1,
                                         extra_body={"chat_template_kwargs": {"add_generation_prompt": False}})
    # SmolLM2's template adds "<|im_start|>assistant\n" only with add_generation_prompt.
    assert without.usage.prompt_tokens < with_prompt.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as e:
        cl.chat.completions.create(model="", messages=MESSAGES, max_tokens=1,
                                   extra_body={"chat_template_kwargs": ["x"]})
    assert e.value.body["param"] == "chat_template_kwargs"


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_parsers_split_the_output(server, make_server, stream):
    """deepseek_r1's rules start the output inside the reasoning (QwQ's and R1's templates open
    <think> in the prompt): SmolLM2 never closes it, so the whole answer is reasoning_content.
    qwen3's rules need the tags: the same answer is all content."""
    base = client(server).chat.completions.create(model="", messages=MESSAGES, max_tokens=8, temperature=0)
    text = base.choices[0].message.content
    assert text

    def ask(s):
        r = client(s).chat.completions.create(model="", messages=MESSAGES, max_tokens=8, temperature=0,
                                              stream=stream)
        if not stream:
            m = r.choices[0].message
            return m.content or "", getattr(m, "reasoning_content", None) or ""
        content, reasoning = "", ""
        for c in r:
            if c.choices:
                content += c.choices[0].delta.content or ""
                reasoning += getattr(c.choices[0].delta, "reasoning_content", None) or ""
        return content, reasoning

    assert ask(make_server("--reasoning-parser", "deepseek_r1")) == ("", text)
    assert ask(make_server("--reasoning-parser", "qwen3")) == (text, "")


def token_ids(logprobs):
    """The ids of a completion's tokens, from logprobs named "token_id:N" (return_tokens_as_token_ids)."""
    assert all(t.startswith("token_id:") for t in logprobs.tokens)
    return [int(t.split(":")[1]) for t in logprobs.tokens]


def contains_run(ids, run):
    return any(ids[i:i + len(run)] == run for i in range(len(ids) - len(run) + 1))


def test_min_tokens_holds_back_the_stop_tokens(server):
    cl = client(server)
    kw = dict(model="", prompt="1, 2, 3, 4,", max_tokens=8, temperature=0, logprobs=0)
    base = cl.completions.create(**kw, extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    ids = token_ids(base.choices[0].logprobs)
    # The first greedy token as a stop token ends the output at once, adding no text (as vLLM).
    stopped = cl.completions.create(**kw, extra_body={"stop_token_ids": [ids[0]]})
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == 1
    assert stopped.choices[0].text == ""
    # With min_tokens the first 4 tokens cannot be it.
    held = cl.completions.create(**kw, extra_body={"stop_token_ids": [ids[0]], "min_tokens": 4,
                                                   "return_tokens_as_token_ids": True})
    got = token_ids(held.choices[0].logprobs)
    assert len(got) >= 4 and ids[0] not in got[:4]
    assert held.usage.completion_tokens == len(got)
    # A stop string inside the first min_tokens tokens does not end the output either.
    text = base.choices[0].text
    early = cl.completions.create(model="", prompt="1, 2, 3, 4,", max_tokens=8, temperature=0, stop=[text[:2]],
                                  extra_body={"ignore_eos": True, "min_tokens": 8})
    assert early.choices[0].text == text and early.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as e:
        cl.completions.create(model="", prompt="x", max_tokens=2, extra_body={"min_tokens": 3})
    assert e.value.body["param"] == "min_tokens"


def test_allowed_token_ids_and_special_tokens_text(server):
    cl = client(server)
    allowed = [post(server, "/tokenize", {"prompt": w, "add_special_tokens": False})["tokens"][0]
               for w in (" red", " green", " blue")]
    r = cl.completions.create(model="", prompt="Colours:", max_tokens=12, temperature=1.0, seed=3, logprobs=0,
                              extra_body={"allowed_token_ids": allowed, "ignore_eos": True,
                                          "return_tokens_as_token_ids": True})
    got = token_ids(r.choices[0].logprobs)
    assert len(got) == 12 and set(got) <= set(allowed) and len(set(got)) > 1
    # A special token's text is left out unless skip_special_tokens is false.
    im_start = post(server, "/tokenize", {"prompt": "<|im_start|>", "add_special_tokens": False})["tokens"]
    assert len(im_start) == 1
    kw = dict(model="", prompt="Hi", max_tokens=2, temperature=0,
              extra_body={"allowed_token_ids": im_start, "ignore_eos": True})
    assert cl.completions.create(**kw).choices[0].text == ""
    kw["extra_body"]["skip_special_tokens"] = False
    assert cl.completions.create(**kw).choices[0].text == "<|im_start|><|im_start|>"
    with pytest.raises(openai.BadRequestError) as e:
        cl.completions.create(model="", prompt="x", max_tokens=1, extra_body={"allowed_token_ids": [10 ** 8]})
    assert e.value.body["param"] == "allowed_token_ids"


def test_bad_words_never_appear_in_the_output_tokens(server):
    cl = client(server)
    kw = dict(model="", messages=MESSAGES, max_tokens=24, temperature=0)
    base = cl.chat.completions.create(**kw).choices[0].message.content
    words = [w.strip(".,:;!?*") for w in base.split()]
    words = [w for w in words if len(w) >= 3 and w.isalpha()][:2]
    assert words, base
    r = cl.chat.completions.create(**kw, logprobs=True, extra_body={"bad_words": words,
                                                                      "return_tokens_as_token_ids": True})
    got = [int(e.token.split(":")[1]) for e in r.choices[0].logprobs.content]
    for w in words:
        for form in (w, " " + w):
            run = post(server, "/tokenize", {"prompt": form, "add_special_tokens": False})["tokens"]
            assert not contains_run(got, run), (w, r.choices[0].message.content)
    assert r.choices[0].message.content != base


def test_continue_final_message_and_truncate_prompt_tokens(server):
    cl = client(server)
    start = "Three colours are"
    messages = MESSAGES + [{"role": "assistant", "content": start}]
    # The prompt: the conversation up to the assistant's turn, then the start of its message.
    head = post(server, "/tokenize", {"messages": MESSAGES})["tokens"]
    tail = post(server, "/tokenize", {"prompt": start, "add_special_tokens": False})["tokens"]
    cont = post(server, "/tokenize", {"messages": messages, "continue_final_message": True})["tokens"]
    assert cont == head + tail
    r = cl.chat.completions.create(model="", messages=messages, max_tokens=10, temperature=0,
                                   extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert r.usage.prompt_tokens == len(cont)
    same = cl.completions.create(model="", prompt=cont, max_tokens=10, temperature=0)
    assert r.choices[0].message.content == same.choices[0].text
    closed = post(server, "/tokenize", {"messages": messages, "add_generation_prompt": False})["tokens"]
    assert closed[:len(cont)] == cont and len(closed) > len(cont)  # the turn's end marker after it
    with pytest.raises(openai.BadRequestError) as e:
        cl.chat.completions.create(model="", messages=messages, max_tokens=1,
                                   extra_body={"continue_final_message": True, "add_generation_prompt": True})
    assert e.value.body["param"] == "continue_final_message"
    # truncate_prompt_tokens: the prompt's last k tokens, as if they were the whole prompt.
    long = "The quick brown fox jumps over the lazy dog, and then it runs away into the woods"
    ids = post(server, "/tokenize", {"prompt": long})["tokens"]
    cut = cl.completions.create(model="", prompt=long, max_tokens=6, temperature=0,
                                extra_body={"truncate_prompt_tokens": 5})
    assert cut.usage.prompt_tokens == 5
    last5 = cl.completions.create(model="", prompt=ids[-5:], max_tokens=6, temperature=0)
    assert cut.choices[0].text == last5.choices[0].text


def test_echo_with_logprobs_scores_the_prompt_as_decoding_did(server):
    """The loglikelihood request of evaluation harnesses (echo, logprobs, max_tokens 1): the prompt's
    tokens come with the log-probabilities decoding gave them."""
    cl = client(server)
    gen = cl.completions.create(model="", prompt="The capital of France is", max_tokens=6, temperature=0,
                                logprobs=0, extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    out_ids = token_ids(gen.choices[0].logprobs)
    prompt_ids = post(server, "/tokenize", {"prompt": "The capital of France is"})["tokens"]
    scored = cl.completions.create(model="", prompt=prompt_ids + out_ids, max_tokens=1, temperature=0, echo=True,
                                   logprobs=2, extra_body={"return_tokens_as_token_ids": True})
    lp = scored.choices[0].logprobs
    n = len(prompt_ids) + len(out_ids)
    assert token_ids(lp)[:n] == prompt_ids + out_ids and len(lp.tokens) == n + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[len(prompt_ids):n] == pytest.approx(gen.choices[0].logprobs.token_logprobs, abs=1e-4)
    assert all(len(t) == 2 for t in lp.top_logprobs[1:])
    # vLLM's prompt_logprobs field, on chat too: null, then one map per prompt token.
    r = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1, "prompt_logprobs": 1})
    pl = r["prompt_logprobs"]
    assert pl[0] is None and len(pl) == r["usage"]["prompt_tokens"]
    chat_ids = post(server, "/tokenize", {"messages": MESSAGES})["tokens"]
    for tid, entry in zip(chat_ids[1:], pl[1:]):
        assert str(tid) in entry and entry[str(tid)]["rank"] >= 1 and entry[str(tid)]["logprob"] <= 0
        assert any(e["rank"] == 1 for e in entry.values())


def test_suffix_needs_fill_in_the_middle_tokens(server):
    # SmolLM2 has no FIM tokens: the request is refused, naming the field and why.
    cl = client(server)
    with pytest.raises(openai.BadRequestError) as e:
        cl.completions.create(model="", prompt="def f(x):", suffix="\n    return y", max_tokens=4)
    assert e.value.body["param"] == "suffix" and "fill-in-the-middle" in e.value.body["message"]


RAG_TEMPLATE = ("{% for d in documents | default([]) %}<|im_start|>system\nDocument {{ d.title }}: {{ d.text }}"
                "<|im_end|>\n{% endfor %}{% if reasoning_effort is defined %}<|im_start|>system\nReasoning: "
                "{{ reasoning_effort }}<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
                "{{ m.content }}<|im_end|>\n{% endfor %}{{ '<|im_start|>assistant\\n' }}")
DOCS = [{"title": "Colours", "text": "Teal is a colour."}]


def test_request_chat_template_documents_and_reasoning_effort(server, make_server):
    # vLLM's fields: a request's own chat template on a server that trusts them, documents and
    # reasoning_effort for a template that renders them. The prompt is exactly what the template
    # renders (/tokenize of the same text), and generation uses it (usage.prompt_tokens).
    with pytest.raises(openai.BadRequestError) as e:
        client(server).chat.completions.create(model="", messages=MESSAGES, max_tokens=1,
                                               extra_body={"chat_template": RAG_TEMPLATE})
    assert e.value.body["param"] == "chat_template" and "--trust-request-chat-template" in e.value.body["message"]
    # SmolLM2's own template renders neither documents nor a reasoning effort: refused, not ignored.
    for field, value in (("documents", DOCS), ("reasoning_effort", "low")):
        with pytest.raises(openai.BadRequestError) as e:
            client(server).chat.completions.create(model="", messages=MESSAGES, max_tokens=1,
                                                   extra_body={field: value})
        assert e.value.body["param"] == field and "does not use" in e.value.body["message"]

    trusting = make_server("--trust-request-chat-template")
    cl = client(trusting)
    text = ("<|im_start|>system\nDocument Colours: Teal is a colour.<|im_end|>\n<|im_start|>system\nReasoning: low"
            "<|im_end|>\n<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n")
    expected = post(trusting, "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]
    fields = {"chat_template": RAG_TEMPLATE, "documents": DOCS, "reasoning_effort": "low"}
    assert post(trusting, "/tokenize", {"messages": MESSAGES, **fields})["tokens"] == expected
    answer = cl.chat.completions.create(model="", messages=MESSAGES, max_tokens=3, temperature=0,
                                        extra_body=fields)
    assert answer.usage.prompt_tokens == len(expected)
    plain = cl.chat.completions.create(model="", messages=MESSAGES, max_tokens=3, temperature=0)
    assert plain.usage.prompt_tokens != answer.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as e:
        cl.chat.completions.create(model="", messages=MESSAGES, max_tokens=1,
                                   extra_body={"chat_template": "{% if %}"})
    assert e.value.body["param"] == "chat_template" and "line 1" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        cl.chat.completions.create(model="", messages=MESSAGES, max_tokens=1, reasoning_effort="extreme")
    assert e.value.body["param"] == "reasoning_effort"


def test_best_of_answers_the_likeliest_samples(server):
    # best_of=6, n=2 answers the two of six samples with the highest mean log-probability per token:
    # the same six samples as n=6 with the same seed (sampling is seeded per sample), ranked.
    cl = client(server)
    kw = dict(model="", prompt="Once upon a time", max_tokens=8, temperature=1.2, seed=21, logprobs=0,
              extra_body={"ignore_eos": True})
    six = cl.completions.create(n=6, **kw)
    mean = {c.text: sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs) for c in six.choices}
    assert len(mean) >= 3, "the samples should differ"
    best = cl.completions.create(n=2, best_of=6, **kw)
    assert [c.text for c in best.choices] == sorted(mean, key=mean.get, reverse=True)[:2]
    assert [c.index for c in best.choices] == [0, 1]
    assert best.usage.completion_tokens == 6 * 8  # every candidate's tokens
    without_logprobs = cl.completions.create(n=2, best_of=6, **{**kw, "logprobs": None})
    assert [c.text for c in without_logprobs.choices] == [c.text for c in best.choices]
    assert all(c.logprobs is None for c in without_logprobs.choices)
    for bad in (dict(n=3, best_of=2), dict(best_of=2, stream=True), dict(best_of=129)):
        with pytest.raises(openai.BadRequestError) as e:
            cl.completions.create(model="", prompt="x", max_tokens=2, **bad)
        assert e.value.body["param"] == "best_of"


def test_beam_search(server):
    # vLLM's use_beam_search: one beam is greedy decoding; n beams come back distinct, ranked by
    # cumulative log-probability / length^length_penalty (the logprobs each beam reports).
    cl = client(server)
    prompt = "The three primary colours are"
    greedy = cl.completions.create(model="", prompt=prompt, max_tokens=12, temperature=0, logprobs=0)
    one = cl.completions.create(model="", prompt=prompt, max_tokens=12, logprobs=0,
                                extra_body={"use_beam_search": True})
    assert one.choices[0].text == greedy.choices[0].text
    assert one.choices[0].logprobs.token_logprobs == pytest.approx(greedy.choices[0].logprobs.token_logprobs,
                                                                   abs=1e-4)
    for penalty in (1.0, 0.0):
        beams = cl.completions.create(model="", prompt=prompt, max_tokens=12, n=4, logprobs=2,
                                      extra_body={"use_beam_search": True, "length_penalty": penalty})
        texts = [c.text for c in beams.choices]
        assert len(set(texts)) == 4, texts

        def score(c):
            lps = c.logprobs.token_logprobs
            # A beam that ended on the stop token (finish "stop") has one token more than its text.
            length = max(1, len(lps) - (1 if c.finish_reason == "stop" else 0))
            return sum(lps) / length ** penalty

        scores = [score(c) for c in beams.choices]
        assert scores == sorted(scores, reverse=True), scores
        assert all(len(c.logprobs.top_logprobs[0]) == 2 for c in beams.choices)
    chat = cl.chat.completions.create(model="", messages=MESSAGES, max_tokens=8, n=2,
                                      extra_body={"use_beam_search": True})
    assert len({c.message.content for c in chat.choices}) == 2
    for bad, param in ((dict(temperature=0.8), "temperature"), (dict(stop=["."]), "stop"),
                       (dict(stream=True), "use_beam_search")):
        with pytest.raises(openai.BadRequestError) as e:
            cl.completions.create(model="", prompt=prompt, max_tokens=4, extra_body={"use_beam_search": True}, **bad)
        assert e.value.body["param"] == param
    with pytest.raises(openai.BadRequestError) as e:
        cl.completions.create(model="", prompt=prompt, max_tokens=4, extra_body={"length_penalty": 0.5})
    assert e.value.body["param"] == "length_penalty"


def test_prediction_drafts_and_changes_nothing(server):
    # OpenAI's predicted outputs: the answer is the one without a prediction; a right prediction
    # has its tokens accepted (usage.completion_tokens_details), a wrong one rejected.
    cl = client(server)
    messages = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    plain = cl.chat.completions.create(model="", messages=messages, max_tokens=48, temperature=0)
    text = plain.choices[0].message.content
    assert plain.usage.completion_tokens_details is None
    right = cl.chat.completions.create(model="", messages=messages, max_tokens=48, temperature=0,
                                       prediction={"type": "content", "content": text})
    assert right.choices[0].message.content == text
    details = right.usage.completion_tokens_details
    assert details.accepted_prediction_tokens >= right.usage.completion_tokens // 2, details
    wrong = cl.chat.completions.create(model="", messages=messages, max_tokens=48, temperature=0,
                                       prediction={"type": "content", "content": "A haiku about the sea, nothing else."})
    assert wrong.choices[0].message.content == text
    streamed = "".join(c.choices[0].delta.content or "" for c in cl.chat.completions.create(
        model="", messages=messages, max_tokens=48, temperature=0, stream=True,
        prediction={"type": "content", "content": text}) if c.choices)
    assert streamed == text
    with pytest.raises(openai.BadRequestError) as e:
        cl.chat.completions.create(model="", messages=messages, max_tokens=4, prediction={"type": "content"})
    assert e.value.body["param"] == "prediction"


def prefix_hits(server):
    import re
    req = urllib.request.Request(server.base + "/metrics", headers={"Authorization": "Bearer " + server.api_key})
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    return float(re.search(r"^inferd:prefix_cache_hits_total(?:\{[^}]*\})? (\S+)$", text, re.M).group(1))


def test_request_id_and_cache_salt(server):
    # vLLM's request_id (or X-Request-Id) names the answer; cache_salt keeps a prompt's cached KV to
    # the requests of the same salt, and changes no answer.
    cl = client(server)
    r = cl.chat.completions.create(model="", messages=MESSAGES, max_tokens=2, extra_body={"request_id": "job-42"})
    assert r.id == "chatcmpl-job-42"
    r = cl.completions.create(model="", prompt="x", max_tokens=2, extra_headers={"X-Request-Id": "trace.7"})
    assert r.id == "cmpl-trace.7"
    with pytest.raises(openai.BadRequestError) as e:
        cl.completions.create(model="", prompt="x", max_tokens=2, extra_headers={"X-Request-Id": "a b"})
    assert e.value.body["param"] == "X-Request-Id"
    prompt = "A long shared context about salted caches. " * 12

    def run(salt):
        before = prefix_hits(server)
        extra = {"cache_salt": salt} if salt else {}
        text = cl.completions.create(model="", prompt=prompt, max_tokens=4, temperature=0, extra_body=extra).choices[0].text
        return prefix_hits(server) - before, text

    hits_a1, text = run("tenant-a-3f9c2e")
    hits_a2, text_a2 = run("tenant-a-3f9c2e")
    hits_b, text_b = run("tenant-b-81d0aa")
    assert hits_a2 >= 64 and hits_b == 0, (hits_a1, hits_a2, hits_b)
    assert text == text_a2 == text_b
