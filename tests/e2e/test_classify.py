"""Classification models: /classify and the cross-encoder /score and /rerank. The heads of the tiny
Qwen3 fixtures (a Qwen3ForSequenceClassification checkpoint and a GGUF of pooling type rank, whose
reference logits are transformers' logits of their body) and vLLM's --hf-overrides head made of
SmolLM2's "yes" and "no" rows, checked against the plain model's next-token log-probabilities."""
import json
import math
import os
import subprocess

import pytest

from conftest import BINARY, ROOT, Server
from conftest import post_json as post

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "tiny", "qwen3_classifier")
REFERENCE = json.load(open(os.path.join(FIXTURE, "reference.json")))
# The engine's f32 forward pass against transformers' on the tiny model (logits of magnitude ~2).
TOL = 1.5e-3
YES_NO = json.dumps({"architectures": ["LlamaForSequenceClassification"],
                     "classifier_from_token": ["no", "yes"], "method": "from_2_way_softmax"})


def softmax(v):
    top = max(v)
    e = [math.exp(x - top) for x in v]
    return [x / sum(e) for x in e]


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


@pytest.fixture(scope="module")
def yes_no_server():
    s = Server("--hf-overrides", YES_NO)
    yield s
    s.stop()


def test_classify_gives_the_heads_probabilities_as_transformers(make_server):
    s = make_server("-m", FIXTURE, "--max-model-len", "256")
    prompts = REFERENCE["prompts"]
    status, j = post(s, "/classify", {"input": prompts})
    assert status == 200, j
    assert j["object"] == "list" and j["id"].startswith("classify-")
    assert j["usage"]["prompt_tokens"] == sum(len(p) for p in prompts) == j["usage"]["total_tokens"]
    assert j["usage"]["completion_tokens"] == 0
    status, raw = post(s, "/v1/classify", {"input": prompts, "use_activation": False, "request_id": "r1"})
    assert status == 200, raw
    assert raw["id"] == "classify-r1"
    for i, (want, got, logits) in enumerate(zip(REFERENCE["logits"], j["data"], raw["data"])):
        assert got["index"] == i and got["num_classes"] == 3
        assert max(abs(a - b) for a, b in zip(logits["probs"], want)) < TOL, (logits["probs"], want)
        assert max(abs(a - b) for a, b in zip(got["probs"], softmax(want))) < TOL
        assert abs(sum(got["probs"]) - 1) < 1e-5
        assert got["label"] == REFERENCE["labels"][want.index(max(want))]
    # One prompt alone is what it is in the batch.
    status, one = post(s, "/classify", {"input": prompts[2]})
    assert status == 200, one
    assert max(abs(a - b) for a, b in zip(one["data"][0]["probs"], j["data"][2]["probs"])) < 1e-6
    # Three labels have no relevance score; generation is refused; embeddings are still served.
    status, e = post(s, "/score", {"text_1": "a", "text_2": "b"})
    assert status == 400 and e["error"]["param"] == "model" and "/classify" in e["error"]["message"]
    for path, body in (("/v1/completions", {"prompt": [1, 2], "max_tokens": 2}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/responses", {"input": "hi"})):
        status, e = post(s, path, body)
        assert status == 400, (path, e)
        assert "classification model" in e["error"]["message"], e
    status, emb = post(s, "/v1/embeddings", {"input": [prompts[1]]})
    assert status == 200 and len(emb["data"][0]["embedding"]) == 64
    # Fields /classify does not take are named.
    for body, param in (({"input": [1], "dimensions": 8}, "dimensions"), ({"input": [1], "normalize": False}, "normalize"),
                        ({}, "input"), ({"input": [1], "use_activation": 1}, "use_activation")):
        status, e = post(s, "/classify", body)
        assert status == 400 and e["error"]["param"] == param, (body, e)


def test_a_rank_gguf_scores_with_its_first_label(make_server):
    s = make_server("-m", os.path.join(FIXTURE, "rerank-f32.gguf"), "--max-model-len", "256")
    status, j = post(s, "/classify", {"input": REFERENCE["prompts"]})
    assert status == 200, j
    for want, got in zip(REFERENCE["rerank_logits"], j["data"]):
        assert got["num_classes"] == 2 and got["label"] == ("yes" if want[0] > want[1] else "no")
        assert max(abs(a - b) for a, b in zip(got["probs"], softmax(want))) < TOL
    # Texts need a tokenizer, which the tiny model has not.
    status, e = post(s, "/rerank", {"query": "q", "documents": ["d"]})
    assert status == 400 and e["error"]["param"] == "documents" and "tokenizer" in e["error"]["message"], e


def tokens(server, text, special):
    status, j = post(server, "/tokenize", {"prompt": text, "add_special_tokens": special})
    assert status == 200, j
    return j["tokens"]


def yes_minus_no(server, ids):
    """log p(yes) - log p(no) after `ids`, from the plain model's echoed prompt log-probabilities."""
    lp = []
    for word in ("yes", "no"):
        status, j = post(server, "/v1/completions", {"prompt": ids + tokens(server, word, False), "echo": True,
                                                     "logprobs": 0, "max_tokens": 1})
        assert status == 200, j
        lp.append(j["choices"][0]["logprobs"]["token_logprobs"][len(ids)])
    return lp[0] - lp[1]


QUERY = "Is Paris the capital of France? Answer yes or no:"
DOCS = ["Paris is the capital of France.", "Bananas are yellow.", "The capital of Italy is Rome, not Paris."]


def test_the_yes_no_head_scores_pairs_as_the_lm_would_answer(server, yes_no_server):
    s = yes_no_server
    status, r = post(s, "/rerank", {"query": QUERY, "documents": DOCS})
    assert status == 200, r
    status, raw = post(s, "/v1/score", {"text_1": QUERY, "text_2": DOCS, "use_activation": False})
    assert status == 200, raw
    q = tokens(server, QUERY, True)
    pairs = [q + tokens(server, d, False) for d in DOCS]
    assert r["usage"]["prompt_tokens"] == raw["usage"]["prompt_tokens"] == sum(len(p) for p in pairs)
    by_index = {x["index"]: x for x in r["results"]}
    for i, (pair, item) in enumerate(zip(pairs, raw["data"])):
        # The head's logit is the LM's logit difference (the LM reads its rows through the Q4_1
        # kernel with 8-bit activations, the head through f32 rows: a few hundredths apart).
        assert abs(item["score"] - yes_minus_no(server, pair)) < 0.15, (i, item["score"])
        assert abs(by_index[i]["relevance_score"] - sigmoid(item["score"])) < 1e-5
        assert by_index[i]["document"]["text"] == DOCS[i]
    scores = [x["relevance_score"] for x in r["results"]]
    assert scores == sorted(scores, reverse=True)
    # top_n, return_documents, the /score forms and the vLLM aliases.
    status, top = post(s, "/v2/rerank", {"query": QUERY, "documents": DOCS, "top_n": 1, "return_documents": False})
    assert status == 200 and len(top["results"]) == 1 and "document" not in top["results"][0]
    assert top["results"][0]["index"] == r["results"][0]["index"]
    status, paired = post(s, "/score", {"text_1": [QUERY, QUERY], "text_2": DOCS[:2]})
    assert status == 200
    assert [abs(p["score"] - sigmoid(x["score"])) < 1e-5 for p, x in zip(paired["data"], raw["data"])] == [True, True]
    # truncate_prompt_tokens cuts the longer text of each pair.
    status, cut = post(s, "/score", {"text_1": QUERY, "text_2": DOCS[0], "truncate_prompt_tokens": 12})
    assert status == 200 and cut["usage"]["prompt_tokens"] == 12, cut
    status, e = post(s, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and "classification model" in e["error"]["message"]
    status, c = post(s, "/classify", {"input": [pairs[0]]})
    assert status == 200 and c["data"][0]["label"] == "yes" and c["data"][0]["num_classes"] == 1
    assert abs(c["data"][0]["probs"][0] - sigmoid(raw["data"][0]["score"])) < 1e-5


def test_cosine_scoring_refuses_use_activation(server):
    status, e = post(server, "/score", {"text_1": "a", "text_2": "b", "use_activation": True})
    assert status == 400 and e["error"]["param"] == "use_activation"
    status, e = post(server, "/classify", {"input": "a"})
    assert status == 400 and e["error"]["param"] == "model" and "classification head" in e["error"]["message"]


@pytest.mark.parametrize("overrides,message", [
    ({"classifier_from_token": ["no", "zzz_not_a_token"], "method": "from_2_way_softmax"}, "'zzz_not_a_token' is not a token"),
    ({"classifier_from_token": ["no", "yes"], "method": "softmax"}, "method must be"),
    ({"architectures": ["LlamaForSequenceClassification"]}, "go with classifier_from_token"),
    ({"classifier_from_token": ["a", "b", "c"], "is_original_qwen3_reranker": True}, "exactly two tokens"),
])
def test_bad_classifier_overrides_stop_the_server_with_the_reason(overrides, message):
    p = subprocess.run([BINARY, "serve", "--port", "0", "-t", "2", "--kv-cache-memory", "64MiB",
                        "--hf-overrides", json.dumps(overrides)], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert message in p.stderr, p.stderr
