// Ferrum chat page: talks to this server's /v1/models and streamed
// /v1/chat/completions. Model output is untrusted: every piece of it enters
// the page as a text node (renderMarkdown builds elements, never HTML).
"use strict";

const $ = (id) => document.getElementById(id);

const KEYS = {
  convs: "ferrum.conversations",
  current: "ferrum.current",
  settings: "ferrum.settings",
  apiKey: "ferrum.apiKey",
  theme: "ferrum.theme",
};
const DEFAULTS = { system: "", temperature: 0.8, top_p: 0.95, max_tokens: 1024 };
const THEMES = ["auto", "light", "dark"];

function load(key, fallback) {
  try {
    const v = localStorage.getItem(key);
    return v === null ? fallback : JSON.parse(v);
  } catch {
    return fallback;
  }
}

function save(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch (e) {
    console.warn("cannot save to local storage:", e);
  }
}

const state = {
  convs: Array.isArray(load(KEYS.convs, [])) ? load(KEYS.convs, []) : [],
  current: load(KEYS.current, null),
  settings: { ...DEFAULTS, ...load(KEYS.settings, {}) },
  apiKey: load(KEYS.apiKey, ""),
  model: null,
  context: null,
  // The answer being streamed: { controller, conv, reply, node }.
  busy: null,
};

// ---------------------------------------------------------------- markdown

function el(tag, cls) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  return e;
}

// Code spans, bold, italics, links to http(s) pages, bare URLs, line breaks.
const INLINE = new RegExp(
  [
    "(`+)([^`]|[^`][\\s\\S]*?[^`])\\1(?!`)",
    "\\*\\*(?=\\S)([\\s\\S]*?\\S)\\*\\*",
    "__(?=\\S)([\\s\\S]*?\\S)__",
    "\\*(?=[^\\s*])([\\s\\S]*?[^\\s*])\\*",
    "(?<![\\w])_(?=[^\\s_])([\\s\\S]*?[^\\s_])_(?![\\w])",
    "\\[([^\\]\\n]+)\\]\\((https?:\\/\\/[^\\s)]+)\\)",
    "(https?:\\/\\/[^\\s<>()]*[^\\s<>().,;:!?'\"])",
    "\\n",
  ].join("|"),
  "g",
);

function link(href, text) {
  const a = el("a");
  a.href = href;
  a.target = "_blank";
  a.rel = "noopener noreferrer nofollow";
  a.append(text);
  return a;
}

function inline(parent, text) {
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) parent.append(text.slice(last, m.index));
    last = m.index + m[0].length;
    if (m[1] !== undefined) {
      const c = el("code");
      c.textContent = m[2];
      parent.append(c);
    } else if (m[3] !== undefined || m[4] !== undefined) {
      const b = el("strong");
      inline(b, m[3] ?? m[4]);
      parent.append(b);
    } else if (m[5] !== undefined || m[6] !== undefined) {
      const i = el("em");
      inline(i, m[5] ?? m[6]);
      parent.append(i);
    } else if (m[7] !== undefined) {
      parent.append(link(m[8], m[7]));
    } else if (m[9] !== undefined) {
      parent.append(link(m[9], m[9]));
    } else {
      parent.append(el("br"));
    }
  }
  if (last < text.length) parent.append(text.slice(last));
}

function codeBlock(code, lang) {
  const box = el("div", "codeblock");
  const bar = el("div", "bar");
  const name = el("span");
  name.textContent = lang || "code";
  const copy = el("button");
  copy.type = "button";
  copy.textContent = "Copy";
  copy.addEventListener("click", () => {
    const done = () => {
      copy.textContent = "Copied";
      setTimeout(() => (copy.textContent = "Copy"), 1200);
    };
    if (navigator.clipboard) navigator.clipboard.writeText(code).then(done, () => {});
  });
  bar.append(name, copy);
  const pre = el("pre");
  const c = el("code");
  c.textContent = code;
  pre.append(c);
  box.append(bar, pre);
  return box;
}

