// Shoal's dashboard: the fleet at /, an agent at /agents/<id>.
"use strict";

const $ = (s, el = document) => el.querySelector(s);
const el = (tag, props = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = shown(v);
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) if (k != null) e.append(k);
  return e;
};
const age = (secs) => {
  if (!(secs >= 0)) return "";
  if (secs < 60) return Math.round(secs) + "s";
  if (secs < 3600) return Math.round(secs / 60) + "m";
  if (secs < 86400) return Math.round(secs / 3600) + "h";
  return Math.round(secs / 86400) + "d";
};
const num = (n) => (n || 0).toLocaleString("en");
// shown is text as the page may show it: the characters that make a
// browser show text in another order than it is (bidirectional
// overrides, embeddings, isolates and marks) written as \u escapes, so
// what an agent wrote (a command a person is asked to allow) reads as
// what it is. Every text of the fabric's the page shows goes through it.
const unordering = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
const shown = (s) => String(s).replace(unordering, (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));
const pretty = (raw) => {
  if (raw == null || raw === "") return "";
  if (typeof raw === "string") { try { return JSON.stringify(JSON.parse(raw), null, 2); } catch { return raw; } }
  return JSON.stringify(raw, null, 2);
};

// window.shoal is the page's state, for people poking at it in the
// console and for the browser tests: received is every event number the
// stream delivered, seen those shown.
const shoal = (window.shoal = { role: "", received: [], seen: [], connects: 0, source: null, notified: [], told: new Set(JSON.parse(sessionStorage.getItem("shoal.told") || "[]")), notifyAsked: false });

async function api(path, body) {
  const init = body === undefined ? {} : { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
  const r = await fetch(path, init);
  const data = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error((data.error && data.error.message) || r.status + " " + r.statusText);
  return data;
}

function setRole(role) {
  shoal.role = role;
  $("#role").textContent = role === "full" ? "full access" : role === "observer" ? "observer: watching only" : "";
  for (const e of document.querySelectorAll(".acting")) e.hidden = role !== "full";
}

// ---- the fleet ----

// presets fills the Open form's choices from the server's own list (the
// open request's schema), so the form offers exactly what an open takes.
async function presets() {
  const who = await api("/api/whoami");
  $("#presets").replaceChildren(...who.presets.map((p) => el("option", { value: p, text: p })));
  $("#presets").value = "default";
  shoal.presets = who.presets;
}

// twoStep makes a button act only on a second click within five seconds:
// the first says what the second will do.
function twoStep(button, again, act) {
  const label = button.textContent;
  let armed = null;
  button.addEventListener("click", () => {
    if (armed) {
      clearTimeout(armed);
      armed = null;
      button.textContent = label;
      delete button.dataset.armed;
      act();
      return;
    }
    button.textContent = again;
    button.dataset.armed = "1";
    armed = setTimeout(() => { armed = null; button.textContent = label; delete button.dataset.armed; }, 5000);
  });
}

function fleetPage() {
  $("#fleet").hidden = false;
  document.title = "Shoal: fleet";
  presets().catch((e) => { $("#open-error").textContent = shown(e.message); });
  askToNotify();
  let last = null;
  const filter = $("#filter");
  filter.addEventListener("input", () => last && renderFleet(last, filter.value));
  $("#show-dead").addEventListener("change", () => last && renderFleet(last, filter.value));
  $("#open-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    const req = { cwd: f.get("cwd") };
    for (const k of ["model", "permission", "id", "ref"]) if (f.get(k)) req[k] = f.get(k);
    if (f.get("repo")) req.repo = true;
    $("#open-error").textContent = "";
    try {
      const rep = await api("/api/open", req);
      location.href = "/agents/" + encodeURIComponent(rep.agent_id);
    } catch (e) { $("#open-error").textContent = shown(e.message); }
  });
  const poll = async () => {
    try {
      last = await api("/api/fleet");
      setRole(last.role);
      renderFleet(last, filter.value);
    } catch (e) { $("#role").textContent = shown("cannot reach the coordinator: " + e.message); }
    // Every three seconds, and not while the page is not seen.
    setTimeout(poll, document.hidden ? 10000 : 3000);
  };
  poll();
}

