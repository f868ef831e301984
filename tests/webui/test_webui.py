"""The chat page at `/`, driven in headless Chromium (Playwright) against the
real `ferrum serve` with SmolLM2.

FERRUM_CHROMIUM names the browser (default: chromium on PATH, Debian's
package); without one these tests skip with a message saying what to
install. Screenshots go to FERRUM_ARTIFACTS (default target/webui-artifacts).
"""
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("FERRUM_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("FERRUM_ARTIFACTS", ROOT / "target/webui-artifacts"))
# Headless, and nothing that reaches past loopback (the machine has no
# network; Chromium's background services would only fail and retry).
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]
# Generation runs on a 2-core CI machine: allow for a slow answer.
ANSWER_MS = 120_000


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: `apt-get install chromium` (or set FERRUM_CHROMIUM) "
                    "to run the browser tests")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


class Page:
    """A fresh browser profile on the chat page, recording every alert
    and script error (there must be none)."""

    def __init__(self, browser, server, **context):
        self.server = server
        self.context = browser.new_context(**context)
        self.page = self.context.new_page()
        self.dialogs, self.errors = [], []
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(server.url + "/")

    def settings(self, **fields):
        self.page.click("#settings-open")
        for name, value in fields.items():
            self.page.fill(f"#set-{name.replace('_', '-')}", str(value))
        self.page.click("#settings-save")
        expect(self.page.locator("#settings")).not_to_be_visible()

    def ask(self, text):
        self.page.fill("#input", text)
        self.page.press("#input", "Enter")

    def last_answer(self):
        return self.page.locator(".msg.assistant").last

    def wait_answered(self):
        """Waits until the last answer ends (its stats line appears)."""
        expect(self.last_answer().locator(".stats")).to_contain_text("tok", timeout=ANSWER_MS)
        expect(self.page.locator("#send")).to_be_visible()

    def screenshot(self, name):
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / name
        self.page.screenshot(path=str(path), full_page=True)
        print(f"screenshot: {path}")

    def close(self):
        assert not self.errors, f"script errors on the page: {self.errors}"
        assert not self.dialogs, f"the page opened dialogs: {self.dialogs}"
        self.context.close()


@pytest.fixture
def chat(browser, chat_server):
    p = Page(browser, chat_server, viewport={"width": 1200, "height": 800})
    yield p
    p.close()


