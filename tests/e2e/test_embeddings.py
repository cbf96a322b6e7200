"""/v1/embeddings through the official openai client and raw HTTP: pooled final hidden states,
base64 and float encodings, the chat form, truncation, batching with generations, and the errors
that name their field."""
import base64
import json
import math
import struct
import threading
import urllib.request

import openai
import pytest

from conftest import post_json as post


def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key=server.api_key or "none", max_retries=0, timeout=120)


def embed(server, **body):
    status, j = post(server, "/v1/embeddings", body)
    assert status == 200, j
    return [d["embedding"] for d in sorted(j["data"], key=lambda d: d["index"])], j


def norm(v):
    return math.sqrt(sum(x * x for x in v))


def close(a, b, tol=1e-5):
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) <= tol


def test_openai_client_gets_normalized_embeddings_in_input_order(server):
    cl = client(server)
    texts = ["The cat sat on the mat.", "Quarterly revenue grew by four percent.", "hello"]
    # The client asks for base64 unless told otherwise; both encodings carry the same floats.
    got = cl.embeddings.create(model="", input=texts)
    floats = cl.embeddings.create(model="", input=texts, encoding_format="float")
    assert [d.index for d in got.data] == [0, 1, 2]
    assert got.usage.prompt_tokens == got.usage.total_tokens > 3
    for a, b in zip(got.data, floats.data):
        assert len(a.embedding) == 576  # SmolLM2-135M's hidden size
        assert abs(norm(a.embedding) - 1) < 1e-5
        assert close(a.embedding, b.embedding, 0)
    # Each alone is what it is in the batch (the kernels are batch-invariant).
    for i, text in enumerate(texts):
        alone = cl.embeddings.create(model="", input=text, encoding_format="float").data[0].embedding
        assert close(alone, floats.data[i].embedding)
    # Different texts, different directions.
    dot = sum(x * y for x, y in zip(floats.data[0].embedding, floats.data[1].embedding))
    assert dot < 0.999


def test_base64_is_little_endian_float32(server):
    [as_float], _ = embed(server, input="base64 check", encoding_format="float")
    _, j = post(server, "/v1/embeddings", {"input": "base64 check", "encoding_format": "base64"})
    raw = base64.b64decode(j["data"][0]["embedding"])
    assert len(raw) == 4 * len(as_float)
    assert list(struct.unpack("<%df" % len(as_float), raw)) == pytest.approx(as_float, abs=0)


def test_token_ids_truncation_and_normalize(server):
    text = "One two three four five six seven eight nine ten."
    _, tok = post(server, "/tokenize", {"prompt": text})
    ids = tok["tokens"]
    [by_text], _ = embed(server, input=text)
    [by_ids], _ = embed(server, input=ids)
    assert close(by_text, by_ids)
    [truncated], j = embed(server, input=text, truncate_prompt_tokens=4)
    [last_four], _ = embed(server, input=ids[-4:])
    assert close(truncated, last_four)
    assert j["usage"]["prompt_tokens"] == 4
    [raw], _ = embed(server, input=ids, normalize=False)
    assert abs(norm(raw) - 1) > 1e-3
    assert close([x / norm(raw) for x in raw], by_ids)


def test_messages_embed_the_rendered_conversation(server):
    messages = [{"role": "user", "content": "What is a mole in chemistry?"}]
    _, tok = post(server, "/tokenize", {"messages": messages, "add_generation_prompt": False})
    [chat], j = embed(server, messages=messages)
    [by_ids], _ = embed(server, input=tok["tokens"])
    assert close(chat, by_ids)
    assert j["usage"]["prompt_tokens"] == len(tok["tokens"])


def test_generations_keep_their_tokens_while_embeddings_run(server):
    cl = client(server)
    prompt = "List the planets of the solar system:"
    alone = cl.completions.create(model="", prompt=prompt, max_tokens=24, temperature=0).choices[0].text
    results = []

    def embed_many():
        for k in range(6):
            results.append(embed(server, input=["text number %d " % k * 20, "short"])[0])

    threads = [threading.Thread(target=embed_many) for _ in range(2)]
    for t in threads:
        t.start()
    together = cl.completions.create(model="", prompt=prompt, max_tokens=24, temperature=0).choices[0].text
    for t in threads:
        t.join()
    assert together == alone
    assert len(results) == 12 and all(len(r) == 2 for r in results)