function matchesFilter(q, ...fields) {
  if (!q) return true;
  q = q.toLowerCase();
  return fields.some((f) => String(f ?? "").toLowerCase().includes(q));
}

// notify raises a browser notification (once the person has allowed
// them: asked once, on the first page they open) and keeps it in
// window.shoal.notified.
function notify(title, body) {
  shoal.notified.push({ title, body });
  if ("Notification" in window && Notification.permission === "granted") new Notification(shown(title), { body: shown(body) });
}

function askToNotify() {
  if (!("Notification" in window) || Notification.permission !== "default" || localStorage.getItem("shoal.notify.asked")) return;
  localStorage.setItem("shoal.notify.asked", "1");
  shoal.notifyAsked = true;
  Notification.requestPermission().catch(() => {});
}

// waitingFor tells the person of permission requests: a badge and the
// title say how many wait, and each new one is a notification.
function waitingFor(pending) {
  const n = pending.length;
  $("#waiting-badge").hidden = n === 0;
  $("#waiting-badge").textContent = n + " waiting";
  document.title = (n ? "(" + n + ") " : "") + "Shoal: fleet";
  for (const p of pending) {
    if (shoal.told.has(p.request_id)) continue;
    shoal.told.add(p.request_id);
    sessionStorage.setItem("shoal.told", JSON.stringify([...shoal.told].slice(-500)));
    notify("shoal: agent " + p.agent_id + " waits for you", p.tool + " " + (p.description || JSON.stringify(p.input || {})));
  }
}

function renderFleet(f, q) {
  waitingFor(f.pending);
  const waiting = Object.create(null); // keyed by what agents are named: no prototype to read through
  for (const p of f.pending) waiting[p.agent_id] = (waiting[p.agent_id] || 0) + 1;
  const nodes = $("#nodes tbody");
  nodes.replaceChildren(...f.nodes.filter((n) => matchesFilter(q, n.name, JSON.stringify(n.labels), (n.backends || []).map((b) => b.kind + " " + (b.models || []).join(" ")).join(" "))).map((n) => {
    // A badge per backend: ready or not, the version or the reason on
    // hover, never the raw error in the table.
    const backends = (n.backends || []).map((b) => el("span", {
      class: "badge " + (b.ready ? "ready" : "not-ready"), "data-backend": b.kind + (b.agent ? ":" + b.agent : ""),
      title: b.ready ? (b.version || "ready") : "not ready: " + (b.problem || "no reason given"),
      text: b.kind + (b.agent ? ":" + b.agent : ""),
    }));
    const models = [...new Set((n.backends || []).flatMap((b) => b.models || []))].join(", ");
    const labels = Object.entries(n.labels || {}).map(([k, v]) => k + "=" + v).join(", ");
    return el("tr", { "data-node": n.name },
      el("td", { text: n.name }), el("td", { class: "badges" }, ...backends), el("td", { text: models }), el("td", { text: labels }),
      el("td", { class: "num", text: n.agents + (n.max_agents ? " / " + n.max_agents : "") }),
      el("td", { class: "num", text: age(f.now - n.heartbeat) + " ago" }));
  }));
  // Live agents first; the dead behind a toggle.
  const dead = f.agents.filter((a) => a.status === "dead").length;
  $("#show-dead-count").textContent = String(dead);
  const showDead = $("#show-dead").checked;
  const listed = [...f.agents.filter((a) => a.status !== "dead"), ...(showDead ? f.agents.filter((a) => a.status === "dead") : [])];
  const agents = $("#agents tbody");
  agents.replaceChildren(...listed.filter((a) => matchesFilter(q, a.id, a.status, a.model, a.node, a.cwd)).map((a) => {
    const st = el("span", { class: "status " + a.status, text: a.status });
    const w = waiting[a.id] ? el("span", { class: "status waiting", text: "⚠ " + waiting[a.id] + " waiting" }) : null;
    return el("tr", { "data-agent": a.id },
      el("td", {}, el("a", { href: "/agents/" + encodeURIComponent(a.id), text: a.id })),
      el("td", {}, st, w ? " " : null, w), el("td", { text: a.model }), el("td", { text: a.node }), el("td", { text: a.cwd }),
      el("td", { class: "num", text: a.turn }),
      el("td", { class: "num tokens", text: num(a.usage.inputTokens) + " / " + num(a.usage.outputTokens) }),
      el("td", { class: "num cost", text: cost(a.usage.costUsd) }),
      el("td", { class: "num", text: a.last_activity ? age(f.now - a.last_activity) + " ago" : "" }));
  }));
  const totals = (sel, m) => $(sel + " tbody").replaceChildren(...Object.keys(m).sort().map((k) =>
    el("tr", { "data-key": k }, el("td", { text: k || "(none)" }), el("td", { class: "num", text: num(m[k].inputTokens) }),
      el("td", { class: "num", text: num(m[k].outputTokens) }), el("td", { class: "num", text: num(m[k].cacheReadTokens) }),
      el("td", { class: "num", text: num(m[k].cacheCreationTokens) }))));
  totals("#by-node", f.tokens_by_node);
  totals("#by-model", f.tokens_by_model);
  renderSpend(f.spend);
}

