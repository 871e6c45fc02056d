"""The web chat page (GET /) in a real headless Chromium against the real `hotpath serve` of the
server fixture: Debian's chromium driven through its chromedriver by selenium (docs/decisions.md,
Server). The page is a client of the server's own /v1/chat/completions, so its replies are checked
against the openai client's on the same messages (greedy).

Without chromium, chromedriver or selenium the tests skip, except where the environment variable CI
is set (.ci/run sets it): there they fail, so CI never passes without having run the browser."""

from __future__ import annotations

import json
import os
import re
import shutil
import time

import httpx
import pytest
from server_utils import API_KEY

# the flags that run Debian's chromium headless on a bare CI machine, offline
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1280,800")
REPLY_TIMEOUT = 60
STATS = re.compile(r"TTFT (\d+) ms · ([\d.]+) tok/s · (\d+) tokens")


def _missing(what: str) -> None:
    message = (f"the web page tests need {what} (apt-get install -y chromium chromium-driver; "
               "pip install selenium)")
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must run them", pytrace=False)
    pytest.skip(message)


def _metric(server, name: str) -> float:
    """One series of /metrics by its name after the prefix: hotpath_NAME, or vllm:NAME / hotpath:NAME
    (the server's metrics are moving to vLLM's names)."""
    pattern = re.compile(rf"(hotpath_|hotpath:|vllm:){name}(\{{.*)?")
    return next(v for k, v in server.metrics().items() if pattern.fullmatch(k))


