"""`ferrum run`'s chat prompt in a pseudo-terminal (pexpect), driven as a person would: line editing
and history, slash commands that never reach the model, Ctrl-C at the prompt, `\"\"\"` blocks,
/save; and the command line's errors for negative numbers and mistyped aliases."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pexpect = pytest.importorskip("pexpect")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import BIN  # noqa: E402

LEFT, UP, CTRL_C = "\x1b[D", "\x1b[A", "\x03"


@pytest.fixture
def chat(tmp_path):
    env = dict(os.environ, TERM="xterm", NO_COLOR="1", FERRUM_HISTORY=str(tmp_path / "history"))
    p = pexpect.spawn(BIN, ["run", "smollm2", "-n", "6", "--temperature", "0"], env=env,
                      encoding="utf-8", timeout=60, dimensions=(40, 200))
    p.expect_exact(">>> ")
    yield p, tmp_path
    p.close(force=True)


def test_commands_editing_history_and_blocks(chat):
    p, tmp = chat
    # Arrow keys edit the line: "abc", one left, "X" gives "abXc".
    p.send(f"/set system abc{LEFT}X\r")
    p.expect_exact("(system message set")
    p.sendline("/show")
    p.expect_exact("max_tokens 6 | temperature 0")
    p.expect_exact("system: abXc")
    p.sendline("/frobnicate")
    p.expect_exact("unknown command /frobnicate")
    p.sendline("/set temperature -1")
    p.expect_exact("temperature must be a finite number >= 0")
    # Up recalls the last line; sent again, it fails again.
    p.send(f"{UP}\r")
    p.expect_exact("temperature must be a finite number >= 0")
    p.send(CTRL_C)
    p.expect_exact("(Ctrl-D or /bye quits)")
    # A block over two lines is one message; the model answers it.
    p.sendline('"""Say hello')
    p.expect_exact("... ")
    p.sendline('to me."""')
    p.expect_exact(">>> ")
    save = tmp / "chat.json"
    p.sendline(f"/save {save}")
    p.expect_exact("(saved 3 messages")
    messages = json.loads(save.read_text())["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert messages[0]["content"] == "abXc" and messages[1]["content"] == "Say hello\nto me."
    assert messages[2]["content"], "the model answered"
    p.sendline("/load /nonexistent.json")
    p.expect_exact("cannot read /nonexistent.json")
    p.sendline("/bye")
    p.expect(pexpect.EOF)
    p.close()
    assert p.exitstatus == 0
    history = (tmp / "history").read_text()
    assert "/show" in history and "Say hello" in history, "kept across runs"


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120)


def test_negative_numbers_and_mistyped_models_get_real_errors():
    r = run("run", "smollm2", "-n", "-5", "--prompt", "x")
    assert r.returncode != 0 and "-5 is not allowed: give a whole number of at least 1" in r.stderr
    r = run("run", "smollm2", "--temperature", "-1", "--prompt", "x")
    assert r.returncode != 0 and "temperature must be a finite number >= 0" in r.stderr
    r = run("run", "smolm2", "--prompt", "x")
    assert r.returncode != 0 and "did you mean smollm2?" in r.stderr
    r = run("bench", "-m", "smollm2", "-p", "0", "-n", "0")
    assert r.returncode != 0 and "nothing to measure" in r.stderr


def test_an_empty_line_in_embed_input_is_skipped_with_a_warning():
    r = subprocess.run([BIN, "embed", "--json"], input="hello\n\nworld\n", capture_output=True, text=True,
                       timeout=120)
    if "not found" in r.stderr:
        pytest.skip("minilm is not fetched (scripts/fetch-models.sh minilm)")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["index"] for row in rows] == [0, 2]
    assert "skipped 1 empty input(s), number 2" in r.stderr
    r = subprocess.run([BIN, "embed"], input="\n \n", capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "nothing to embed" in r.stderr


def test_a_chat_longer_than_the_context_drops_its_oldest_turns(tmp_path):
    env = dict(os.environ, TERM="xterm", NO_COLOR="1", FERRUM_HISTORY=str(tmp_path / "history"))
    p = pexpect.spawn(BIN, ["run", "smollm2", "-n", "8", "--temperature", "0", "--ctx", "96"], env=env,
                      encoding="utf-8", timeout=60, dimensions=(40, 200))
    p.expect_exact(">>> ")
    for topic in ["a dragon and a knight in a castle far away",
                  "a wizard who lives in a tall tower by the sea",
                  "a cat who sails across the ocean on a little boat"]:
        p.sendline(f"Tell me a long story about {topic}.")
        p.expect_exact(">>> ")
    # The third turn did not fit 96 tokens with the first two: the oldest exchange went.
    assert "(dropped the 2 oldest messages to fit the 96-token context" in p.before
    save = tmp_path / "chat.json"
    p.sendline(f"/save {save}")
    p.expect_exact("(saved 4 messages")
    messages = json.loads(save.read_text())["messages"]
    assert "wizard" in messages[0]["content"] and "cat" in messages[2]["content"]
    p.sendline("/bye")
    p.expect(pexpect.EOF)


def test_bad_context_settings_are_errors():
    r = subprocess.run([BIN, "run", "smollm2", "--prompt", "x", "-n", "1"], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, FERRUM_KV_CAPACITY="4k"))
    assert r.returncode != 0 and 'FERRUM_KV_CAPACITY="4k" is not a number of tokens' in r.stderr, r.stderr
    r = run("run", "smollm2", "--ctx", "0", "--prompt", "x")
    assert r.returncode != 0 and "0 is not allowed" in r.stderr


def test_tokenize_shows_pieces_and_raw_vocabulary_strings():
    r = run("tokenize", "Hello world")
    assert r.returncode == 0 and '" world"' in r.stdout and "Ġ" not in r.stdout, r.stdout
    r = run("tokenize", "--raw", "Hello world")
    assert r.returncode == 0 and '"Ġworld"' in r.stdout, r.stdout


def test_json_cut_short_by_n_is_an_error(tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text('{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}')
    r = run("run", "smollm2", "--prompt", "JSON:", "-n", "3", "--temperature", "0",
            "--json-schema", str(schema))
    assert r.returncode != 0 and r.stdout.startswith('{"'), r.stdout
    assert "cut at 3 tokens, so the JSON is incomplete; raise -n" in r.stderr, r.stderr