// A cost as people read it: "-" where none was reported (never 0).
function cost(c) { return c === null || c === undefined ? "-" : "$" + c.toFixed(4); }

function tokensOf(u) { return (u.inputTokens || 0) + (u.outputTokens || 0) + (u.cacheReadTokens || 0) + (u.cacheCreationTokens || 0); }

// What the fleet spent, from the coordinator's count, and every budget
// with what was used against it.
function renderSpend(spend) {
  if (!spend) {
    $("#fleet-spend").textContent = "The coordinator's count of spend could not be read.";
    $("#budgets tbody").replaceChildren();
    return;
  }
  let used = { inputTokens: 0, outputTokens: 0, cacheReadTokens: 0, cacheCreationTokens: 0, costUsd: null }, turns = 0;
  for (const r of spend.spent.rows || []) {
    for (const k of ["inputTokens", "outputTokens", "cacheReadTokens", "cacheCreationTokens"]) used[k] += r.usage[k] || 0;
    if (r.usage.costUsd !== null && r.usage.costUsd !== undefined) used.costUsd = (used.costUsd || 0) + r.usage.costUsd;
    turns += r.turns;
  }
  $("#fleet-spend").textContent = "The fleet's turns used " + num(tokensOf(used)) + " tokens, cost " + cost(used.costUsd) + ", in " + num(turns) + " turns.";
  $("#budgets tbody").replaceChildren(...spend.budgets.map((b) => {
    const who = b.fleet ? "the fleet" : b.label ? "label " + b.label : "agent " + b.agent_id;
    const limit = [b.budget.tokens ? num(b.budget.tokens) + " tokens" : "", b.budget.usd ? "$" + b.budget.usd.toFixed(4) : ""].filter(Boolean).join(", ");
    const reached = (b.budget.tokens && tokensOf(b.used) >= b.budget.tokens) || (b.budget.usd && b.used.costUsd !== null && b.used.costUsd >= b.budget.usd);
    return el("tr", { "data-budget": who },
      el("td", { text: who }), el("td", { class: "num", text: limit }), el("td", { class: "num", text: num(tokensOf(b.used)) }),
      el("td", { class: "num", text: cost(b.used.costUsd) }),
      el("td", {}, el("span", { class: "status " + (reached ? "reached" : "within"), text: reached ? "reached: turns are refused" : "within" })));
  }));
}

// ---- an agent ----

