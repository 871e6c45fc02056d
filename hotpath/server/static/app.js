// The chat page: a client of this server's own OpenAI routes, as any other client is.
// URLs are relative, so the page also works behind a proxy that serves it under a path prefix.
// Model output only ever enters the page as text (textContent / text nodes), never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);

const SETTINGS = ["system-prompt", "temperature", "top-p", "max-tokens", "extra", "api-key"];
const STORAGE_PREFIX = "hotpath.";

const chat = {
  history: [],       // {role, content} of the finished turns, as sent back to the server
  controller: null,  // the AbortController of the reply in flight
  model: null,
};

// ---- settings ------------------------------------------------------------------------------
function loadSettings() {
  for (const id of SETTINGS) {
    const saved = localStorage.getItem(STORAGE_PREFIX + id);
    if (saved !== null) $(id).value = saved;
    $(id).addEventListener("input", () => localStorage.setItem(STORAGE_PREFIX + id, $(id).value));
  }
  $("api-key").addEventListener("change", loadModel);
}

function authHeaders() {
  const key = $("api-key").value.trim();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

// The sampling fields the user filled in; empty ones are left to the server's defaults.
function samplingFields() {
  const fields = {};
  for (const [id, name] of [["temperature", "temperature"], ["top-p", "top_p"], ["max-tokens", "max_tokens"]]) {
    const value = $(id).valueAsNumber;
    if (!Number.isNaN(value)) fields[name] = value;
  }
  const extra = $("extra").value.trim();
  if (extra) {
    let parsed;
    try {
      parsed = JSON.parse(extra);
    } catch (e) {
      throw new Error(`Extra request fields: not valid JSON (${e.message})`);
    }
    if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
      throw new Error("Extra request fields: must be a JSON object");
    }
    Object.assign(fields, parsed);
  }
  return fields;
}

// ---- notices and errors ----------------------------------------------------------------------
function showNotice(text) {
  $("notice").textContent = text;
  $("notice").hidden = false;
}

function hideNotice() {
  $("notice").hidden = true;
}

// The message of an error response: OpenAI's {"error": {"message"}} when the body has it.
async function errorMessage(response) {
  const text = await response.text();
  try {
    const message = JSON.parse(text).error.message;
    if (message) return `${response.status}: ${message}`;
  } catch (e) {
    // not OpenAI's shape: the raw body below
  }
  return `${response.status} ${response.statusText}${text ? `: ${text.slice(0, 500)}` : ""}`;
}

async function loadModel() {
  $("model").textContent = "connecting…";
  try {
    const response = await fetch("v1/models", { headers: authHeaders() });
    if (!response.ok) {
      $("model").textContent = "no model";
      if (response.status === 401) {
        showNotice("This server needs an API key: enter it under Settings.");
        $("api-key").focus();
      } else {
        showNotice(`GET /v1/models failed: ${await errorMessage(response)}`);
      }
      return;
    }
    const body = await response.json();
    chat.model = body.data[0].id;
    $("model").textContent = chat.model;
    hideNotice();
  } catch (e) {
    $("model").textContent = "no model";
    showNotice(`Cannot reach the server: ${e.message}`);
  }
}

// ---- messages ----------------------------------------------------------------------------------
function addUserMessage(text) {
  const div = document.createElement("div");
  div.className = "message user";
  div.textContent = text;
  $("messages").append(div);
  scrollToEnd(true);
}

// An assistant reply being streamed: its (lazily created) reasoning block, its text, its stats line.
class ReplyView {
  constructor() {
    this.root = document.createElement("div");
    this.root.className = "message assistant";
    this.root.dataset.state = "streaming";
    this.content = document.createElement("div");
    this.content.className = "content";
    this.contentText = document.createTextNode("");
    this.content.append(this.contentText);
    this.stats = document.createElement("div");
    this.stats.className = "stats";
    this.stats.textContent = "waiting for the first token…";
    this.root.append(this.content, this.stats);
    this.reasoning = null;
    $("messages").append(this.root);
  }

  appendReasoning(text) {
    if (this.reasoning === null) {
      this.reasoning = document.createElement("details");
      this.reasoning.className = "reasoning";
      this.reasoning.open = true;  // open while the model thinks, closed once its answer starts
      this.reasoningSummary = document.createElement("summary");
      this.reasoningSummary.textContent = "Thinking…";
      this.reasoningText = document.createTextNode("");
      const body = document.createElement("div");
      body.className = "reasoning-text";
      body.append(this.reasoningText);
      this.reasoning.append(this.reasoningSummary, body);
      this.root.insertBefore(this.reasoning, this.content);
    }
    this.reasoningText.appendData(text);
  }

  appendContent(text) {
    if (this.reasoning !== null && this.contentText.length === 0) this.endReasoning();
    this.contentText.appendData(text);
  }