def test_errors_name_their_field(server):
    cases = [({"input": "x", "dimensions": 8}, 400, "dimensions"),
             ({"input": ""}, 400, "input"),
             ({"input": []}, 400, "input"),
             ({}, 400, "input"),
             ({"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
             ({"input": "x", "logprobs": True}, 400, "logprobs"),
             ({"input": "x", "messages": [{"role": "user", "content": "y"}]}, 400, "input"),
             ({"input": "x", "add_generation_prompt": True}, 400, "add_generation_prompt"),
             ({"input": [10 ** 9]}, 400, "input"),
             ({"input": "word " * 3000}, 400, "input"),
             ({"input": "x", "model": "no-such-model"}, 404, "model")]
    for body, status, param in cases:
        got, j = post(server, "/v1/embeddings", body)
        assert got == status, (body, j)
        assert j["error"]["param"] == param, (body, j)
    # A dimensions equal to the model's size is no change.
    [full], _ = embed(server, input="x", dimensions=576)
    assert len(full) == 576


def test_mean_pooling_server(make_server):
    mean = make_server("--pooling", "mean")
    text = "Mean pooling averages every token's final hidden state."
    [m], _ = embed(mean, input=text)
    [m_raw], _ = embed(mean, input=text, normalize=False)
    assert abs(norm(m) - 1) < 1e-5 and close([x / norm(m_raw) for x in m_raw], m)
    # One token: the mean, the last and the first are the same row.
    last = make_server("--pooling", "last")
    [one_mean], _ = embed(mean, input=[42])
    [one_last], _ = embed(last, input=[42])
    assert close(one_mean, one_last)
    [l], _ = embed(last, input=text)
    assert not close(l, m, 1e-3)


def test_score_and_rerank_are_cosine_similarities_of_the_embeddings(server):
    query = "Where do llamas live?"
    docs = ["Llamas live in the Andes of South America.", "The stock market fell today.",
            "Pandas live in the bamboo forests of China."]
    vectors, _ = embed(server, input=[query] + docs)
    want = [sum(a * b for a, b in zip(vectors[0], v)) for v in vectors[1:]]
    status, j = post(server, "/score", {"text_1": query, "text_2": docs})
    assert status == 200, j
    assert [d["index"] for d in j["data"]] == [0, 1, 2]
    assert [d["score"] for d in j["data"]] == pytest.approx(want, abs=1e-5)
    status, pairs = post(server, "/v1/score", {"text_1": [query, docs[0]], "text_2": [docs[0], docs[0]]})
    assert status == 200 and pairs["data"][1]["score"] == pytest.approx(1.0, abs=1e-5)
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        status, r = post(server, path, {"query": query, "documents": docs, "top_n": 2})
        assert status == 200, r
        order = sorted(range(3), key=lambda k: -want[k])[:2]
        assert [x["index"] for x in r["results"]] == order
        assert [x["relevance_score"] for x in r["results"]] == pytest.approx([want[k] for k in order], abs=1e-5)
        assert r["results"][0]["document"]["text"] == docs[order[0]]
        assert r["usage"]["total_tokens"] > 0
    status, r = post(server, "/rerank", {"query": query, "documents": docs, "return_documents": False})
    assert status == 200 and len(r["results"]) == 3 and "document" not in r["results"][0]
    for path, body, param in [("/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_1"),
                              ("/score", {"text_1": "a", "text_2": [""]}, "text_2"),
                              ("/rerank", {"query": "a", "documents": "b"}, "documents"),
                              ("/rerank", {"query": "a", "documents": ["b"], "top_n": "2"}, "top_n")]:
        status, j = post(server, path, body)
        assert status == 400 and j["error"]["param"] == param, (path, body, j)


def test_pooling_comes_from_a_sentence_transformers_directory(make_server, tmp_path):
    """A Hugging Face directory's 1_Pooling/config.json picks the pooling (as vLLM reads it); the
    flag overrides it. The tiny Qwen3 fixture has no tokenizer: inputs are token ids."""
    import os
    import shutil
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    model = tmp_path / "qwen3_mean"
    shutil.copytree(os.path.join(root, "fixtures", "tiny", "qwen3"), model,
                    ignore=shutil.ignore_patterns("*.gguf", "*.f32", "reference.json"))
    (model / "1_Pooling").mkdir()
    (model / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
         "pooling_mode_lasttoken": False}))
    ids = [[3, 17, 42, 99, 5, 8, 200, 31]]
    by_dir = make_server("-m", str(model), api_key=None)
    mean = make_server("-m", str(model), "--pooling", "mean", api_key=None)
    last = make_server("-m", str(model), "--pooling", "last", api_key=None)
    got = {}
    for name, s in (("dir", by_dir), ("mean", mean), ("last", last)):
        s.api_key = ""
        req = urllib.request.Request(s.base + "/v1/embeddings", data=json.dumps({"input": ids}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            got[name] = json.loads(r.read())["data"][0]["embedding"]
    assert close(got["dir"], got["mean"])
    assert not close(got["dir"], got["last"], 1e-3)


def test_matryoshka_dimensions_need_a_matryoshka_model(make_server):
    import subprocess
    from conftest import BINARY
    any_size = make_server("--hf-overrides", '{"is_matryoshka": true}')
    [full], _ = embed(any_size, input="Matryoshka embeddings nest.", encoding_format="float")
    [short], j = embed(any_size, input="Matryoshka embeddings nest.", dimensions=64)
    assert len(short) == 64 and abs(norm(short) - 1) < 1e-5
    head = full[:64]
    assert close(short, [x / norm(head) for x in head])
    [raw_short], _ = embed(any_size, input="Matryoshka embeddings nest.", dimensions=64, normalize=False)
    [raw_full], _ = embed(any_size, input="Matryoshka embeddings nest.", normalize=False)
    assert close(raw_short, raw_full[:64])
    status, e = post(any_size, "/v1/embeddings", {"input": "x", "dimensions": 577})
    assert status == 400 and e["error"]["param"] == "dimensions"
    listed = make_server("--hf-overrides", '{"matryoshka_dimensions": [64, 128]}')
    assert len(embed(listed, input="x", dimensions=128)[0][0]) == 128
    status, e = post(listed, "/v1/embeddings", {"input": "x", "dimensions": 100})
    assert status == 400 and "(64, 128)" in e["error"]["message"]
    # An override inferd does not implement stops the server at start, naming it.
    p = subprocess.run([BINARY, "serve", "--port", "0", "--hf-overrides", '{"rope_theta": 1}'],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "rope_theta" in p.stderr


def test_more_inputs_than_the_server_ever_queues_is_400_not_429(make_server):
    small = make_server("--max-queue", "4")
    status, j = post(small, "/v1/embeddings", {"input": ["a", "b", "c", "d", "e"]})
    assert status == 400 and j["error"]["param"] == "input", j
    [four], _ = embed(small, input="a")
    assert len(four) == 576