function agentPage(id) {
  $("#agent").hidden = false;
  document.title = "Shoal: " + id;
  $("#agent-id").textContent = id;
  const base = "/api/agents/" + encodeURIComponent(id);
  const act = async (path, body) => {
    $("#act-error").textContent = "";
    try { return await api(base + path, body); } catch (e) { $("#act-error").textContent = shown(e.message); throw e; }
  };
  $("#send-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const t = ev.target.elements.text;
    await act("/send", { text: t.value }).then(() => { t.value = ""; }, () => {});
  });
  const said = (text) => { $("#act-status").textContent = shown(text); };
  twoStep($("#interrupt"), "Interrupt: click again", () => act("/interrupt", {}).then(
    (r) => said(r.interrupted ? "interrupted" : "nothing was running"), () => {}));
  twoStep($("#close"), "Close: click again", () => act("/close", {}).then(
    (r) => said(r.closed ? "closed" : "it was not open"), () => {}));
  $("#model-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const model = ev.target.elements.model.value;
    act("/model", { model }).then(
      (r) => said(r.switched ? "switched to " + model : "not switched: " + (r.reason || "the agent cannot switch in place")), () => {});
  });
  $("#show-diff").addEventListener("click", async () => {
    $("#diff").textContent = "reading…";
    try {
      const d = await api(base + "/diff");
      $("#diff").textContent = shown(d.diff || "(no changes)");
      $("#diff").dataset.files = d.files;
    } catch (e) { $("#diff").textContent = shown(e.message); }
  });
  $("#replay-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const k of ["event", "turn", "time"]) { const v = ev.target.elements[k].value.trim(); if (v) q.set(k, v); }
    location.search = q.toString();
  });
  const answered = new Set();
  const poll = async () => {
    try {
      const p = await api(base);
      setRole(p.role);
      renderFacts(p.record);
      renderPermits(p.pending, act, answered);
    } catch (e) { $("#stream-state").textContent = shown(e.message); }
    setTimeout(poll, 1000);
  };
  poll();
  stream(base + "/events" + location.search);
}

function renderFacts(r) {
  const u = r.usage || {};
  const facts = [["status", r.status], ["model", r.model], ["node", r.node], ["directory", r.cwd], ["turn", r.turn],
    ["tokens in/out", num(u.inputTokens) + " / " + num(u.outputTokens)], ["cost", cost(u.costUsd)], ["last activity", r.last_activity ? new Date(r.last_activity * 1000).toLocaleTimeString() : ""]];
  const ws = r.workspace;
  if (ws) facts.push(["repository", ws.source + " (" + ws.branch + " from " + ws.base.slice(0, 12) + ")"]);
  $("#agent-facts").replaceChildren(...facts.map(([k, v]) => el("div", { "data-fact": k }, el("dt", { text: k }), el("dd", { text: v }))));
  $("#changes").hidden = !ws;
  if (ws) $("#changes-head").textContent = "The agent's work on " + ws.branch + " against " + ws.base.slice(0, 12) + ", committed or not; shoal fetch " + r.id + " brings it back.";
}

function renderPermits(pending, act, answered) {
  const list = pending.filter((p) => !answered.has(p.request_id));
  $("#permits").hidden = list.length === 0;
  const have = new Set([...document.querySelectorAll(".permit")].map((e) => e.dataset.request));
  if (list.length === have.size && list.every((p) => have.has(p.request_id))) return;
  $("#permit-list").replaceChildren(...list.map((p) => {
    const msg = el("input", { "aria-label": "Message with a denial of " + p.tool, placeholder: "message (with deny)" });
    const answer = (decision) => () => {
      const body = { request_id: p.request_id, decision };
      if (decision === "deny" && msg.value) body.message = msg.value;
      act("/permit", body).then(() => { answered.add(p.request_id); renderPermits(pending, act, answered); }, () => {});
    };
    return el("div", { class: "permit", "data-request": p.request_id },
      el("strong", { text: p.tool }), p.description ? el("span", { text: " " + p.description }) : null,
      el("pre", { class: "input", text: pretty(p.input) }),
      el("div", { class: "row acting" + (shoal.role === "full" ? "" : " hidden"), ...(shoal.role === "full" ? {} : { hidden: "" }) },
        el("button", { type: "button", class: "allow", "aria-label": "Allow " + p.tool, onclick: answer("allow") }, "Allow"),
        el("button", { type: "button", class: "deny", "aria-label": "Deny " + p.tool, onclick: answer("deny") }, "Deny"), msg));
  }));
}

