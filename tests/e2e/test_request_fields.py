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
        cl.completions.create(model="", prompt="x", max_tokens=1, echo=True, logprobs=1)
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