@pytest.fixture(scope="session")
def browser_paths() -> tuple[str, str]:
    """chromium's and chromedriver's paths; session-scoped so that pytest checks them before it
    starts the (session-scoped) server, and a skip costs nothing."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        _missing("selenium")
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        _missing("chromium and chromedriver on the PATH")
    return chromium, chromedriver


@pytest.fixture(scope="module")
def driver(browser_paths, tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = browser_paths
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    # a driver path given, selenium never runs Selenium Manager (which would download a browser)
    drv = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))
    yield drv
    drv.quit()


class ChatPage:
    def __init__(self, driver) -> None:
        from selenium.webdriver.common.by import By

        self.driver = driver
        self.by = By

    def el(self, element_id: str):
        return self.driver.find_element(self.by.ID, element_id)

    def wait(self, condition, timeout: float = 10, message: str = ""):
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, timeout, poll_frequency=0.05).until(lambda _: condition(),
                                                                               message)

    def fill(self, element_id: str, value: str) -> None:
        el = self.el(element_id)
        el.clear()
        if value:
            el.send_keys(value)

    def settings(self, system: str = "", temperature: str = "", max_tokens: str = "",
                 extra: str = "") -> None:
        self.fill("system-prompt", system)
        self.fill("temperature", temperature)
        self.fill("max-tokens", max_tokens)
        self.fill("extra", extra)

    def replies(self) -> list:
        return self.driver.find_elements(self.by.CSS_SELECTOR, "#messages .message.assistant")

    def send(self, text: str) -> None:
        before = len(self.replies())
        self.fill("input", text)
        self.el("send").click()
        self.wait(lambda: len(self.replies()) == before + 1, message="no reply element appeared")

    def reply_state(self) -> str:
        return self.replies()[-1].get_attribute("data-state")

    def wait_reply(self, timeout: float = REPLY_TIMEOUT) -> str:
        self.wait(lambda: self.reply_state() != "streaming", timeout, "the reply did not finish")
        return self.reply_state()

    def reply_part(self, selector: str) -> str:
        return self.replies()[-1].find_element(self.by.CSS_SELECTOR, selector).get_property("textContent")

    def new_chat(self) -> None:
        self.el("new-chat").click()
        self.wait(lambda: not self.replies())


@pytest.fixture(scope="module")
def page(browser_paths, driver, server) -> ChatPage:
    """The page opened on the server, its API key entered (the server requires one)."""
    chat = ChatPage(driver)
    driver.get(server.url + "/")
    chat.wait(lambda: "API key" in chat.el("notice").text, message="no notice asked for the API key")
    chat.el("api-key").send_keys(API_KEY + "\t")  # tab out: the change event retries GET /v1/models
    chat.wait(lambda: chat.el("model").text == "tiny", message="the model name did not appear")
    assert not chat.el("notice").is_displayed()
    return chat


def test_page_routes(server):
    page = httpx.get(server.url + "/", timeout=10)  # no API key: the page itself is public
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert '<script src="static/app.js"' in page.text
    for name, kind in (("app.js", "javascript"), ("style.css", "text/css")):
        r = httpx.get(f"{server.url}/static/{name}", timeout=10)
        assert r.status_code == 200 and kind in r.headers["content-type"], name
    missing = httpx.get(server.url + "/static/nothing.js", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_streamed_chat_matches_the_api(page, client, tmp_path):
    page.new_chat()
    page.settings(system="You are terse.", temperature="0", max_tokens="40")
    messages = [{"role": "system", "content": "You are terse."}]
    for text in ("Hello, world!", "Tell me more."):
        page.send(text)
        assert page.el("stop").is_enabled()
        assert page.wait_reply() == "done"
        messages.append({"role": "user", "content": text})
        expected = client.chat.completions.create(model="tiny", messages=messages, temperature=0,
                                                  max_tokens=40)
        content = expected.choices[0].message.content
        assert page.reply_part(".content") == content
        stats = STATS.search(page.reply_part(".stats"))
        assert stats, page.reply_part(".stats")
        assert int(stats.group(3)) == expected.usage.completion_tokens
        assert float(stats.group(2)) > 0
        messages.append({"role": "assistant", "content": content})
    assert not page.replies()[-1].find_elements(page.by.CSS_SELECTOR, ".reasoning")  # none sent
    assert page.el("send").is_enabled() and not page.el("stop").is_enabled()
    shot = tmp_path / "web_chat.png"
    assert page.driver.save_screenshot(str(shot))
    print(f"screenshot: {shot}")


def test_stop_then_new_chat(page, server, client):
    page.new_chat()
    page.settings(temperature="0", max_tokens="400", extra='{"ignore_eos": true}')
    aborted = _metric(server, "request_aborted_total")
    page.send("Write a long story.")
    page.wait(lambda: len(page.reply_part(".content")) > 0, REPLY_TIMEOUT, "no text streamed")
    page.el("stop").click()
    assert page.wait_reply(10) == "stopped"
    assert page.reply_part(".stats").startswith("stopped · TTFT")
    assert page.el("send").is_enabled() and not page.el("stop").is_enabled()
    # the aborted fetch closed the connection, so the server aborted the request at its next step
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if (_metric(server, "request_aborted_total") == aborted + 1
                and _metric(server, "num_requests_running") == 0):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the server did not abort the stopped request: {server.metrics()}")

    page.new_chat()  # the stopped turn is forgotten: the next reply is that of a fresh conversation
    page.settings(temperature="0", max_tokens="24")
    page.send("Hello, world!")
    assert page.wait_reply() == "done"
    expected = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello, world!"}], temperature=0, max_tokens=24)
    assert page.reply_part(".content") == expected.choices[0].message.content


def test_errors_are_shown(page):
    page.new_chat()
    page.settings(max_tokens="100000")
    page.send("Hello")
    assert page.wait_reply() == "error"
    assert "maximum context length" in page.reply_part(".error")  # the server's 400, as it said it
    assert page.el("send").is_enabled()

    page.settings(extra="{not json")
    page.fill("input", "Hello")
    page.el("send").click()
    page.wait(lambda: "not valid JSON" in page.el("notice").text, message="no notice for bad JSON")
    assert len(page.replies()) == 1  # nothing was sent


# A stream the server does not send yet (reasoning comes with the reasoning parser): reasoning deltas,
# then content holding HTML, cut into 7-byte pieces so events and UTF-8 characters split across reads.
_CANNED_FETCH = """
const [events, realFetch] = [arguments[0], window.fetch];
window.fetch = async (url, init) => {
  if (!String(url).endsWith("chat/completions")) return realFetch(url, init);
  window.lastRequest = JSON.parse(init.body);
  const bytes = new TextEncoder().encode(
    events.map((e) => `data: ${JSON.stringify(e)}\\r\\n\\r\\n`).join("") + "data: [DONE]\\r\\n\\r\\n");
  let at = 0;
  const body = new ReadableStream({
    pull(controller) {
      if (at >= bytes.length) return controller.close();
      controller.enqueue(bytes.slice(at, at + 7));
      at += 7;
    },
  });
  return new Response(body, {status: 200, headers: {"Content-Type": "text/event-stream"}});
};
"""


def test_reasoning_collapsible_and_output_never_html(page, server):
    html = 'x <b>bold</b> <img src="nothing" onerror="window.injected = 1"> héllo ✓'

    def chunk(delta=None, finish=None, usage=None):
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
        return {"object": "chat.completion.chunk", "choices": choices, "usage": usage}

    events = [chunk({"role": "assistant", "content": ""}), chunk({"reasoning_content": "Let me "}),
              chunk({"reasoning_content": "think."}), chunk({"content": html[:9]}),
              chunk({"content": html[9:]}), chunk({}, "stop"),
              chunk(usage={"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12})]
    page.new_chat()
    page.settings(temperature="0.5", extra='{"top_k": 5}')
    page.driver.execute_script(_CANNED_FETCH, events)
    try:
        page.send("Think first.")
        assert page.wait_reply() == "done"
        sent = page.driver.execute_script("return window.lastRequest")
        assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
        assert sent["model"] == "tiny" and sent["temperature"] == 0.5 and sent["top_k"] == 5
        assert sent["messages"] == [{"role": "user", "content": "Think first."}]

        reply = page.replies()[-1]
        reasoning = reply.find_element(page.by.CSS_SELECTOR, "details.reasoning")
        assert reasoning.get_property("open") is False  # collapsed once the answer began
        assert page.reply_part(".reasoning-text") == "Let me think."
        reasoning.find_element(page.by.TAG_NAME, "summary").click()
        assert reasoning.get_property("open") is True

        assert page.reply_part(".content") == html
        assert not reply.find_elements(page.by.CSS_SELECTOR, ".content *")  # text, no elements
        assert page.driver.execute_script("return window.injected") is None
        assert "9 tokens" in page.reply_part(".stats")
    finally:
        page.driver.refresh()  # the real fetch back
        page.wait(lambda: page.el("model").text == "tiny", message="the page did not reload")
    assert json.loads(page.el("extra").get_property("value")) == {"top_k": 5}  # settings persist
