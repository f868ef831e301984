// Ferrum chat page: talks to this server's /health, /v1/models and streamed
// /v1/chat/completions. Model output is untrusted: renderMarkdown builds
// elements from text nodes, and the only HTML that enters the page comes
// from the bundled highlighter and KaTeX, through DOMPurify's allow-list,
// as nodes (see `clean`); the page's CSP stops anything that slips by.
// Each chat keeps its own settings; new chats start from the last saved.
"use strict";

const $ = (id) => document.getElementById(id);

const KEYS = {
  convs: "ferrum.conversations",
  current: "ferrum.current",
  settings: "ferrum.settings",
  apiKey: "ferrum.apiKey",
  theme: "ferrum.theme",
};
// `seed` "" is random; the rest are the server's request fields.
const DEFAULTS = {
  system: "", temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, repeat_penalty: 1, seed: "", max_tokens: 1024,
};
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
  // The server's model ids (several: aliases or adapters, a picker shows)
  // and the first, which answers when a chat has not picked one.
  models: [],
  model: null,
  context: null,
  // The answer being streamed: { controller, conv, reply, node }.
  busy: null,
  // Whether /health answered last time (false: the banner is up).
  online: true,
};

// A chat's settings: its own over the defaults.
function chatSettings(conv) {
  return { ...state.settings, ...((conv && conv.settings) || {}) };
}

// ---------------------------------------------------------------- markdown

function el(tag, cls) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  return e;
}

// ---- the bundled renderers (webui/vendor). Without them (a page saved
// without its scripts) code stays plain and math stays its TeX.
const RENDERERS = {
  hljs: typeof hljs !== "undefined" && typeof DOMPurify !== "undefined",
  katex: typeof katex !== "undefined" && typeof DOMPurify !== "undefined",
};

// A renderer's HTML as nodes, kept to what `allow` permits (never a
// style, script or event handler).
function clean(html, allow) {
  return DOMPurify.sanitize(html, { ...allow, FORBID_ATTR: ["style"], RETURN_DOM_FRAGMENT: true });
}

// Code of a known language as highlighted spans, or null (no guessing:
// it is slow and often wrong).
function highlighted(code, lang) {
  if (!RENDERERS.hljs || !lang || !hljs.getLanguage(lang) || code.length > 200000) return null;
  const html = hljs.highlight(code, { language: lang, ignoreIllegals: true }).value;
  return clean(html, { ALLOWED_TAGS: ["span"], ALLOWED_ATTR: ["class"] });
}

// TeX as MathML (no fonts or styles needed), or null when it does not
// parse (the TeX is then shown as written). No \href or \url (trust off),
// and bounded sizes and macro expansion.
function math(tex, display) {
  if (!RENDERERS.katex) return null;
  try {
    const html = katex.renderToString(tex, {
      displayMode: display, output: "mathml", throwOnError: true, trust: false, maxSize: 20, maxExpand: 500,
    });
    return clean(html, { USE_PROFILES: { html: true, mathMl: true } });
  } catch {
    return null;
  }
}

function mathNode(tex, display, source) {
  const box = el(display ? "div" : "span", display ? "math display" : "math");
  const m = math(tex, display);
  if (m) box.append(m);
  else box.textContent = source;
  return box;
}