  endReasoning() {
    if (this.reasoning !== null && this.reasoningSummary.textContent === "Thinking…") {
      this.reasoningSummary.textContent = "Reasoning";
      this.reasoning.open = false;
    }
  }

  finish(state, statsText) {
    this.endReasoning();
    this.root.dataset.state = state;
    this.stats.textContent = statsText;
  }

  fail(message) {
    this.endReasoning();
    this.root.dataset.state = "error";
    this.stats.textContent = "";
    const error = document.createElement("div");
    error.className = "error";
    error.textContent = message;
    this.root.append(error);
  }
}

function scrollToEnd(force) {
  const box = $("messages");
  const nearEnd = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
  if (force || nearEnd) box.scrollTop = box.scrollHeight;
}

// ---- streaming -----------------------------------------------------------------------------------
// The data fields of a server-sent event stream, one string per event ("[DONE]" included).
async function* sseData(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const boundary = /\r?\n\r?\n/;
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let match;
    while ((match = boundary.exec(buffer)) !== null) {
      const event = buffer.slice(0, match.index);
      buffer = buffer.slice(match.index + match[0].length);
      const data = event.split(/\r?\n/)
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data) yield data;
    }
  }
}

// TTFT: from sending the request to the first generated text (the role chunk the server sends
// before the engine has run does not count). tok/s: the tokens after the first over the time
// after the first, from the server's usage when it sent one, else counted deltas (a delta may hold
// several tokens when the client lags, hence "~").
function statsText(timing, usage, finishReason, stopped) {
  const parts = [];
  if (stopped) parts.push("stopped");
  if (timing.first === null) {
    parts.push("no tokens");
    return parts.join(" · ");
  }
  parts.push(`TTFT ${Math.round(timing.first - timing.start)} ms`);
  const tokens = usage ? usage.completion_tokens : timing.deltas;
  const approx = usage ? "" : "~";
  const seconds = (timing.last - timing.first) / 1000;
  if (tokens > 1 && seconds > 0) parts.push(`${approx}${((tokens - 1) / seconds).toFixed(1)} tok/s`);
  parts.push(`${approx}${tokens} tokens`);
  if (finishReason === "length") parts.push("cut off at max_tokens");
  return parts.join(" · ");
}

async function send() {
  const text = $("input").value;
  if (!text.trim() || chat.controller !== null) return;
  let fields;
  try {
    fields = samplingFields();
  } catch (e) {
    showNotice(e.message);
    return;
  }
  hideNotice();
  $("input").value = "";
  addUserMessage(text);
  // this conversation's turns: New chat replaces the array, so a reply it stops lands in the old one
  const history = chat.history;
  history.push({ role: "user", content: text });

  const system = $("system-prompt").value.trim();
  const messages = system ? [{ role: "system", content: system }, ...history] : [...history];
  const body = { messages, ...fields, stream: true, stream_options: { include_usage: true } };
  if (chat.model !== null && !("model" in fields)) body.model = chat.model;

  const view = new ReplyView();
  const controller = new AbortController();
  chat.controller = controller;
  setBusy(true);
  const timing = { start: performance.now(), first: null, last: null, deltas: 0 };
  let usage = null;
  let finishReason = null;
  let content = "";
  try {
    const response = await fetch("v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json", ...authHeaders() },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorMessage(response));
    for await (const data of sseData(response)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      const choice = (chunk.choices || [])[0];
      if (!choice) continue;
      const delta = choice.delta || {};
      // vLLM's field is reasoning_content; its newer releases call it reasoning
      const reasoning = delta.reasoning_content ?? delta.reasoning;
      if (reasoning) view.appendReasoning(reasoning);
      if (delta.content) {
        view.appendContent(delta.content);
        content += delta.content;
      }
      if (reasoning || delta.content) {
        timing.last = performance.now();
        if (timing.first === null) timing.first = timing.last;
        timing.deltas += 1;
        scrollToEnd(false);
      }
      if (choice.finish_reason) finishReason = choice.finish_reason;
    }
    history.push({ role: "assistant", content });
    view.finish("done", statsText(timing, usage, finishReason, false));
  } catch (e) {
    if (e.name === "AbortError") {
      history.push({ role: "assistant", content });  // what was shown stays in the conversation
      view.finish("stopped", statsText(timing, null, null, true));
    } else {
      history.pop();  // the failed turn is not sent again with the next message
      view.fail(e.message);
    }
  } finally {
    if (chat.controller === controller) {
      chat.controller = null;
      setBusy(false);
    }
    scrollToEnd(false);
  }
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

function stop() {
  if (chat.controller !== null) chat.controller.abort();
}

function newChat() {
  stop();
  chat.controller = null;
  setBusy(false);
  chat.history = [];
  $("messages").replaceChildren();
  hideNotice();
  $("input").focus();
}

// ---- wiring ----------------------------------------------------------------------------------------
document.addEventListener("DOMContentLoaded", () => {
  loadSettings();
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  $("input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", newChat);
  loadModel();
  $("input").focus();
});
