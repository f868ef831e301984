"""The chat page's message actions, per-chat settings, chats as files, Markdown tables and task
lists, the server-down banner, context overflow, keyboard-only use and 200% zoom, in headless
Chromium against the real `ferrum serve` (see test_webui.py)."""
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import expect

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import BIN, free_port  # noqa: E402
from test_webui import ANSWER_MS, Page, browser, chat  # noqa: E402,F401


def answers(page):
    return page.locator(".msg.assistant")


def test_copy_regenerate_edit_continue_and_delete(chat):
    page = chat.page
    chat.context.grant_permissions(["clipboard-read", "clipboard-write"])
    chat.settings(temperature=0, max_tokens=12)
    chat.ask("What is the capital of France?")
    chat.wait_answered()
    first = chat.last_answer().locator(".body").inner_text()

    copy = chat.last_answer().get_by_role("button", name="Copy message")
    copy.click()
    expect(copy).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == first

    # Greedy: the regenerated answer is the same, and it replaces the old one.
    chat.last_answer().get_by_role("button", name="Regenerate answer").click()
    chat.wait_answered()
    expect(answers(page)).to_have_count(1)
    assert chat.last_answer().locator(".body").inner_text() == first

    # Edit the question: what came after it goes, and the new one is answered.
    page.locator(".msg.user").get_by_role("button", name="Edit and resend").click()
    page.fill(".msg.user .edit textarea", "Count from 1 to 30, separated by commas.")
    page.press(".msg.user .edit textarea", "Enter")
    chat.wait_answered()
    expect(page.locator(".msg.user .body")).to_have_text("Count from 1 to 30, separated by commas.")
    expect(answers(page)).to_have_count(1)
    cut = chat.last_answer()
    expect(cut.locator(".stats")).to_contain_text("hit the token limit")
    raw = "() => currentConv().messages[1].content"
    before = page.evaluate(raw)

    # Continue the cut answer: it grows from where it stopped.
    cut.get_by_role("button", name="Continue answer").click()
    chat.wait_answered()
    after = page.evaluate(raw)
    assert after.startswith(before) and len(after) > len(before), (before, after)
    expect(answers(page)).to_have_count(1)

    chat.last_answer().get_by_role("button", name="Delete message").click()
    expect(answers(page)).to_have_count(0)
    expect(page.locator(".msg.user")).to_have_count(1)
    page.reload()
    expect(page.locator(".msg")).to_have_count(1)


def test_copy_works_without_the_clipboard_api(browser, chat_server):
    """Plain http on a LAN address has no navigator.clipboard: the fallback copies."""
    p = Page(browser, chat_server, viewport={"width": 1000, "height": 700})
    try:
        page = p.page
        page.add_init_script("Object.defineProperty(navigator, 'clipboard', {value: undefined})")
        page.reload()
        p.settings(temperature=0, max_tokens=4)
        p.ask("Hi")
        p.wait_answered()
        copy = p.last_answer().get_by_role("button", name="Copy message")
        copy.click()
        expect(copy).to_have_text("Copied")
    finally:
        p.close()