// stream follows the agent's events. The browser's EventSource resumes a
// dropped stream by itself, sending Last-Event-ID; should it give up, the
// page starts a new one after the last event it has.
function stream(url) {
  const view = new Transcript($("#stream"));
  let last = 0;
  const open = (u) => {
    const es = new EventSource(u);
    shoal.source = es;
    es.onopen = () => { shoal.connects++; $("#stream-state").textContent = "live"; };
    es.onmessage = (m) => {
      const d = JSON.parse(m.data);
      shoal.received.push(d.n);
      if (d.n <= last) return; // never twice
      last = d.n;
      shoal.seen.push(d.n);
      view.add(d);
    };
    es.addEventListener("gap", (m) => { const g = JSON.parse(m.data); view.note("error-ev", "events " + g.from + " to " + g.to + " are missing from the stream"); });
    es.addEventListener("stray", (m) => view.note("error-ev", "not an event: " + JSON.parse(m.data).reason));
    es.addEventListener("failure", (m) => { es.close(); $("#stream-state").textContent = shown("stream failed: " + JSON.parse(m.data).message); });
    es.addEventListener("end", () => { es.close(); $("#stream-state").textContent = "end of the stored events"; });
    es.onerror = () => {
      $("#stream-state").textContent = "reconnecting…";
      if (es.readyState === EventSource.CLOSED && shoal.source === es) {
        setTimeout(() => open(url.split("?")[0] + "?event=" + (last + 1)), 1000);
      }
    };
  };
  open(url);
}

// Transcript renders events: deltas appended to an open block that the
// authoritative block then replaces; tool calls as cards.
// markdown renders an agent's text as people read it: headings, lists,
// quotes, fenced and inline code, bold, italics and links, built as DOM
// nodes from text (never as HTML), so nothing in it runs.
function markdown(src) {
  const out = document.createDocumentFragment();
  const lines = src.split("\n");
  let list = null;
  const inline = (text, parent) => {
    const re = /(`[^`]+`|\*\*[^*]+\*\*|\*[^*\s][^*]*\*|\[[^\]]+\]\((https?:\/\/[^)\s]+)\))/g;
    let at = 0;
    for (const m of text.matchAll(re)) {
      if (m.index > at) parent.append(shown(text.slice(at, m.index)));
      const t = m[0];
      if (t.startsWith("`")) parent.append(el("code", { text: t.slice(1, -1) }));
      else if (t.startsWith("**")) parent.append(el("strong", { text: t.slice(2, -2) }));
      else if (t.startsWith("*")) parent.append(el("em", { text: t.slice(1, -1) }));
      else parent.append(el("a", { href: m[2], rel: "noopener noreferrer", target: "_blank", text: t.slice(1, t.indexOf("]")) }));
      at = m.index + t.length;
    }
    if (at < text.length) parent.append(shown(text.slice(at)));
    return parent;
  };
  for (let i = 0; i < lines.length; i++) {
    const l = lines[i];
    const fence = l.match(/^```(\S*)/);
    if (fence) {
      const code = [];
      for (i++; i < lines.length && !lines[i].startsWith("```"); i++) code.push(lines[i]);
      out.append(el("pre", { class: "code", "data-lang": fence[1] || "" }, el("code", { text: code.join("\n") })));
      list = null;
      continue;
    }
    const item = l.match(/^\s*(?:[-*+]|(\d+)[.)])\s+(.*)$/);
    if (item) {
      const tag = item[1] ? "ol" : "ul";
      if (!list || list.tagName.toLowerCase() !== tag) { list = el(tag); out.append(list); }
      list.append(inline(item[2], el("li")));
      continue;
    }
    list = null;
    const h = l.match(/^(#{1,4})\s+(.*)$/);
    if (h) { out.append(inline(h[2], el("h" + Math.min(6, h[1].length + 2)))); continue; }
    if (l.startsWith(">")) { out.append(inline(l.replace(/^>\s?/, ""), el("blockquote"))); continue; }
    if (l.trim() === "") continue;
    out.append(inline(l, el("p")));
  }
  return out;
}