const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)[^`]*$/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;
const QUOTE = /^\s{0,3}>\s?(.*)$/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;

function isBlockStart(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
}

// Quotes and lists nest this deep; deeper content is shown as plain text
// (a reply of 3000 nested quotes, kept in the stored conversation, crashed
// the tab on every load).
const MAX_NESTING = 16;

// Text as one paragraph, with no markup read.
function plain(text) {
  const p = el("p");
  p.textContent = text;
  return p;
}

// A small CommonMark subset: fenced code, headings, rules, quotes, lists and
// paragraphs with inline marks. An unclosed fence (mid-stream) runs to the end.
function renderMarkdown(src, depth = 0) {
  const out = document.createDocumentFragment();
  const lines = String(src).replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(FENCE);
    if (fence) {
      const close = new RegExp("^\\s{0,3}" + fence[1][0] + "{" + fence[1].length + ",}\\s*$");
      const body = [];
      for (i++; i < lines.length && !close.test(lines[i]); i++) body.push(lines[i]);
      i++;
      out.append(codeBlock(body.join("\n"), fence[2]));
      continue;
    }
    if (!line.trim()) {
      i++;
      continue;
    }
    const h = line.match(HEADING);
    if (h) {
      const e = el("h" + Math.min(h[1].length + 2, 6));
      inline(e, h[2]);
      out.append(e);
      i++;
      continue;
    }
    if (RULE.test(line)) {
      out.append(el("hr"));
      i++;
      continue;
    }
    if (QUOTE.test(line)) {
      const inner = [];
      for (; i < lines.length && QUOTE.test(lines[i]); i++) inner.push(lines[i].match(QUOTE)[1]);
      const q = el("blockquote");
      const text = inner.join("\n");
      q.append(depth < MAX_NESTING ? renderMarkdown(text, depth + 1) : plain(text));
      out.append(q);
      continue;
    }
    const item = line.match(ITEM);
    if (item) {
      const ordered = /\d/.test(item[2][0]);
      const list = el(ordered ? "ol" : "ul");
      if (ordered) list.start = parseInt(item[2], 10);
      const indent = item[1].length;
      let text = null;
      const flush = () => {
        if (text === null) return;
        const li = el("li");
        const body = text.join("\n");
        li.append(depth < MAX_NESTING ? renderMarkdown(body, depth + 1) : plain(body));
        // A one-paragraph item renders without its <p>.
        if (li.childNodes.length === 1 && li.firstChild.tagName === "P") li.replaceChildren(...li.firstChild.childNodes);
        list.append(li);
      };
      for (; i < lines.length; i++) {
        const m = lines[i].match(ITEM);
        if (m && m[1].length <= indent && /\d/.test(m[2][0]) === ordered) {
          flush();
          text = [m[3]];
        } else if (lines[i].trim() && (/^\s/.test(lines[i]) || !isBlockStart(lines[i]))) {
          text.push(lines[i].replace(/^\s{1,4}/, ""));
        } else if (!lines[i].trim() && i + 1 < lines.length && /^\s+\S/.test(lines[i + 1])) {
          text.push("");
        } else {
          break;
        }
      }
      flush();
      out.append(list);
      continue;
    }
    const para = [line];
    for (i++; i < lines.length && lines[i].trim() && !isBlockStart(lines[i]); i++) para.push(lines[i]);
    const p = el("p");
    inline(p, para.join("\n"));
    out.append(p);
  }
  return out;
}

// ---------------------------------------------------------------- storage

function currentConv() {
  return state.convs.find((c) => c.id === state.current) || null;
}

function saveConvs() {
  save(KEYS.convs, state.convs);
  save(KEYS.current, state.current);
}

function newConv() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8), title: "New chat", updated: Date.now(), messages: [] };
  state.convs.unshift(c);
  state.current = c.id;
  saveConvs();
  return c;
}

function deleteConv(id) {
  if (state.busy && state.busy.conv.id === id) state.busy.controller.abort();
  state.convs = state.convs.filter((c) => c.id !== id);
  if (state.current === id) state.current = state.convs[0]?.id ?? null;
  saveConvs();
  render();
}

// ---------------------------------------------------------------- rendering

function renderList() {
  const ul = $("conversations");
  ul.replaceChildren();
  for (const c of [...state.convs].sort((a, b) => b.updated - a.updated)) {
    const li = el("li", c.id === state.current ? "current" : "");
    const open = el("button", "open");
    open.type = "button";
    open.textContent = c.title;
    open.title = c.title;
    open.addEventListener("click", () => {
      state.current = c.id;
      saveConvs();
      $("app").classList.remove("nav-open");
      render();
    });
    const del = el("button", "delete");
    del.type = "button";
    del.textContent = "\u00d7";
    del.setAttribute("aria-label", "Delete conversation " + c.title);
    del.title = "Delete";
    del.addEventListener("click", () => deleteConv(c.id));
    li.append(open, del);
    ul.append(li);
  }
}

function statsText(s) {
  const parts = [`${s.tokens} token${s.tokens === 1 ? "" : "s"}`];
  if (s.tps) parts.push(`${s.tps.toFixed(1)} tok/s`);
  if (s.ttft !== undefined) parts.push(`first token ${s.ttft.toFixed(2)} s`);
  return parts.join(" \u00b7 ");
}

function fillMessage(node, m) {
  const body = node.querySelector(".body");
  body.replaceChildren();
  if (m.role === "user") body.textContent = m.content;
  else body.append(renderMarkdown(m.content));
  const foot = node.querySelector(".stats");
  const parts = [];
  if (m.stats) parts.push(statsText(m.stats));
  if (m.stopped) parts.push("stopped");
  if (m.finish === "length") parts.push("hit the token limit");
  foot.replaceChildren(parts.join(" \u00b7 "));
  if (m.error) {
    const e = el("span", "error");
    e.textContent = (parts.length ? " " : "") + "Error: " + m.error;
    foot.append(e);
  }
}

function messageNode(m) {
  const node = el("div", "msg " + (m.role === "user" ? "user" : "assistant"));
  node.append(el("div", "body"), el("div", "stats"));
  fillMessage(node, m);
  return node;
}

function renderMessages() {
  const box = $("messages");
  const conv = currentConv();
  const msgs = conv ? conv.messages : [];
  box.replaceChildren();
  if (!msgs.length) {
    const empty = el("div", "empty");
    empty.id = "empty";
    empty.textContent = "Ask anything. Answers stream from this server's model.";
    box.append(empty);
  }
  for (const m of msgs) {
    const node = messageNode(m);
    if (state.busy && state.busy.reply === m) {
      node.classList.add("pending");
      state.busy.node = node;
    }
    box.append(node);
  }
  box.scrollTop = box.scrollHeight;
}

function render() {
  renderList();
  renderMessages();
  $("send").hidden = !!state.busy;
  $("stop").hidden = !state.busy;
}

let frame = 0;
function renderReplySoon() {
  if (frame) return;
  frame = requestAnimationFrame(() => {
    frame = 0;
    const b = state.busy;
    if (!b || !b.node || !b.node.isConnected) return;
    const box = $("messages");
    const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
    fillMessage(b.node, b.reply);
    if (atBottom) box.scrollTop = box.scrollHeight;
  });
}

// ---------------------------------------------------------------- server

function headers() {
  const h = { "Content-Type": "application/json" };
  if (state.apiKey) h.Authorization = "Bearer " + state.apiKey;
  return h;
}

async function apiError(res) {
  let msg = `HTTP ${res.status}`;
  try {
    const j = await res.json();
    if (j && j.error && j.error.message) msg = j.error.message;
  } catch {
    // not JSON: keep the status
  }
  const e = new Error(msg);
  e.status = res.status;
  return e;
}

let modelTimer = 0;
async function loadModel() {
  clearTimeout(modelTimer);
  try {
    const res = await fetch("/v1/models", { headers: headers() });
    if (res.status === 401) {
      $("model-name").textContent = "API key needed";
      $("model-ctx").textContent = "";
      openSettings("This server needs an API key: enter it below.");
      return;
    }
    if (!res.ok) throw await apiError(res);
    const m = ((await res.json()).data || [])[0];
    state.model = m ? m.id : null;
    state.context = m && m.max_model_len ? m.max_model_len : null;
    $("model-name").textContent = state.model || "no model";
    if (state.context) {
      $("model-ctx").textContent = `${state.context.toLocaleString("en-US")} tokens of context`;
    } else {
      $("model-ctx").textContent = "loading\u2026";
      modelTimer = setTimeout(loadModel, 2000);
    }
  } catch (e) {
    $("model-name").textContent = "server unreachable";
    $("model-ctx").textContent = e.message;
    modelTimer = setTimeout(loadModel, 5000);
  }
}

// The messages sent: the system prompt, then the turns that have content.
function history(conv, upTo) {
  const msgs = [];
  if (state.settings.system.trim()) msgs.push({ role: "system", content: state.settings.system });
  for (const m of conv.messages) {
    if (m === upTo) break;
    if (m.content) msgs.push({ role: m.role, content: m.content });
  }
  return msgs;
}

// Reads a server-sent event stream, calling onData with each data payload.
async function readEvents(res, onData) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = event
        .split("\n")
        .filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data && data !== "[DONE]") onData(JSON.parse(data));
    }
  }
}

async function send() {
  const input = $("input");
  const text = input.value.trim();
  if (!text || state.busy) return;
  const conv = currentConv() || newConv();
  conv.messages.push({ role: "user", content: text });
  if (conv.title === "New chat") conv.title = text.replace(/\s+/g, " ").slice(0, 60);
  const reply = { role: "assistant", content: "" };
  conv.messages.push(reply);
  conv.updated = Date.now();
  saveConvs();
  input.value = "";
  autosize();
  const controller = new AbortController();
  state.busy = { controller, conv, reply, node: null };
  render();

  const s = state.settings;
  const body = {
    messages: history(conv, reply),
    stream: true,
    stream_options: { include_usage: true },
    temperature: s.temperature,
    top_p: s.top_p,
    max_tokens: s.max_tokens,
  };
  if (state.model) body.model = state.model;
  const start = performance.now();
  let first = null;
  let pieces = 0;
  let usage = null;
  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!res.ok) throw await apiError(res);
    await readEvents(res, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message || "the server failed");
      if (chunk.usage) usage = chunk.usage;
      const choice = (chunk.choices || [])[0];
      if (!choice) return;
      const piece = choice.delta && choice.delta.content;
      if (piece) {
        if (first === null) first = performance.now();
        pieces++;
        reply.content += piece;
        renderReplySoon();
      }
      if (choice.finish_reason) reply.finish = choice.finish_reason;
    });
  } catch (e) {
    if (e.name === "AbortError") {
      reply.stopped = true;
    } else {
      reply.error = e.message;
      if (e.status === 401) openSettings("This server needs an API key: enter it below.");
    }
  } finally {
    const end = performance.now();
    const tokens = usage ? usage.completion_tokens : pieces;
    if (first !== null) {
      const decode = (end - first) / 1000;
      reply.stats = {
        tokens,
        tps: tokens > 1 && decode > 0 ? (tokens - 1) / decode : null,
        ttft: (first - start) / 1000,
      };
    }
    state.busy = null;
    conv.updated = Date.now();
    saveConvs();
    render();
  }
}

function stop() {
  if (state.busy) state.busy.controller.abort();
}

// ---------------------------------------------------------------- settings

function openSettings(notice) {
  const d = $("settings");
  const s = state.settings;
  $("set-system").value = s.system;
  $("set-temperature").value = s.temperature;
  $("set-top-p").value = s.top_p;
  $("set-max-tokens").value = s.max_tokens;
  $("set-api-key").value = state.apiKey;
  $("settings-notice").hidden = !notice;
  $("settings-notice").textContent = notice || "";
  $("settings-error").hidden = true;
  if (!d.open) d.showModal();
  if (notice) $("set-api-key").focus();
}

function saveSettings() {
  const num = (id) => Number($(id).value);
  const temperature = num("set-temperature");
  const top_p = num("set-top-p");
  const max_tokens = num("set-max-tokens");
  const problem =
    !(temperature >= 0 && temperature <= 2) ? "Temperature must be between 0 and 2."
    : !(top_p > 0 && top_p <= 1) ? "Top-p must be above 0 and at most 1."
    : !(Number.isInteger(max_tokens) && max_tokens >= 1) ? "Max tokens must be a whole number of at least 1."
    : null;
  if (problem) {
    $("settings-error").textContent = problem;
    $("settings-error").hidden = false;
    return;
  }
  state.settings = { system: $("set-system").value, temperature, top_p, max_tokens };
  save(KEYS.settings, state.settings);
  const key = $("set-api-key").value.trim();
  const keyChanged = key !== state.apiKey;
  state.apiKey = key;
  save(KEYS.apiKey, key);
  $("settings").close();
  if (keyChanged || !state.model) loadModel();
}

// ---------------------------------------------------------------- theme

function applyTheme(t) {
  document.documentElement.dataset.theme = THEMES.includes(t) ? t : "auto";
  $("theme").title = "Theme: " + document.documentElement.dataset.theme;
}

function cycleTheme() {
  const now = document.documentElement.dataset.theme;
  const next = THEMES[(THEMES.indexOf(now) + 1) % THEMES.length];
  save(KEYS.theme, next);
  applyTheme(next);
}

// ---------------------------------------------------------------- wiring

function autosize() {
  const t = $("input");
  t.style.height = "auto";
  t.style.height = Math.min(t.scrollHeight, 200) + "px";
}

function init() {
  applyTheme(load(KEYS.theme, "auto"));
  $("send").addEventListener("click", send);
  $("stop").addEventListener("click", stop);
  $("input").addEventListener("input", autosize);
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  $("new-chat").addEventListener("click", () => {
    const c = currentConv();
    if (!c || c.messages.length) newConv();
    $("app").classList.remove("nav-open");
    render();
    $("input").focus();
  });
  $("menu").addEventListener("click", () => $("app").classList.toggle("nav-open"));
  $("scrim").addEventListener("click", () => $("app").classList.remove("nav-open"));
  $("theme").addEventListener("click", cycleTheme);
  $("settings-open").addEventListener("click", () => openSettings());
  $("settings-cancel").addEventListener("click", () => $("settings").close());
  $("settings-save").addEventListener("click", saveSettings);
  if (!currentConv()) state.current = state.convs[0]?.id ?? null;
  render();
  loadModel();
}

init();