def test_settings_are_per_chat_and_chats_travel_as_files(chat, tmp_path):
    page = chat.page
    chat.settings(temperature=0, max_tokens=4, system="Answer in French.", seed=7, top_k=5)
    chat.ask("Hello")
    chat.wait_answered()
    page.click("#new-chat")
    chat.ask("Hi")
    chat.wait_answered()
    chat.settings(system="Answer in German.", min_p=0.2, repeat_penalty=1.1)
    # Back in the first chat, its own settings are shown.
    page.locator("#conversations li", has_text="Hello").locator(".open").click()
    page.click("#settings-open")
    expect(page.locator("#set-system")).to_have_value("Answer in French.")
    expect(page.locator("#set-seed")).to_have_value("7")
    expect(page.locator("#set-top-k")).to_have_value("5")
    expect(page.locator("#set-min-p")).to_have_value("0.05")
    page.fill("#set-top-k", "-1")
    page.click("#settings-save")
    expect(page.locator("#settings-error")).to_contain_text("Top-k must be a whole number")
    page.click("#settings-cancel")

    # Rename inline.
    page.locator("#conversations li.current").get_by_role("button", name="Rename conversation Hello").click()
    page.fill("#conversations .rename-input", "French chat")
    page.press("#conversations .rename-input", "Enter")
    expect(page.locator("#conversations li.current")).to_contain_text("French chat")

    with page.expect_download() as dl:
        page.click("#export-chat")
    path = tmp_path / "chat.json"
    dl.value.save_as(path)
    data = json.loads(path.read_text())
    assert data["format"] == "ferrum-chat" and len(data["conversations"]) == 1
    conv = data["conversations"][0]
    assert conv["title"] == "French chat" and conv["settings"]["system"] == "Answer in French."
    assert [m["role"] for m in conv["messages"]] == ["user", "assistant"]

    page.set_input_files("#import-file", str(path))
    expect(page.locator("#conversations li")).to_have_count(3)
    expect(page.locator("#conversations li.current")).to_contain_text("French chat")
    expect(page.locator(".msg")).to_have_count(2)
    bad = tmp_path / "bad.json"
    bad.write_text('{"messages": [{"role": "wizard", "content": 1}]}')
    page.set_input_files("#import-file", str(bad))
    expect(page.locator("#import-error")).to_contain_text("bad.json is not a Ferrum chat export")
    expect(page.locator("#conversations li")).to_have_count(3)


def test_tables_strikethrough_and_task_lists(chat):
    html = chat.page.evaluate("""() => {
        const d = document.createElement('div');
        d.append(renderMarkdown([
            'Intro', '| a | b <i>x</i> | c |', '|:--|:-:|--:|', '| 1 | **2** | 3 \\\\| 4 |', '',
            '~~gone~~ and kept', '', '- [x] done', '- [ ] todo',
        ].join('\\n')));
        return d.innerHTML;
    }""")
    for part in ["<p>Intro</p>", '<th class="al-left">a</th>', '<th class="al-center">b &lt;i&gt;x&lt;/i&gt;</th>',
                 '<td class="al-center"><strong>2</strong></td>', '<td class="al-right">3 | 4</td>',
                 "<del>gone</del> and kept", 'class="task"><input type="checkbox" disabled="" aria-label="done">',
                 'aria-label="not done"> todo']:
        assert part in html, f"{part!r} not in {html}"
    assert chat.page.evaluate("""() => {
        const d = document.createElement('div');
        d.append(renderMarkdown('- [x] done'));
        return d.querySelector('input').checked;
    }""")
    assert "<i>" not in html


