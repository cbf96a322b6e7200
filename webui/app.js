// inferd's web chat: plain JavaScript over the server's OpenAI API (/v1/chat/completions,
// streamed), conversations kept in this browser's localStorage, and the server's figures from
// /metrics. No build step: the server embeds this file as it is.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = "inferd.conversations";
const SETTINGS = "inferd.settings";

const state = {
  conversations: load(STORE, []),  // [{id, title, messages: [{role, content, reasoning, stats}]}]
  current: null,                   // index into conversations
  model: "",
  controller: null,                // the AbortController of the answer streaming now
};

function load(key, fallback) {
  try {
    const v = JSON.parse(localStorage.getItem(key));
    return v === null ? fallback : v;
  } catch (e) {
    return fallback;
  }
}

function save() {
  localStorage.setItem(STORE, JSON.stringify(state.conversations));
}

const SETTING_FIELDS = ["system-prompt", "temperature", "top-p", "max-tokens", "api-key"];

function saveSettings() {
  const s = {};
  for (const f of SETTING_FIELDS) s[f] = $(f).value;
  localStorage.setItem(SETTINGS, JSON.stringify(s));
}

function restoreSettings() {
  const s = load(SETTINGS, {});
  for (const f of SETTING_FIELDS) if (s[f] !== undefined) $(f).value = s[f];
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function showError(text) {
  $("error").textContent = text;
  $("error").hidden = !text;
}

// ---- conversations ----------------------------------------------------------------------------

function newConversation() {
  state.conversations.unshift({ id: Date.now(), title: "New chat", messages: [] });
  state.current = 0;
  save();
  render();
}

function renderList() {
  const ul = $("conversations");
  ul.textContent = "";
  state.conversations.forEach((c, i) => {
    const li = document.createElement("li");
    li.textContent = c.title;
    li.title = c.title;
    if (i === state.current) li.className = "current";
    li.onclick = () => {
      if (state.controller) return;  // not while an answer streams
      state.current = i;
      render();
    };
    ul.appendChild(li);
  });
}

function messageElement(m) {
  const div = document.createElement("div");
  div.className = "message " + m.role;
  const role = document.createElement("div");
  role.className = "role";
  role.textContent = m.role;
  div.appendChild(role);
  const reasoning = document.createElement("details");
  reasoning.className = "reasoning";
  const summary = document.createElement("summary");
  summary.textContent = "Reasoning";
  reasoning.appendChild(summary);
  const rtext = document.createElement("div");
  reasoning.appendChild(rtext);
  div.appendChild(reasoning);
  const content = document.createElement("div");
  content.className = "content";
  div.appendChild(content);
  const stats = document.createElement("div");
  stats.className = "stats";
  div.appendChild(stats);
  div.update = () => {
    rtext.textContent = m.reasoning || "";
    reasoning.hidden = !m.reasoning;
    content.textContent = m.content || "";
    stats.textContent = m.stats || "";
    stats.hidden = !m.stats;
  };
  div.update();
  return div;
}

function render() {
  renderList();
  const box = $("messages");
  box.textContent = "";
  const c = state.conversations[state.current];
  if (!c) return;
  for (const m of c.messages) box.appendChild(messageElement(m));
  box.scrollTop = box.scrollHeight;
}

// ---- one answer, streamed ---------------------------------------------------------------------

// exact: the server's usage count; else (a stopped answer has none) the streamed chunks, about
// one token each, marked "≈".
function statsLine(ttft, tokens, seconds, reason, exact) {
  const parts = [];
  const about = exact ? "" : "≈";
  if (ttft !== null) parts.push("TTFT " + Math.round(ttft) + " ms");
  if (tokens > 1 && seconds > 0) parts.push(about + ((tokens - 1) / seconds).toFixed(1) + " tokens/s");
  if (tokens > 0) parts.push(about + tokens + " tokens");
  if (reason) parts.push(reason);
  return parts.join(" · ");
}

async function send(text) {
  if (state.current === null || !state.conversations[state.current]) newConversation();
  const conv = state.conversations[state.current];
  if (conv.messages.length === 0) conv.title = text.slice(0, 40);
  conv.messages.push({ role: "user", content: text });
  const answer = { role: "assistant", content: "", reasoning: "", stats: "" };
  conv.messages.push(answer);
  save();
  render();
  const el = $("messages").lastChild;

  const messages = [];
  const system = $("system-prompt").value.trim();
  if (system) messages.push({ role: "system", content: system });
  for (const m of conv.messages.slice(0, -1)) messages.push({ role: m.role, content: m.content });
  const body = {
    model: state.model,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number($("temperature").value),
    top_p: Number($("top-p").value),
    max_tokens: Number($("max-tokens").value),
  };

  state.controller = new AbortController();
  $("send").hidden = true;
  $("stop").hidden = false;
  showError("");
  const start = performance.now();
  let first = null, last = null, tokens = 0, chunks = 0, reason = "";
  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: state.controller.signal,
    });
    if (!res.ok) {
      let message = "HTTP " + res.status;
      try { message += ": " + (await res.json()).error.message; } catch (e) { /* not JSON */ }
      throw new Error(message);
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message || String(chunk.error));
          if (chunk.usage) tokens = chunk.usage.completion_tokens;
          const choice = chunk.choices && chunk.choices[0];
          if (!choice) continue;
          const d = choice.delta || {};
          if (d.content || d.reasoning_content) {
            const now = performance.now();
            if (first === null) first = now;
            last = now;
            ++chunks;
          }
          if (d.reasoning_content) answer.reasoning += d.reasoning_content;
          if (d.content) answer.content += d.content;
          if (choice.finish_reason) reason = choice.finish_reason;
          el.update();
          $("messages").scrollTop = $("messages").scrollHeight;
        }
      }
    }
  } catch (e) {
    if (e.name === "AbortError") reason = "stopped";
    else showError(String(e.message || e));
  } finally {
    const ttft = first === null ? null : first - start;
    const seconds = first !== null && last !== null ? (last - first) / 1000 : 0;
    answer.stats = statsLine(ttft, tokens > 0 ? tokens : chunks, seconds, reason, tokens > 0);
    el.update();
    save();
    state.controller = null;
    $("send").hidden = false;
    $("stop").hidden = true;
  }
}