// editDiff shows an Edit or Write tool call's input as the change it
// makes: the lines it takes out and puts in.
function editDiff(title, input) {
  let v = input;
  if (typeof v === "string") { try { v = JSON.parse(v); } catch { return null; } }
  if (!v || typeof v !== "object") return null;
  const path = v.file_path || v.filePath || v.path || "";
  let minus = [], plus = [];
  if (title === "Edit" && typeof v.old_string === "string" && typeof v.new_string === "string") {
    minus = v.old_string.split("\n"); plus = v.new_string.split("\n");
  } else if (title === "Write" && typeof v.content === "string") {
    plus = v.content.split("\n");
  } else return null;
  return el("div", { class: "diff-view", "data-path": path },
    el("div", { class: "label", text: path }),
    ...minus.map((x) => el("div", { class: "del", text: "- " + x })),
    ...plus.map((x) => el("div", { class: "add", text: "+ " + x })));
}

// folded is a long text shown as its first lines and a button for the
// rest.
function folded(text) {
  const lines = text.split("\n");
  if (lines.length <= 40) return el("pre", { text });
  const pre = el("pre", { class: "folded", text: lines.slice(0, 20).join("\n") });
  const more = el("button", { type: "button", class: "more", text: "Show all " + lines.length + " lines" });
  more.addEventListener("click", () => { pre.textContent = shown(text); pre.classList.remove("folded"); more.remove(); });
  return el("div", {}, pre, more);
}

class Transcript {
  constructor(root) { this.root = root; this.open = Object.create(null); this.tools = Object.create(null); this.turn = -1; }

  note(cls, text) { this.root.append(el("div", { class: cls, text })); }

  block(kind, text, delta, n) {
    let b = this.open[kind];
    if (!b) {
      b = el("div", { class: (kind === "thought" ? "thought" : "text msg agent") + " streaming" });
      // Thinking is folded: open while it streams, closed once whole.
      this.root.append(kind === "thought" ? el("details", { class: "thinking", open: "" }, el("summary", { text: "Thinking" }), b) : b);
      this.open[kind] = b;
    }
    b.dataset.n = n;
    if (delta) { b.textContent += shown(text); return; }
    b.classList.remove("streaming");
    delete this.open[kind];
    if (kind === "thought") {
      b.textContent = shown(text);
      if (b.parentElement && b.parentElement.tagName === "DETAILS") b.parentElement.open = false;
      return;
    }
    b.replaceChildren(markdown(text));
  }

  tool(id) {
    let c = this.tools[id];
    if (!c) {
      const summary = el("summary", { text: "tool" });
      const input = el("pre", { class: "input" });
      const result = el("div", { class: "result" });
      c = { card: el("details", { class: "tool", "data-tool": id }, summary, el("div", { class: "body" }, el("div", { class: "label", text: "input" }), input, el("div", { class: "label", text: "result" }), result)), summary, input, result, partial: "", title: "tool", status: "" };
      this.root.append(c.card);
      this.tools[id] = c;
    }
    return c;
  }

  label(c) { c.summary.textContent = shown(c.title + (c.status ? " · " + c.status : "")); }