class Restartable:
    """A server on a fixed port that the test stops and starts again."""

    def __init__(self, *args):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = args
        self.proc = None

    def start(self):
        self.log = open(f"/tmp/ferrum-serve-{self.port}.log", "a")
        self.proc = subprocess.Popen([BIN, "serve", "--port", str(self.port), *self.args],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except Exception:
                time.sleep(0.2)
        raise RuntimeError("ferrum serve did not become healthy")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()


def test_server_down_shows_a_banner_and_recovers(browser):
    server = Restartable("--model", "smollm2")
    server.start()
    p = Page(browser, server, viewport={"width": 1000, "height": 700})
    try:
        page = p.page
        expect(page.locator("#model-name")).to_have_text("smollm2")
        p.settings(temperature=0, max_tokens=4)
        server.stop()
        p.ask("Are you there?")
        expect(page.locator("#banner")).to_be_visible()
        expect(page.locator("#banner-text")).to_contain_text("cannot be reached")
        expect(page.locator("#model-name")).to_have_text("offline")
        expect(p.last_answer().locator(".stats")).to_contain_text("the server cannot be reached")
        p.screenshot("server-down.png")
        # Retrying while it is down keeps the banner up, and the next try waits longer.
        page.click("#banner-retry")
        expect(page.locator("#banner-retry")).to_contain_text(re.compile(r"next try in ([2-9]|[1-3]\d) s"))
        expect(page.locator("#banner")).to_be_visible()
        # Back up: the page finds it by itself (the backoff is capped at 30 s).
        server.start()
        expect(page.locator("#banner")).to_be_hidden(timeout=45_000)
        expect(page.locator("#model-name")).to_have_text("smollm2")
        # The failed turn is not sent again with the next one.
        sent = []
        page.on("request", lambda r: sent.append(r.post_data_json) if r.url.endswith("/chat/completions") else None)
        p.ask("Hello again")
        p.wait_answered()
        assert [m["content"] for m in sent[-1]["messages"] if m["role"] == "user"] == ["Hello again"], sent
    finally:
        p.close()
        server.stop()


@pytest.fixture(scope="module")
def small_context_server():
    server = Restartable("--model", "smollm2", "--ctx", "160")
    server.start()
    yield server
    server.stop()


def test_context_overflow_offers_to_drop_the_oldest_turns(browser, small_context_server):
    p = Page(browser, small_context_server, viewport={"width": 1000, "height": 700})
    try:
        page = p.page
        p.settings(temperature=0, max_tokens=8)
        long = "Here is some text about rivers, mountains and the sea. " * 5
        p.ask("First: " + long)
        p.wait_answered()
        p.ask("Second: " + long)
        overflow = p.last_answer()
        expect(overflow.locator(".stats")).to_contain_text("context", timeout=ANSWER_MS)
        p.screenshot("overflow.png")
        overflow.get_by_role("button", name="Drop the oldest turns and retry").click()
        p.wait_answered()
        expect(page.locator(".msg.user")).to_have_count(1)
        expect(page.locator(".msg.user .body")).to_contain_text("Second:")
        expect(p.last_answer().locator(".stats")).not_to_contain_text("Error")

        # Or a new chat: the question, with a summary of the old chat as its system prompt.
        p.ask("Third: " + long)
        expect(p.last_answer().locator(".stats")).to_contain_text("context", timeout=ANSWER_MS)
        sent = []
        page.on("request", lambda r: sent.append(r.post_data_json) if r.url.endswith("/chat/completions") else None)
        p.last_answer().get_by_role("button", name="Start a new chat with this message and a summary").click()
        p.wait_answered()
        expect(page.locator("#conversations li")).to_have_count(2)
        expect(page.locator(".msg.user")).to_have_count(1)
        expect(page.locator(".msg.user .body")).to_contain_text("Third:")
        system = sent[-1]["messages"][0]
        assert system["role"] == "system" and "Summary of our earlier conversation" in system["content"]
        assert "You answered:" in system["content"], system
    finally:
        p.close()


def test_keyboard_only_and_200_percent_zoom(browser, chat_server):
    # 200% zoom on a 1280x800 screen: half the CSS pixels, twice the device pixels.
    p = Page(browser, chat_server, viewport={"width": 640, "height": 400}, device_scale_factor=2)
    try:
        page = p.page
        expect(page.locator("#model-name")).to_have_text("smollm2")
        p.settings(temperature=0, max_tokens=4)
        page.locator("body").focus()
        for _ in range(30):
            if page.evaluate("document.activeElement.id") == "input":
                break
            page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.id") == "input", "Tab never reaches the message box"
        page.keyboard.type("Hi")
        page.keyboard.press("Enter")
        p.wait_answered()
        # Every button has a name a screen reader can say.
        unnamed = page.evaluate("""() => [...document.querySelectorAll('button')]
            .filter(b => !(b.getAttribute('aria-label') || b.textContent.trim()))
            .map(b => b.outerHTML)""")
        assert not unnamed, unnamed
        # Tab reaches the answer's actions, and Enter on one works.
        for _ in range(40):
            if page.evaluate("document.activeElement.getAttribute('aria-label')") == "Copy message":
                break
            page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.getAttribute('aria-label')") == "Copy message"
        assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth"), \
            "the page scrolls sideways at 200%"
        expect(page.locator("#send")).to_be_in_viewport()
        p.screenshot("zoom-200.png")
    finally:
        p.close()


def test_code_is_highlighted_and_math_is_rendered_safely(chat):
    page = chat.page
    render = """(src) => {
        const d = document.createElement('div');
        d.append(renderMarkdown(src));
        document.body.append(d);
        const out = {html: d.innerHTML, math: d.querySelectorAll('math').length,
                     display: d.querySelectorAll('.math.display math').length,
                     keywords: [...d.querySelectorAll('.hljs-keyword')].map(e => e.textContent),
                     hrefs: [...d.querySelectorAll('[href], [xlink\\\\:href]')].map(e => e.getAttribute('href')),
                     text: d.textContent};
        d.remove();
        return out;
    }"""
    r = page.evaluate(render, "```python\ndef f(x):\n    return x  # <b>no</b>\n```")
    assert r["keywords"] == ["def", "return"], r
    assert "<b>" not in r["html"] and "&lt;b&gt;no&lt;/b&gt;" in r["html"], r["html"]
    # An unknown language stays plain text.
    assert page.evaluate(render, "```nosuchlang\nx = 1\n```")["keywords"] == []

    r = page.evaluate(render, "Euler: $e^{i\\pi} + 1 = 0$, and\n\n$$\n\\int_0^1 x^2\\,dx = \\frac{1}{3}\n$$\n\n"
                              "\\(a^2\\) and \\[b\\]")
    assert r["math"] == 4 and r["display"] == 2, r
    assert "<mfrac>" in r["html"] and "<msup>" in r["html"], r["html"]
    # Money is not math; TeX that does not parse is shown as written.
    r = page.evaluate(render, "It costs $5 and $10. Bad: $\\frac{1}{$ end")
    assert r["math"] == 0 and "$5 and $10" in r["text"], r
    r = page.evaluate(render, "$\\frac{1}{2$")
    assert r["math"] == 0 and r["text"] == "$\\frac{1}{2$", r
    # Hostile math: no links out, no markup, no styles.
    r = page.evaluate(render, "$\\href{javascript:alert(1)}{x}$ $\\url{javascript:alert(2)}$ "
                              "$\\htmlStyle{color:red}{y}$ $<img src=x onerror=alert(3)>$")
    assert not any(h and "javascript" in h for h in r["hrefs"]), r
    assert "<img" not in r["html"] and "style=" not in r["html"] and "onerror" not in r["html"].replace(
        "onerror=alert(3)&gt;", ""), r["html"]
    # Mid-stream, an unclosed $$ block shows as text until it closes.
    r = page.evaluate(render, "$$\n\\sum_i i")
    assert r["math"] == 0 and "\\sum_i i" in r["text"], r
    with urllib.request.urlopen(chat.server.url + "/webui/vendor/THIRD-PARTY.txt") as f:
        licences = f.read().decode()
    assert all(name in licences for name in ["KaTeX", "highlight.js", "DOMPurify", "MIT", "BSD", "Apache"])


@pytest.fixture(scope="module")
def aliased_server():
    server = Restartable("--model", "smollm2", "--served-model-name", "smol", "tiny")
    server.start()
    yield server
    server.stop()


def test_a_server_with_several_names_gets_a_model_picker(browser, aliased_server):
    with urllib.request.urlopen(aliased_server.url + "/v1/models") as r:
        assert [m["id"] for m in json.loads(r.read())["data"]] == ["smol", "tiny"]
    p = Page(browser, aliased_server, viewport={"width": 1000, "height": 700})
    try:
        page = p.page
        pick = page.get_by_role("combobox", name="Model for this chat")
        expect(pick).to_be_visible()
        expect(pick).to_have_value("smol")
        pick.select_option("tiny")
        sent = []
        page.on("request", lambda r: sent.append(r.post_data_json) if r.url.endswith("/chat/completions") else None)
        p.settings(temperature=0, max_tokens=4)
        p.ask("Hi")
        p.wait_answered()
        assert sent[-1]["model"] == "tiny"
        # Each chat keeps its pick.
        page.click("#new-chat")
        expect(pick).to_have_value("smol")
        page.locator("#conversations li", has_text="Hi").locator(".open").click()
        expect(pick).to_have_value("tiny")
    finally:
        p.close()
