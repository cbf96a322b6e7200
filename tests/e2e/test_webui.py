"""The web chat UI (`inferd serve` at /) in a real browser: headless Chromium (Debian's chromium and
chromium-driver) driven through Selenium. The page asks for the API key, streams an answer equal
to the API's for the same request (greedy) with its TTFT and tokens/s, stops an answer mid-stream
(the server aborts it and frees its KV), keeps the conversation across a reload, and shows the
server's figures. INFERD_WEBUI_SCREENSHOTS=DIR saves the screenshots of docs/webui/ there."""
import json
import os
import shutil
import time

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from conftest import API_KEY, require
from test_server import metric_value, metrics, raw


@pytest.fixture
def browser(tmp_path_factory):
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    require(chromium is not None and driver_path is not None, "Debian's chromium and chromium-driver")
    options = Options()
    options.binary_location = chromium
    for arg in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,860"]:
        options.add_argument(arg)
    log = tmp_path_factory.mktemp("chromedriver") / "chromedriver.log"
    try:
        driver = webdriver.Chrome(service=Service(driver_path, log_output=str(log)), options=options)
    except Exception as e:  # say why: chromedriver's own log
        raise RuntimeError(f"chromedriver did not start: {e}\n{log.read_text() if log.exists() else ''}") from e
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(driver, tmp_path, name):
    driver.save_screenshot(str(tmp_path / name))
    out = os.environ.get("INFERD_WEBUI_SCREENSHOTS")
    if out:
        os.makedirs(out, exist_ok=True)
        driver.save_screenshot(os.path.join(out, name))