def wait_idle(server, timeout=30):
    """Until the server runs and queues nothing; returns whether it did."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.metric("ferrum_requests_running") == 0 and server.metric("ferrum_requests_pending") == 0:
            return True
        time.sleep(0.2)
    return False


def test_chat_streams_stops_and_persists(chat):
    page = chat.page
    expect(page.locator("#model-name")).to_have_text("smollm2")
    expect(page.locator("#model-ctx")).to_contain_text("tokens of context")

    # A streamed answer, rendered, with its speed.
    chat.settings(temperature=0, max_tokens=24)
    chat.ask("What is the capital of France?")
    chat.wait_answered()
    answer = chat.last_answer()
    assert answer.locator(".body").inner_text().strip(), "the answer is empty"
    assert answer.locator(".body > *").count() >= 1, "the answer was not rendered into elements"
    assert "tok/s" in answer.locator(".stats").inner_text()
    chat.screenshot("chat.png")

    # Stop a long answer: the page keeps what came, the server frees the sequence.
    chat.settings(max_tokens=3000)
    chat.ask("Count from 1 to 1000, separated by commas.")
    long_answer = chat.last_answer()
    expect(long_answer.locator(".body")).not_to_be_empty(timeout=ANSWER_MS)
    page.click("#stop")
    expect(long_answer.locator(".stats")).to_contain_text("stopped")
    expect(page.locator("#send")).to_be_visible()
    assert wait_idle(chat.server), "the server still runs or queues a request after stop"
    assert chat.server.metric("ferrum_kv_caches_live") == 0
    kept = long_answer.locator(".body").inner_text()
    assert kept.strip(), "the stopped answer lost its text"

    # A reload shows the same conversation from the browser's storage.
    page.reload()
    expect(page.locator("#conversations li")).to_have_count(1)
    expect(page.locator("#conversations li.current")).to_contain_text("What is the capital of France?")
    expect(page.locator(".msg.user")).to_have_count(2)
    expect(page.locator(".msg.assistant").last.locator(".body")).to_have_text(kept)


def test_new_and_delete_conversations(chat):
    page = chat.page
    chat.settings(temperature=0, max_tokens=4)
    chat.ask("Hello")
    chat.wait_answered()
    page.click("#new-chat")
    expect(page.locator(".msg")).to_have_count(0)
    chat.ask("Name a colour")
    chat.wait_answered()
    expect(page.locator("#conversations li")).to_have_count(2)
    page.click("#conversations li.current .delete")
    expect(page.locator("#conversations li")).to_have_count(1)
    expect(page.locator("#conversations li.current")).to_contain_text("Hello")
    page.reload()
    expect(page.locator("#conversations li")).to_have_count(1)


def test_hostile_text_renders_as_text(chat):
    page = chat.page
    attack = "<img src=x onerror=alert(1)>"
    chat.settings(temperature=0, max_tokens=16)
    chat.ask(attack)
    chat.wait_answered()
    expect(page.locator(".msg.user .body")).to_have_text(attack)
    assert page.locator("#messages img, #messages script, #messages iframe").count() == 0

    # The Markdown renderer on its own: structure from marks, text from text.
    html = page.evaluate("""() => {
        const d = document.createElement('div');
        d.append(renderMarkdown([
            '# Title', '', '**bold**, *it* and `a<b>` <b>raw</b>', '',
            '```js', 'let s = "<script>alert(1)</script>";', '```', '',
            '- one', '- two', '', '1. first', '2. second', '',
            '> quoted', '', '[bad](javascript:alert(1)) [good](https://example.com/x)',
        ].join('\\n')));
        return d.innerHTML;
    }""")
    for part in ["<h3>Title</h3>", "<strong>bold</strong>", "<em>it</em>", "<code>a&lt;b&gt;</code>",
                 "&lt;b&gt;raw&lt;/b&gt;", "&lt;script&gt;alert(1)&lt;/script&gt;", "<li>one</li><li>two</li>",
                 "<ol start=\"1\"><li>first</li><li>second</li></ol>", "<blockquote><p>quoted</p></blockquote>",
                 'href="https://example.com/x"']:
        assert part in html, f"{part!r} not in {html}"
    assert "javascript:" not in html.replace("[bad](javascript:alert(1))", ""), html
    assert "<script" not in html and "<b>" not in html, html
    # An unclosed fence (a code block mid-stream) is still a code block.
    assert page.evaluate("() => renderMarkdown('```py\\nx = 1').firstChild.className") == "codeblock"
    # 3000 nested quotes (a reply that crashed the tab, and again on every
    # load once stored) render 16 deep, the rest as text.
    depth = page.evaluate("""() => {
        const d = document.createElement('div');
        d.append(renderMarkdown('> '.repeat(3000) + 'deep'));
        let n = 0, e = d;
        while ((e = e.querySelector(':scope > blockquote'))) n++;
        return [n, d.textContent.endsWith('deep')];
    }""")
    assert depth == [17, True], depth


def test_phone_width_and_themes(browser, chat_server):
    p = Page(browser, chat_server, viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page = p.page
    try:
        expect(page.locator("#model-name")).to_have_text("smollm2")
        sidebar = page.locator("#sidebar")
        assert sidebar.bounding_box()["x"] + sidebar.bounding_box()["width"] <= 0, "the list covers the chat"
        expect(page.locator("#input")).to_be_visible()
        expect(page.locator("#send")).to_be_in_viewport()
        page.click("#menu")
        page.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().x >= 0")
        page.click("#scrim", position={"x": 370, "y": 400})
        page.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().right <= 0")

        background = "getComputedStyle(document.body).backgroundColor"
        themes = {}
        for _ in range(3):
            page.click("#theme")
            theme = page.evaluate("document.documentElement.dataset.theme")
            themes[theme] = page.evaluate(background)
        assert set(themes) == {"auto", "light", "dark"}, themes
        assert themes["light"] != themes["dark"], themes
        page.reload()
        assert page.evaluate("document.documentElement.dataset.theme") == theme, "the theme was not kept"
        p.screenshot("phone.png")
    finally:
        p.close()


def test_api_key_is_asked_for_and_sent(browser, keyed_server):
    p = Page(browser, keyed_server, viewport={"width": 1000, "height": 700})
    page = p.page
    try:
        expect(page.locator("#settings")).to_be_visible()
        expect(page.locator("#settings-notice")).to_contain_text("API key")
        page.fill("#set-api-key", "sekret")
        page.fill("#set-max-tokens", "4")
        page.click("#settings-save")
        expect(page.locator("#model-name")).to_have_text("smollm2")
        p.ask("Hi")
        p.wait_answered()
        expect(p.last_answer().locator(".stats")).not_to_contain_text("Error")
    finally:
        p.close()


def test_page_is_served_with_a_strict_policy(chat_server):
    with urllib.request.urlopen(chat_server.url + "/") as r:
        csp = r.headers["Content-Security-Policy"]
        assert r.headers["Content-Type"].startswith("text/html")
    assert "script-src 'self'" in csp and "default-src 'none'" in csp, csp
    # `serve` said where the page is.
    log = Path(chat_server.log.name).read_text()
    assert f"  chat page   {chat_server.url}/\n  OpenAI API  {chat_server.url}/v1\n" in log, log


def test_no_webui_leaves_only_the_api(no_webui_server):
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(no_webui_server.url + "/")
    assert e.value.code == 404
    assert json.loads(e.value.read())["error"]["message"] == "no such endpoint"
    with urllib.request.urlopen(no_webui_server.url + "/v1/models") as r:
        assert json.loads(r.read())["data"][0]["id"] == "smollm2"
    log = Path(no_webui_server.log.name).read_text()
    assert f"ferrum serve\n  OpenAI API  {no_webui_server.url}/v1\n" in log, log