  add(d) {
    const e = d.event || {};
    const data = e.data || {};
    if (e.turn !== this.turn && e.turn > 0 && d.kind !== "status") {
      this.turn = e.turn;
      this.open = Object.create(null);
      this.root.append(el("div", { class: "turn", "data-turn": e.turn, text: "Turn " + e.turn }));
    }
    switch (d.kind) {
      case "assistant_text":
      case "thought": {
        const c = data.content || {};
        if (c.type === "image") { this.root.append(el("div", { class: "text" }, img(c))); break; }
        this.block(d.kind, c.text || "", !!data.delta, d.n);
        break;
      }
      case "user_text":
        this.root.append(el("div", { class: "user msg person", text: (data.content && data.content.text) || "" }));
        break;
      case "tool_use": {
        const call = data.call || {};
        const c = this.tool(call.toolCallId);
        c.title = call.title || call.kind || "tool";
        c.status = call.status || c.status;
        if (call.rawInput != null) {
          const diff = editDiff(c.title, call.rawInput);
          if (diff) c.input.replaceChildren(diff); else c.input.textContent = shown(pretty(call.rawInput));
        }
        this.label(c);
        break;
      }
      case "tool_input_delta": {
        const c = this.tool(data.toolCallId);
        c.partial += data.partialJson || "";
        c.input.textContent = shown(c.partial);
        break;
      }
      case "tool_result": {
        const u = data.update || {};
        const c = this.tool(u.toolCallId);
        if (u.status) c.status = u.status;
        if (u.title) c.title = u.title;
        if (u.rawInput != null) c.input.textContent = shown(pretty(u.rawInput));
        const parts = [];
        for (const tc of u.content || []) {
          const b = tc.content || {};
          if (b.type === "image") parts.push(img(b));
          else if (b.text != null) parts.push(folded(b.text));
          else if (tc.type === "diff") parts.push(el("pre", { text: (tc.path || "") + "\n" + (tc.newText || "") }));
        }
        if (!parts.length && u.rawOutput != null) parts.push(el("pre", { text: pretty(u.rawOutput) }));
        if (parts.length) c.result.replaceChildren(...parts);
        this.label(c);
        break;
      }
      case "permission": {
        const a = data.answer;
        const text = a ? "permission " + (data.tool || "") + ": " + a.decision + " by " + a.by + (a.message ? " (" + a.message + ")" : "")
          : "permission asked for " + (data.tool || (data.toolCall && data.toolCall.title) || "a tool") + "\n" + pretty(data.input);
        this.root.append(el("div", { class: "permission", "data-request": data.requestId || "", text }));
        break;
      }
      case "result": {
        const u = data.usage;
        this.open = Object.create(null);
        this.root.append(el("div", { class: "end", "data-turn-end": e.turn, text: "end of turn " + e.turn + " · " + (data.stopReason || "") +
          (u ? " · " + num(u.inputTokens) + " in, " + num(u.outputTokens) + " out" + (u.cacheReadTokens ? ", " + num(u.cacheReadTokens) + " cache read" : "") + (u.costUsd ? ", $" + u.costUsd.toFixed(4) : "") : " · no usage reported") }));
        break;
      }
      case "error":
        this.root.append(el("div", { class: "error-ev", text: data.message || "error" }));
        break;
      case "status":
        // Said in the page's header, not as a card in the conversation.
        shoal.status = data.status;
        $("#agent-status").textContent = shown(data.status);
        $("#agent-status").className = "status " + data.status;
        break;
      case "plan":
        this.root.append(el("div", { class: "text", text: (data.entries || []).map((x) => (x.status === "completed" ? "☑ " : "☐ ") + x.content).join("\n") }));
        break;
    }
  }
}

function img(b) {
  return el("img", { src: "data:" + (b.mimeType || "image/png") + ";base64," + (b.data || ""), alt: b.name || "image" });
}

const m = location.pathname.match(/^\/agents\/([^/]+)$/);
if (m) agentPage(decodeURIComponent(m[1]));
else fleetPage();