// ---- the server's figures ---------------------------------------------------------------------

let previous = null;  // the last poll's counters, for rates over the interval

function metric(text, name) {
  // Sums every series of `name` whatever the prefix (inferd: or vllm:) and labels.
  const re = new RegExp("^\\w+:" + name + "(?:\\{[^}]*\\})? ([0-9.eE+-]+)$", "gm");
  let total = null, m;
  while ((m = re.exec(text)) !== null) total = (total || 0) + Number(m[1]);
  return total;
}

async function pollFigures() {
  if ($("server-view").hidden) return;
  try {
    const res = await fetch("/metrics", { headers: headers() });
    if (!res.ok) throw new Error("HTTP " + res.status);
    const text = await res.text();
    const now = performance.now();
    const f = {
      running: metric(text, "num_requests_running"),
      waiting: metric(text, "num_requests_waiting"),
      kv: metric(text, "kv_cache_usage_perc"),
      ttftSum: metric(text, "time_to_first_token_seconds_sum"),
      ttftCount: metric(text, "time_to_first_token_seconds_count"),
      finished: metric(text, "request_success_total"),
      generated: metric(text, "generation_tokens_total"),
      at: now,
    };
    $("fig-running").textContent = f.running;
    $("fig-waiting").textContent = f.waiting;
    $("fig-kv").textContent = f.kv === null ? "–" : (100 * f.kv).toFixed(1) + " %";
    $("fig-finished").textContent = f.finished;
    if (previous) {
      const n = f.ttftCount - previous.ttftCount;
      $("fig-ttft").textContent = n > 0 ? Math.round(1000 * (f.ttftSum - previous.ttftSum) / n) + " ms (" + n + ")"
                                        : "no new requests";
      const dt = (f.at - previous.at) / 1000;
      $("fig-tps").textContent = dt > 0 ? ((f.generated - previous.generated) / dt).toFixed(1) : "–";
    }
    previous = f;
  } catch (e) {
    $("fig-running").textContent = "unavailable: " + e.message;
  }
}

// ---- wiring -----------------------------------------------------------------------------------

function showTab(server) {
  $("tab-chat").classList.toggle("active", !server);
  $("tab-server").classList.toggle("active", server);
  $("chat-view").hidden = server;
  $("server-view").hidden = !server;
  if (server) pollFigures();
}

async function loadModel() {
  try {
    const res = await fetch("/v1/models", { headers: headers() });
    if (!res.ok) throw new Error("HTTP " + res.status + (res.status === 401 ? " (set the API key in Settings)" : ""));
    state.model = (await res.json()).data[0].id;
    $("model-name").textContent = state.model;
    showError("");
  } catch (e) {
    showError("Cannot list the models: " + e.message);
  }
}

window.addEventListener("DOMContentLoaded", () => {
  restoreSettings();
  for (const f of SETTING_FIELDS) $(f).addEventListener("change", saveSettings);
  $("api-key").addEventListener("change", loadModel);
  $("new-chat").onclick = () => { if (!state.controller) newConversation(); };
  $("tab-chat").onclick = () => showTab(false);
  $("tab-server").onclick = () => showTab(true);
  $("stop").onclick = () => { if (state.controller) state.controller.abort(); };
  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || state.controller) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) {
      ev.preventDefault();
      $("composer").requestSubmit();
    }
  });
  state.current = state.conversations.length > 0 ? 0 : null;
  render();
  loadModel();
  setInterval(pollFigures, 2000);
});