// Code spans, bold, italics, links to http(s) pages, bare URLs,
// strikethrough, math ($$..$$, $..$, \(..\), \[..\]), line breaks.
const INLINE = new RegExp(
  [
    "(`+)([^`]|[^`][\\s\\S]*?[^`])\\1(?!`)",
    "\\*\\*(?=\\S)([\\s\\S]*?\\S)\\*\\*",
    "__(?=\\S)([\\s\\S]*?\\S)__",
    "\\*(?=[^\\s*])([\\s\\S]*?[^\\s*])\\*",
    "(?<![\\w])_(?=[^\\s_])([\\s\\S]*?[^\\s_])_(?![\\w])",
    "\\[([^\\]\\n]+)\\]\\((https?:\\/\\/[^\\s)]+)\\)",
    "(https?:\\/\\/[^\\s<>()]*[^\\s<>().,;:!?'\"])",
    "~~(?=\\S)([\\s\\S]*?\\S)~~",
    "\\$\\$([^$]+?)\\$\\$",
    "\\$(?=[^\\s$])([^$\\n]*?[^\\s$\\\\])\\$(?![\\d$])",
    "\\\\\\(([\\s\\S]+?)\\\\\\)",
    "\\\\\\[([\\s\\S]+?)\\\\\\]",
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
    } else if (m[10] !== undefined) {
      const d = el("del");
      inline(d, m[10]);
      parent.append(d);
    } else if (m[11] !== undefined || m[14] !== undefined) {
      parent.append(mathNode(m[11] ?? m[14], true, m[0]));
    } else if (m[12] !== undefined || m[13] !== undefined) {
      parent.append(mathNode(m[12] ?? m[13], false, m[0]));
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
  const copy = button("Copy", "Copy code", () => copyText(code, copy));
  bar.append(name, copy);
  const pre = el("pre");
  const c = el("code");
  const h = highlighted(code, lang.toLowerCase());
  if (h) {
    c.className = "hljs";
    c.append(h);
  } else {
    c.textContent = code;
  }
  pre.append(c);
  box.append(bar, pre);
  return box;
}

const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)[^`]*$/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;
const QUOTE = /^\s{0,3}>\s?(.*)$/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;

const MATH_OPEN = /^\s{0,3}(\$\$|\\\[)/;

// A display-math block from lines[i] (`$$` or `\[` to `$$` or `\]`), or
// null while its end has not come (mid-stream: shown as text until then).
function mathBlock(lines, i) {
  const open = lines[i].match(MATH_OPEN)[1];
  const close = open === "$$" ? "$$" : "\\]";
  const first = lines[i].trim().slice(open.length);
  const body = [];
  for (let j = i; j < lines.length; j++) {
    const text = j === i ? first : lines[j].trim();
    if (text.endsWith(close) && (j > i || text.length >= close.length)) {
      body.push(text.slice(0, text.length - close.length));
      const tex = body.join("\n").trim();
      if (!tex) return null;
      return { node: mathNode(tex, true, lines.slice(i, j + 1).join("\n")), next: j + 1 };
    }
    body.push(text);
  }
  return null;
}

const TABLE_RULE = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;
const TASK = /^\[([ xX])\]\s+/;

function isBlockStart(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
}

// A GFM table starts at lines[i]: a row with pipes over a delimiter row.
function isTable(lines, i) {
  return lines[i].includes("|") && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1]) && lines[i + 1].includes("-");
}

// A row's cells: split at pipes that are not escaped, outer pipes dropped.
function cells(line) {
  const out = [];
  let cur = "";
  const t = line.trim().replace(/^\|/, "").replace(/(?<!\\)\|$/, "");
  for (let i = 0; i < t.length; i++) {
    if (t[i] === "\\" && t[i + 1] === "|") {
      cur += "|";
      i++;
    } else if (t[i] === "|") {
      out.push(cur.trim());
      cur = "";
    } else {
      cur += t[i];
    }
  }
  out.push(cur.trim());
  return out;
}

function table(lines, i) {
  const aligns = cells(lines[i + 1]).map((c) =>
    c.startsWith(":") && c.endsWith(":") ? "center" : c.endsWith(":") ? "right" : c.startsWith(":") ? "left" : "");
  const row = (line, tag) => {
    const tr = el("tr");
    const cs = cells(line);
    aligns.forEach((a, k) => {
      const td = el(tag, a ? "al-" + a : "");
      inline(td, cs[k] ?? "");
      tr.append(td);
    });
    return tr;
  };
  const box = el("div", "table");
  const t = el("table");
  const head = el("thead");
  head.append(row(lines[i], "th"));
  const body = el("tbody");
  let j = i + 2;
  for (; j < lines.length && lines[j].trim() && lines[j].includes("|"); j++) body.append(row(lines[j], "td"));
  t.append(head, body);
  box.append(t);
  return { node: box, next: j };
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
    const block = MATH_OPEN.test(line) ? mathBlock(lines, i) : null;
    if (block) {
      out.append(block.node);
      i = block.next;
      continue;
    }
    if (isTable(lines, i)) {
      const t = table(lines, i);
      out.append(t.node);
      i = t.next;
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
        let body = text.join("\n");
        const task = body.match(TASK);
        if (task) {
          body = body.slice(task[0].length);
          li.className = "task";
        }
        li.append(depth < MAX_NESTING ? renderMarkdown(body, depth + 1) : plain(body));
        // A one-paragraph item renders without its <p>.
        if (li.childNodes.length === 1 && li.firstChild.tagName === "P") li.replaceChildren(...li.firstChild.childNodes);
        if (task) {
          const box = el("input");
          box.type = "checkbox";
          box.disabled = true;
          box.checked = task[1] !== " ";
          box.setAttribute("aria-label", box.checked ? "done" : "not done");
          li.prepend(box, " ");
        }
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
    for (i++; i < lines.length && lines[i].trim() && !isBlockStart(lines[i]) && !isTable(lines, i); i++) para.push(lines[i]);
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
  const c = {
    id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8),
    title: "New chat",
    updated: Date.now(),
    settings: { ...state.settings },
    messages: [],
  };
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
    const ren = button("\u270e", "Rename conversation " + c.title, () => renameConv(c, li, open), "rename");
    const del = button("\u00d7", "Delete conversation " + c.title, () => deleteConv(c.id), "delete");
    li.append(open, ren, del);
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

function button(text, label, onClick, cls) {
  const b = el("button", cls);
  b.type = "button";
  b.textContent = text;
  b.setAttribute("aria-label", label);
  b.title = label;
  b.addEventListener("click", onClick);
  return b;
}

// Copies text: the Clipboard API where the page may use it (https,
// localhost), else a selected hidden textarea and execCommand, which plain
// http on a LAN address still allows.
function copyText(text, btn) {
  const done = (ok) => {
    const was = btn.textContent;
    btn.textContent = ok ? "Copied" : "Copy failed";
    setTimeout(() => (btn.textContent = was), 1200);
  };
  const fallback = () => {
    const t = el("textarea", "offscreen");
    t.value = text;
    t.setAttribute("readonly", "");
    document.body.append(t);
    t.select();
    let ok = false;
    try {
      ok = document.execCommand("copy");
    } catch {
      ok = false;
    }
    t.remove();
    done(ok);
  };
  if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(text).then(() => done(true), fallback);
  else fallback();
}

// The buttons under a message: copy for all; edit and delete for the
// user's; regenerate, continue (an answer cut by the token limit) and
// delete for answers. None while that message streams.
function actions(conv, m) {
  const bar = el("div", "actions");
  if (state.busy && state.busy.reply === m) return bar;
  const last = conv.messages[conv.messages.length - 1] === m;
  const copy = button("Copy", "Copy message", () => copyText(m.content, copy));
  bar.append(copy);
  if (m.role === "user") {
    bar.append(button("Edit", "Edit and resend", () => editMessage(conv, m)));
  } else {
    bar.append(button("Regenerate", "Regenerate answer", () => regenerate(conv, m)));
    if (last && m.finish === "length" && m.content) {
      bar.append(button("Continue", "Continue answer", () => continueAnswer(conv, m)));
    }
    if (last && m.overflow) {
      bar.append(
        button("Drop oldest turns", "Drop the oldest turns and retry", () => dropOldest(conv, m), "primary"),
        button("New chat", "Start a new chat with this message and a summary", () => newChatFrom(conv, m)),
      );
    }
  }
  bar.append(button("Delete", "Delete message", () => deleteMessage(conv, m)));
  return bar;
}

function messageNode(conv, m) {
  const node = el("div", "msg " + (m.role === "user" ? "user" : "assistant"));
  node.append(el("div", "body"), el("div", "stats"), actions(conv, m));
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
    const node = messageNode(conv, m);
    if (state.busy && state.busy.reply === m) {
      node.classList.add("pending");
      state.busy.node = node;
    }
    box.append(node);
  }
  box.scrollTop = box.scrollHeight;
}

// The model a chat asks for: its pick while the server still has it.
function chatModel(conv) {
  return conv && conv.model && state.models.includes(conv.model) ? conv.model : state.model;
}

// A picker in place of the name when the server has several models.
function renderPicker() {
  const pick = $("model-pick");
  const several = state.models.length > 1;
  pick.hidden = !several;
  $("model-name").hidden = several;
  if (!several) return;
  if ([...pick.options].map((o) => o.value).join("\n") !== state.models.join("\n")) {
    pick.replaceChildren(...state.models.map((id) => {
      const o = el("option");
      o.value = id;
      o.textContent = id;
      return o;
    }));
  }
  pick.value = chatModel(currentConv());
}

function pickModel() {
  const conv = currentConv() || newConv();
  conv.model = $("model-pick").value;
  saveConvs();
  render();
}

function render() {
  renderList();
  renderPicker();
  renderMessages();
  $("send").hidden = !!state.busy;
  $("stop").hidden = !state.busy;
  $("banner").hidden = state.online;
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
  let code = null;
  try {
    const j = await res.json();
    if (j && j.error && j.error.message) msg = j.error.message;
    if (j && j.error) code = j.error.code || null;
  } catch {
    // not JSON: keep the status
  }
  const e = new Error(msg);
  e.status = res.status;
  e.code = code;
  return e;
}

// fetch's own failure (no answer at all), as opposed to an HTTP error.
function unreachable(e) {
  return e instanceof TypeError;
}

// ---- the server-down banner: /health is polled with backoff (1 s, then
// doubling to 30 s) until it answers; "Retry now" polls at once.
let healthTimer = 0;
let healthDelay = 1000;

function serverDown(why) {
  state.online = false;
  state.models = [];
  renderPicker();
  $("banner-text").textContent = why;
  $("model-name").textContent = "offline";
  $("model-ctx").textContent = "";
  $("banner").hidden = false;
  clearTimeout(healthTimer);
  healthTimer = setTimeout(checkHealth, healthDelay);
  $("banner-retry").textContent = `Retry now (next try in ${Math.round(healthDelay / 1000)} s)`;
  healthDelay = Math.min(healthDelay * 2, 30000);
}

async function checkHealth() {
  clearTimeout(healthTimer);
  try {
    const res = await fetch("/health", { cache: "no-store" });
    if (res.status === 503) {
      healthDelay = 2000;
      return serverDown("The server is loading its model\u2026");
    }
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
  } catch {
    return serverDown("The server cannot be reached. It may be restarting.");
  }
  state.online = true;
  healthDelay = 1000;
  $("banner").hidden = true;
  loadModel();
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
    const data = (await res.json()).data || [];
    const m = data[0];
    state.models = data.map((x) => x.id);
    state.model = m ? m.id : null;
    state.context = m && m.max_model_len ? m.max_model_len : null;
    $("model-name").textContent = state.model || "no model";
    renderPicker();
    if (state.context) {
      $("model-ctx").textContent = `${state.context.toLocaleString("en-US")} tokens of context`;
    } else {
      $("model-ctx").textContent = "loading\u2026";
      modelTimer = setTimeout(loadModel, 2000);
    }
  } catch (e) {
    if (unreachable(e)) return serverDown("The server cannot be reached. It may be restarting.");
    $("model-name").textContent = "server error";
    $("model-ctx").textContent = e.message;
    modelTimer = setTimeout(loadModel, 5000);
  }
}

// A turn that failed with no answer: neither its question nor its error
// is sent again.
function failed(conv, i) {
  const m = conv.messages[i];
  const next = conv.messages[i + 1];
  if (m.role === "assistant") return !!m.error && !m.content;
  return !!next && next.role === "assistant" && !!next.error && !next.content;
}

// The messages sent: the chat's system prompt, then the turns before
// `upTo` that have content and did not fail.
function history(conv, upTo) {
  const msgs = [];
  const system = chatSettings(conv).system;
  if (system.trim()) msgs.push({ role: "system", content: system });
  for (let i = 0; i < conv.messages.length; i++) {
    const m = conv.messages[i];
    if (m === upTo) break;
    if (m.content && !failed(conv, i)) msgs.push({ role: m.role, content: m.content });
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
  input.value = "";
  autosize();
  answer(conv);
}

// Streams an answer into a new last message of `conv`, or (`cont`) onto
// the end of `cont`, the cut answer it continues.
async function answer(conv, cont = null) {
  const reply = cont || { role: "assistant", content: "" };
  if (!cont) conv.messages.push(reply);
  for (const k of ["error", "overflow", "stopped", "finish"]) delete reply[k];
  conv.updated = Date.now();
  saveConvs();
  const controller = new AbortController();
  state.busy = { controller, conv, reply, node: null };
  render();

  const s = chatSettings(conv);
  const body = {
    messages: history(conv, reply),
    stream: true,
    stream_options: { include_usage: true },
    temperature: s.temperature,
    top_k: s.top_k,
    top_p: s.top_p,
    min_p: s.min_p,
    repetition_penalty: s.repeat_penalty,
    max_tokens: s.max_tokens,
  };
  if (s.seed !== "") body.seed = s.seed;
  if (cont) {
    body.messages.push({ role: "assistant", content: reply.content });
    body.continue_final_message = true;
    body.add_generation_prompt = false;
  }
  if (state.model) body.model = chatModel(conv);
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
    } else if (unreachable(e)) {
      reply.error = "the server cannot be reached";
      serverDown("The server cannot be reached. It may be restarting.");
    } else {
      reply.error = e.message;
      reply.overflow = e.code === "context_length_exceeded";
      if (e.status === 401) openSettings("This server needs an API key: enter it below.");
    }
  } finally {
    const end = performance.now();
    const tokens = usage ? usage.completion_tokens : pieces;
    if (first !== null) {
      const decode = (end - first) / 1000;
      reply.stats = {
        tokens: (cont && reply.stats ? reply.stats.tokens : 0) + tokens,
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

// ---------------------------------------------------------------- message actions

function regenerate(conv, m) {
  if (state.busy) return;
  conv.messages.splice(conv.messages.indexOf(m));
  answer(conv);
}

function continueAnswer(conv, m) {
  if (state.busy) return;
  answer(conv, m);
}

function deleteMessage(conv, m) {
  if (state.busy) return;
  conv.messages.splice(conv.messages.indexOf(m), 1);
  conv.updated = Date.now();
  saveConvs();
  render();
}

// The message's text becomes an editor; sending it drops what came after
// and asks again.
function editMessage(conv, m) {
  if (state.busy) return;
  const node = [...document.querySelectorAll("#messages .msg")][conv.messages.indexOf(m)];
  if (!node) return;
  const box = el("div", "edit");
  const t = el("textarea");
  t.value = m.content;
  t.rows = Math.min(10, m.content.split("\n").length + 1);
  t.setAttribute("aria-label", "Edit message");
  const save = button("Send", "Send the edited message", () => {
    const text = t.value.trim();
    if (!text) return;
    m.content = text;
    conv.messages.splice(conv.messages.indexOf(m) + 1);
    answer(conv);
  }, "primary");
  const cancel = button("Cancel", "Cancel editing", () => render());
  t.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      save.click();
    } else if (e.key === "Escape") {
      cancel.click();
    }
  });
  box.append(t, save, cancel);
  node.replaceChildren(box);
  t.focus();
}

// The oldest exchange (a question and its answers) goes, and the failed
// turn is asked again; the chat's system prompt stays.
function dropOldest(conv, m) {
  if (state.busy) return;
  const at = conv.messages.indexOf(m);
  const nextUser = conv.messages.findIndex((x, i) => i > 0 && x.role === "user");
  if (nextUser <= 0 || nextUser > at - 1) {
    m.error = "this message alone does not fit the model's context; shorten it or start a new chat";
    m.overflow = false;
    render();
    return;
  }
  conv.messages.splice(0, nextUser);
  conv.messages.splice(conv.messages.indexOf(m), 1);
  answer(conv);
}

// A new chat that starts from a summary of this one and the message that
// did not fit. The summary is the latest turns, each cut to 200
// characters, newest first until about a quarter of the context (a
// character is roughly a quarter of a token) is used.
function newChatFrom(conv, m) {
  if (state.busy) return;
  const at = conv.messages.indexOf(m);
  const question = conv.messages[at - 1];
  const earlier = conv.messages.slice(0, at - 1).filter((x) => x.content && !x.error);
  let budget = state.context || 4096;
  const lines = [];
  for (const x of earlier.reverse()) {
    const line = `${x.role === "user" ? "I asked" : "You answered"}: ${x.content.replace(/\s+/g, " ").slice(0, 200)}`;
    if (line.length > budget) break;
    budget -= line.length;
    lines.unshift(line);
  }
  const summary = lines.join("\n");
  const c = newConv();
  c.settings = { ...(conv.settings || {}) };
  if (summary) {
    c.settings.system = [chatSettings(conv).system, "Summary of our earlier conversation:\n" + summary]
      .filter((x) => x.trim())
      .join("\n\n");
  }
  c.title = conv.title;
  c.messages.push({ role: "user", content: question ? question.content : "" });
  answer(c);
}

// ---------------------------------------------------------------- conversations

function renameConv(c, li, open) {
  const t = el("input", "rename-input");
  t.value = c.title;
  t.setAttribute("aria-label", "Conversation name");
  const finish = (keep) => {
    const name = t.value.trim();
    if (keep && name) {
      c.title = name.slice(0, 120);
      saveConvs();
    }
    renderList();
  };
  t.addEventListener("keydown", (e) => {
    if (e.key === "Enter") finish(true);
    else if (e.key === "Escape") finish(false);
  });
  t.addEventListener("blur", () => finish(true));
  li.replaceChildren(t);
  t.focus();
  t.select();
}

// A file of `{format: "ferrum-chat", version: 1, conversations: [...]}`.
function exportChats(all) {
  const convs = all ? state.convs : [currentConv()].filter(Boolean);
  if (!convs.length) return;
  const data = JSON.stringify({ format: "ferrum-chat", version: 1, conversations: convs }, null, 2);
  const a = el("a");
  a.href = URL.createObjectURL(new Blob([data], { type: "application/json" }));
  a.download = all ? "ferrum-chats.json" : `${convs[0].title.replace(/[^\w -]+/g, "").trim() || "chat"}.json`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

// Reads chats exported above; what does not look like one is refused
// whole, with a line saying why.
async function importChats(file) {
  const note = $("import-error");
  note.hidden = true;
  try {
    const data = JSON.parse(await file.text());
    const list = Array.isArray(data.conversations) ? data.conversations : [data];
    const convs = list.map((c) => {
      if (!c || !Array.isArray(c.messages)) throw new Error("no messages list");
      const messages = c.messages.map((m) => {
        if (!m || !["user", "assistant"].includes(m.role) || typeof m.content !== "string") {
          throw new Error("each message needs a role (user or assistant) and text");
        }
        const kept = { role: m.role, content: m.content };
        if (m.finish === "length") kept.finish = "length";
        return kept;
      });
      const settings = {};
      for (const k of Object.keys(DEFAULTS)) if (c.settings && k in c.settings) settings[k] = c.settings[k];
      return {
        id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8),
        title: typeof c.title === "string" && c.title.trim() ? c.title.slice(0, 120) : "Imported chat",
        updated: Date.now(),
        settings,
        messages,
        ...(typeof c.model === "string" ? { model: c.model } : {}),
      };
    });
    state.convs.unshift(...convs);
    state.current = convs[0].id;
    saveConvs();
    render();
  } catch (e) {
    note.textContent = `${file.name} is not a Ferrum chat export (${e.message}).`;
    note.hidden = false;
  }
}

// ---------------------------------------------------------------- settings

// The dialog edits the current chat's settings (new chats start from the
// last saved) and the API key, which is the browser's.
const FIELDS = ["temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed", "max_tokens"];

function openSettings(notice) {
  const d = $("settings");
  const s = chatSettings(currentConv());
  $("set-system").value = s.system;
  for (const f of FIELDS) $("set-" + f.replace(/_/g, "-")).value = s[f];
  $("set-api-key").value = state.apiKey;
  $("settings-notice").hidden = !notice;
  $("settings-notice").textContent = notice || "";
  $("settings-error").hidden = true;
  if (!d.open) d.showModal();
  if (notice) $("set-api-key").focus();
}

// The settings in the dialog, or the first problem with them.
function readSettings() {
  const v = {};
  for (const f of FIELDS) v[f] = $("set-" + f.replace(/_/g, "-")).value.trim();
  const num = (x) => (x === "" ? NaN : Number(x));
  const out = {
    system: $("set-system").value,
    temperature: num(v.temperature),
    top_k: num(v.top_k),
    top_p: num(v.top_p),
    min_p: num(v.min_p),
    repeat_penalty: num(v.repeat_penalty),
    seed: v.seed === "" ? "" : num(v.seed),
    max_tokens: num(v.max_tokens),
  };
  const problem =
    !(out.temperature >= 0 && out.temperature <= 2) ? "Temperature must be between 0 and 2."
    : !(Number.isInteger(out.top_k) && out.top_k >= 0) ? "Top-k must be a whole number (0 turns it off)."
    : !(out.top_p > 0 && out.top_p <= 1) ? "Top-p must be above 0 and at most 1."
    : !(out.min_p >= 0 && out.min_p <= 1) ? "Min-p must be between 0 and 1."
    : !(out.repeat_penalty > 0 && out.repeat_penalty <= 2) ? "Repeat penalty must be above 0 and at most 2 (1 is off)."
    : !(out.seed === "" || (Number.isInteger(out.seed) && out.seed >= 0)) ? "Seed must be a whole number, or empty for random."
    : !(Number.isInteger(out.max_tokens) && out.max_tokens >= 1) ? "Max tokens must be a whole number of at least 1."
    : null;
  return { settings: out, problem };
}

function saveSettings() {
  const { settings, problem } = readSettings();
  if (problem) {
    $("settings-error").textContent = problem;
    $("settings-error").hidden = false;
    return;
  }
  const conv = currentConv();
  if (conv) {
    conv.settings = settings;
    saveConvs();
  }
  state.settings = settings;
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
  $("banner-retry").addEventListener("click", checkHealth);
  $("model-pick").addEventListener("change", pickModel);
  $("export-chat").addEventListener("click", () => exportChats(false));
  $("export-all").addEventListener("click", () => exportChats(true));
  $("import-chats").addEventListener("click", () => $("import-file").click());
  $("import-file").addEventListener("change", (e) => {
    const f = e.target.files[0];
    if (f) importChats(f);
    e.target.value = "";
  });
  if (!currentConv()) state.current = state.convs[0]?.id ?? null;
  render();
  loadModel();
}

init();