def aborted(server):
    """inferd:request_success_total{finished_reason="abort"}: requests ended by an abort."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics(server).splitlines()
               if line.startswith("inferd:request_success_total{") and 'finished_reason="abort"' in line)


def set_field(driver, field_id, value):
    el = driver.find_element(By.ID, field_id)
    el.clear()
    el.send_keys(str(value))
    el.send_keys(Keys.TAB)  # "change" fires: the page saves its settings


def answers(driver):
    return driver.find_elements(By.CSS_SELECTOR, ".message.assistant")


def wait_answer_done(driver, timeout=120):
    WebDriverWait(driver, timeout).until(lambda d: d.find_element(By.ID, "send").is_displayed())
    return answers(driver)[-1]


def test_chat_streams_stops_and_keeps_history(make_server, browser, tmp_path):
    server = make_server("--max-model-len", "2048")
    browser.get(server.base + "/")
    assert browser.title == "inferd"
    assert browser.find_element(By.ID, "chat-view").is_displayed()
    assert not browser.find_element(By.ID, "server-view").is_displayed()
    # Without the key the page says what is missing; with it, it finds the model.
    WebDriverWait(browser, 10).until(lambda d: "API key" in d.find_element(By.ID, "error").text)
    set_field(browser, "api-key", API_KEY)
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "model-name").text != "")
    model = browser.find_element(By.ID, "model-name").text

    # A greedy answer, streamed: the same text as the API gives for the same request.
    set_field(browser, "temperature", 0)
    set_field(browser, "max-tokens", 24)
    set_field(browser, "system-prompt", "You are a helpful assistant.")
    prompt = browser.find_element(By.ID, "prompt")
    prompt.send_keys("What is the capital of France?")
    prompt.send_keys(Keys.ENTER)
    answer = wait_answer_done(browser)
    text = answer.find_element(By.CLASS_NAME, "content").text
    stats = answer.find_element(By.CLASS_NAME, "stats").text
    status, _, data = raw(server, "POST", "/v1/chat/completions", {
        "model": model, "max_tokens": 24, "temperature": 0, "top_p": 0.95,
        "messages": [{"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": "What is the capital of France?"}]})
    assert status == 200
    want = json.loads(data)
    assert text == want["choices"][0]["message"]["content"].strip()
    tokens = want["usage"]["completion_tokens"]
    assert text and "TTFT" in stats and f"{tokens} tokens" in stats, stats
    assert tokens < 2 or "tokens/s" in stats, stats
    screenshot(browser, tmp_path, "chat.png")

    # Stop mid-stream: the browser aborts the fetch, the server aborts the request and frees its KV.
    set_field(browser, "max-tokens", 1500)
    aborted_before = aborted(server)
    stopped = False
    for attempt in range(3):  # a story that ends by itself before the click is retried
        prompt.send_keys(f"Write a very long story about a dragon and a lighthouse, part {attempt + 1}.")
        prompt.send_keys(Keys.ENTER)
        WebDriverWait(browser, 60).until(
            lambda d: len(answers(d)[-1].find_element(By.CLASS_NAME, "content").text) > 20
            or d.find_element(By.ID, "send").is_displayed())
        if browser.find_element(By.ID, "stop").is_displayed():
            browser.find_element(By.ID, "stop").click()
        answer = wait_answer_done(browser, timeout=30)
        stats = answer.find_element(By.CLASS_NAME, "stats").text
        if "stopped" in stats:
            assert "TTFT" in stats and "≈" in stats, stats  # no usage after a stop: counted chunks
            stopped = True
            break
    assert stopped, "every story ended before the stop button was pressed"
    deadline = time.time() + 10
    while True:
        m = metrics(server)
        if (metric_value(m, "inferd:num_requests_running") == 0 and metric_value(m, "inferd:kv_cache_usage_perc") == 0
                and aborted(server) == aborted_before + 1):
            break
        assert time.time() < deadline, "the stopped request still holds the server: " + m
        time.sleep(0.1)

    # The conversation survives a reload (localStorage), and so do the settings.
    count = len(browser.find_elements(By.CSS_SELECTOR, ".message"))
    browser.refresh()
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#conversations li"))
    assert len(browser.find_elements(By.CSS_SELECTOR, "#conversations li")) == 1
    assert len(browser.find_elements(By.CSS_SELECTOR, ".message")) == count
    assert browser.find_element(By.ID, "api-key").get_attribute("value") == API_KEY

    # The server's figures.
    browser.find_element(By.ID, "tab-server").click()
    assert not browser.find_element(By.ID, "chat-view").is_displayed()
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "fig-running").text == "0")
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "fig-kv").text.endswith("%"))
    assert float(browser.find_element(By.ID, "fig-finished").text) >= 2
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "fig-tps").text not in ("–", ""))
    screenshot(browser, tmp_path, "server.png")


# ChatML, as SmolLM2's template, whose generation prompt opens a <think> block: with
# --reasoning-parser deepseek_r1 what the model writes is reasoning until it closes the block.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


def test_reasoning_is_shown_folded(make_server, browser, tmp_path):
    template = tmp_path / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    server = make_server("--reasoning-parser", "deepseek_r1", "--chat-template", str(template), api_key="")
    browser.get(server.base + "/")
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "model-name").text != "")
    set_field(browser, "temperature", 0)
    set_field(browser, "max-tokens", 16)
    prompt = browser.find_element(By.ID, "prompt")
    prompt.send_keys("Is 17 a prime number?")
    prompt.send_keys(Keys.ENTER)
    answer = wait_answer_done(browser)
    details = answer.find_element(By.CSS_SELECTOR, "details.reasoning")
    assert details.is_displayed() and details.get_attribute("open") is None  # folded
    hidden_text = details.find_element(By.CSS_SELECTOR, "div").get_attribute("textContent")
    status, _, data = raw(server, "POST", "/v1/chat/completions", {
        "model": "", "max_tokens": 16, "temperature": 0, "top_p": 0.95,
        "messages": [{"role": "user", "content": "Is 17 a prime number?"}]}, key=False)
    message = json.loads(data)["choices"][0]["message"]
    assert status == 200 and message["reasoning_content"]
    assert hidden_text == message["reasoning_content"]
    assert answer.find_element(By.CLASS_NAME, "content").get_attribute("textContent") == (message["content"] or "")
    details.find_element(By.TAG_NAME, "summary").click()  # unfolds
    assert details.get_attribute("open") is not None
    screenshot(browser, tmp_path, "reasoning.png")


def test_webui_files_and_their_absence(make_server):
    on = make_server()
    status, headers, body = raw(on, "GET", "/", key=False)  # the page itself needs no key
    assert status == 200 and headers["Content-Type"].startswith("text/html") and b"/webui/app.js" in body
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    for path, kind in [("/webui/app.js", "text/javascript"), ("/webui/style.css", "text/css"), ("/index.html", "text/html")]:
        status, headers, _ = raw(on, "GET", path, key=False)
        assert status == 200 and headers["Content-Type"].startswith(kind), path
    assert raw(on, "GET", "/webui/missing.js")[0] == 404
    assert raw(on, "POST", "/", body={})[0] == 405
    off = make_server("--no-webui")
    assert raw(off, "GET", "/", key=False)[0] == 401
    assert raw(off, "GET", "/")[0] == 404
