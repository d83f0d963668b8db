// The agentkernel playground: chat with the agents of this server, watch replies stream, see each
// turn's path and the pipeline's metrics. Plain JavaScript, same-origin calls only.
// The credential lives in the input field and is read per call: never stored, logged or put in
// a URL (a WebSocket gets it as a subprotocol). Server text is always written with textContent,
// never parsed as HTML.
"use strict";

const API = "/api/v1";
const RECENT_KEY = "agentkernel.playground.sessions";
const RECENT_MAX = 20;
const METRICS_EVERY_MS = 2000;
const POLL_EVERY_MS = 250;
const POLL_LIMIT_MS = 120000;
const SOCKET_PROTOCOL = "agentkernel.v1";

const $ = (id) => document.getElementById(id);
const page = { agents: [], sessionsApi: false, socket: null, socketTurns: new Map(), up: null };

class ApiError extends Error {
  constructor(status, doc) {
    super((doc && doc.message) || `HTTP ${status}`);
    this.status = status;
    this.code = (doc && doc.error) || `HTTP_${status}`;
  }
}

// ---- credentials and calls ----------------------------------------------------------------------

function authHeaders() {
  const credential = $("credential").value.trim();
  if (!credential) return {};
  if ($("scheme").value === "bearer") return { Authorization: `Bearer ${credential}` };
  return { "X-API-Key": credential };
}

// A WebSocket handshake cannot carry a header, so the credential is offered as a second
// subprotocol, agentkernel.auth.<key|bearer>.<base64url of its UTF-8 bytes>, beside
// agentkernel.v1, the only one the server selects (it never echoes the credential).
function socketProtocols() {
  const credential = $("credential").value.trim();
  if (!credential) return [SOCKET_PROTOCOL];
  const kind = $("scheme").value === "bearer" ? "bearer" : "key";
  return [SOCKET_PROTOCOL, `agentkernel.auth.${kind}.${base64url(credential)}`];
}

function base64url(text) {
  const binary = Array.from(new TextEncoder().encode(text), (b) => String.fromCharCode(b)).join("");
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

async function call(path, options = {}) {
  const headers = { ...authHeaders(), ...(options.headers || {}) };
  const response = await fetch(path, { ...options, headers, cache: "no-store" });
  if (response.status === 401) throw new ApiError(401, await readJson(response));
  return response;
}

async function readJson(response) {
  try {
    return await response.json();
  } catch {
    return null;
  }
}

function explain(error) {
  if (error instanceof ApiError && error.status === 401) {
    const typed = $("credential").value.trim() !== "";
    return typed
      ? `The server refused this credential (401): ${error.message}. Check the key or token.`
      : "The server needs a credential (401): type an API key or bearer token at the top right.";
  }
  if (error instanceof ApiError) return `${error.code}: ${error.message}`;
  if (error instanceof TypeError) return "The server cannot be reached (is it running?).";
  return String(error.message || error);
}

function notify(text) {
  const notice = $("notice");
  notice.textContent = text || "";
  notice.hidden = !text;
}

// ---- agents and sessions ------------------------------------------------------------------------

async function loadAgents() {
  const response = await call(`${API}/agents`);
  if (!response.ok) throw new ApiError(response.status, await readJson(response));
  const doc = await response.json();
  page.agents = doc.details || (doc.agents || []).map((name) => ({ name, streaming: null }));
  $("agent-names").replaceChildren(...page.agents.map((a) => new Option(a.description || "", a.name)));
  const streaming = page.agents.find((a) => a.streaming) || page.agents[0];
  if (!$("agent").value && streaming) $("agent").value = streaming.name;
  showAgent();
}

// An IO process of a split deployment knows no agents: the name typed goes to the runners, and
// an empty one leaves the choice to them (their first agent).
function showAgent() {
  const name = $("agent").value.trim();
  const agent = page.agents.find((a) => a.name === name);
  if (!agent) {
    const known = page.agents.length ? "not one this server lists" : "this server lists no agents";
    $("agent-info").textContent = name ? `${known}; the runner decides` : "the runner's default agent";
    return;
  }
  const kind = agent.streaming === null ? "" : agent.streaming ? " (streams)" : " (one reply)";
  $("agent-info").textContent = (agent.description || "no description") + kind;
}

function recentSessions() {
  try {
    const list = JSON.parse(localStorage.getItem(RECENT_KEY) || "[]");
    return Array.isArray(list) ? list.filter((s) => typeof s === "string") : [];
  } catch {
    return [];
  }
}

function remember(sessionId) {
  const list = [sessionId, ...recentSessions().filter((s) => s !== sessionId)].slice(0, RECENT_MAX);
  try {
    localStorage.setItem(RECENT_KEY, JSON.stringify(list));
  } catch {
    // storage full or disabled: the picker still shows this page's sessions
  }
}

// The sessions API (GET /api/v1/sessions, GET /api/v1/sessions/{id}) is used when the server has
// it; until then the picker lists the sessions this browser used.
async function serverSessions() {
  try {
    const response = await call(`${API}/sessions`);
    const doc = response.ok ? await readJson(response) : null;
    const items = doc && (Array.isArray(doc) ? doc : doc.sessions);
    page.sessionsApi = Array.isArray(items);
    if (!page.sessionsApi) return [];
    return items.map((s) => (typeof s === "string" ? s : s && s.session_id)).filter(Boolean);
  } catch {
    page.sessionsApi = false;
    return [];
  }
}

async function loadSessions(probe = true) {
  const fromServer = probe ? await serverSessions() : [];
  const all = [...new Set([...fromServer, ...recentSessions()])];
  const current = $("session-id").value || all[0] || newSessionId();
  if (!all.includes(current)) all.unshift(current);
  $("session").replaceChildren(...all.map((s) => new Option(s, s)));
  $("session").value = current;
  $("session-id").value = current;
  $("session-source").textContent = page.sessionsApi
    ? "sessions from the server's sessions API"
    : "recent sessions of this browser (the server has no sessions API)";
}

function newSessionId() {
  return `pg-${crypto.randomUUID().slice(0, 8)}`;
}

async function showState(sessionId, reply) {
  const pre = $("state");
  let state = reply && reply.state;
  if (state === undefined && page.sessionsApi) {
    try {
      const response = await call(`${API}/sessions/${encodeURIComponent(sessionId)}`);
      const doc = response.ok ? await readJson(response) : null;
      state = doc ? doc.state : undefined;
    } catch {
      state = undefined;
    }
  }
  pre.classList.toggle("muted", state === undefined);
  const why = page.sessionsApi
    ? "the sessions API has no state for it yet"
    : "the reply does not carry it and the server has no sessions API";
  pre.textContent = state === undefined
    ? `state of ${sessionId}: not available (${why})`
    : JSON.stringify(state, null, 2);
}

// ---- turns ----------------------------------------------------------------------------------------

function startTurn(prompt) {
  const log = $("log");
  const you = document.createElement("li");
  you.className = "you";
  you.textContent = prompt;
  const agent = document.createElement("li");
  agent.className = "agent pending";
  const meta = document.createElement("small");
  const text = document.createElement("span");
  text.className = "text";
  agent.append(meta, text);
  log.append(you, agent);
  const turn = {
    started: performance.now(), first: null, ended: null, text, meta, item: agent,
    requestId: "", outcome: "", attempts: null, chunks: [],
  };
  turn.label = `${$("agent").value.trim() || "default agent"} · ${$("mode").selectedOptions[0].textContent}`;
  meta.textContent = turn.label;
  log.scrollTop = log.scrollHeight;
  return turn;
}

function addDelta(turn, delta) {
  const now = performance.now();
  if (turn.first === null) turn.first = now;
  turn.chunks.push({ at: now - turn.started, length: delta.length });
  turn.text.append(document.createTextNode(delta));
  turn.item.dataset.chunks = String(turn.chunks.length);
  turn.item.dataset.firstAt = String(Math.round(turn.first - turn.started));
}

function endTurn(turn, doc, status) {
  turn.ended = performance.now();
  const ok = status === 200 && !(doc && doc.error);
  turn.outcome = ok ? "200 ok" : `${status || "—"} ${(doc && doc.error) || "error"}`;
  turn.requestId = turn.requestId || (doc && doc.request_id) || "";
  if (doc && Number.isInteger(doc.attempt)) turn.attempts = doc.attempt; // the delivery that answered
  if (ok && doc && typeof doc.result === "string" && turn.chunks.length === 0) {
    if (turn.first === null) turn.first = turn.ended;
    turn.text.textContent = doc.result;
  }
  if (!ok) turn.text.textContent += (turn.text.textContent ? "\n" : "") + ((doc && doc.message) || turn.outcome);
  turn.meta.textContent = turn.label;
  turn.item.classList.remove("pending");
  turn.item.classList.toggle("failed", !ok);
  turn.item.dataset.endAt = String(Math.round(turn.ended - turn.started));
  turn.item.dataset.outcome = turn.outcome;
  addTurnRow(turn);
}

function ms(value) {
  return value === null ? "—" : `${Math.round(value)} ms`;
}

function addTurnRow(turn) {
  const row = document.createElement("tr");
  const cells = [
    turn.requestId || "—",
    turn.outcome,
    turn.attempts === null ? "n/a" : String(turn.attempts),
    turn.first === null ? "—" : ms(turn.first - turn.started),
    ms(turn.ended - turn.started),
  ];
  for (const value of cells) {
    const cell = document.createElement("td");
    cell.textContent = value;
    row.append(cell);
  }
  row.firstChild.title = turn.requestId;
  $("turns").tBodies[0].prepend(row);
}

function chatBody(prompt) {
  const agent = $("agent").value.trim();
  return { session_id: $("session-id").value.trim(), prompt, ...(agent ? { agent } : {}) };
}

async function sendSync(turn, body, prefer) {
  const headers = { "Content-Type": "application/json", ...(prefer ? { Prefer: "respond-async" } : {}) };
  const response = await call(`${API}/chat`, { method: "POST", headers, body: JSON.stringify(body) });
  const doc = await readJson(response);
  turn.requestId = (doc && doc.request_id) || "";
  if (response.status !== 202) return { doc, status: response.status };
  return pollReply(turn, response.headers.get("Location") || `${API}/chat/${encodeURIComponent(body.session_id)}?request_id=${encodeURIComponent(turn.requestId)}`);
}

async function pollReply(turn, location) {
  turn.meta.textContent = `${turn.label} · queued, polling`;
  const deadline = performance.now() + POLL_LIMIT_MS;
  while (performance.now() < deadline) {
    const response = await call(location);
    const doc = await readJson(response);
    if (!(response.status === 404 && doc && doc.error === "PENDING")) return { doc, status: response.status };
    await new Promise((resolve) => setTimeout(resolve, POLL_EVERY_MS));
  }
  return { doc: { error: "TIMEOUT", message: "no reply while the page polled" }, status: 0 };
}

async function sendStream(turn, body) {
  const headers = { "Content-Type": "application/json", Accept: "text/event-stream" };
  const response = await call(`${API}/chat`, { method: "POST", headers, body: JSON.stringify(body) });
  turn.requestId = response.headers.get("X-Request-Id") || "";
  if (!response.ok || !response.body) return { doc: await readJson(response), status: response.status };
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return { doc: { error: "STREAM_CLOSED", message: "the stream ended without a done frame" }, status: 0 };
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const frame = parseEvent(buffer.slice(0, cut));
      buffer = buffer.slice(cut + 2);
      if (frame && frame.done) return { doc: frame, status: frame.status_code || (frame.error ? 500 : 200) };
      if (frame && typeof frame.delta === "string") addDelta(turn, frame.delta);
    }
  }
}

function parseEvent(block) {
  const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim());
  if (data.length === 0) return null;
  try {
    return JSON.parse(data.join("\n"));
  } catch {
    return null;
  }
}

// ---- WebSocket --------------------------------------------------------------------------------------

function openSocket() {
  if (page.socket && page.socket.readyState <= WebSocket.OPEN) return page.socket.ready;
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const socket = new WebSocket(`${scheme}//${location.host}/ws`, socketProtocols());
  socket.ready = new Promise((resolve, reject) => {
    socket.addEventListener("open", () => resolve(socket));
    socket.addEventListener("error", () => reject(new Error("the WebSocket handshake failed")));
  });
  socket.addEventListener("message", (event) => onSocketFrame(event.data));
  socket.addEventListener("close", () => {
    for (const [, pending] of page.socketTurns) pending.resolve({ doc: { error: "DISCONNECTED", message: "the WebSocket closed during the turn" }, status: 0 });
    page.socketTurns.clear();
    if (page.socket === socket) page.socket = null;
  });
  page.socket = socket;
  return socket.ready;
}

function onSocketFrame(text) {
  let frame;
  try {
    frame = JSON.parse(text);
  } catch {
    return;
  }
  const pending = page.socketTurns.get(frame.request_id);
  if (!pending) return;
  if (frame.type === "STREAM_CHUNK" && frame.done) finishSocketTurn(frame, frame.status_code || (frame.error ? 500 : 200));
  else if (frame.type === "STREAM_CHUNK") addDelta(pending.turn, frame.delta || "");
  else if (frame.type === "CHAT_RESPONSE") finishSocketTurn(frame, frame.status_code || 200);
  else if (frame.type === "SYSTEM_RESPONSE") finishSocketTurn(frame, 0);
}

function finishSocketTurn(frame, status) {
  const pending = page.socketTurns.get(frame.request_id);
  page.socketTurns.delete(frame.request_id);
  pending.resolve({ doc: frame, status });
}

// A browser tells a script nothing about a refused handshake, not even its status: the page
// asks an HTTP route with the same credential whether the credential (401) or the server
// (unreachable) is the reason.
async function whySocketFailed() {
  await call(`${API}/agents`); // throws ApiError on a 401, TypeError when unreachable
  throw new Error("The WebSocket handshake failed although the server answers over HTTP.");
}

async function sendSocket(turn, body) {
  const socket = await openSocket().catch(whySocketFailed);
  const clientId = `pg-${crypto.randomUUID()}`;
  turn.requestId = clientId;
  const reply = new Promise((resolve) => page.socketTurns.set(clientId, { turn, resolve }));
  socket.send(JSON.stringify({ route: "chat", request_id: clientId, body: { ...body, stream: true } }));
  return reply;
}

async function send(event) {
  event.preventDefault();
  const prompt = $("prompt").value;
  const sessionId = $("session-id").value.trim();
  if (!prompt.trim() || !sessionId) return notify("Type a message and pick a session first.");
  notify("");
  $("prompt").value = "";
  remember(sessionId);
  const turn = startTurn(prompt);
  const mode = $("mode").value;
  const body = chatBody(prompt);
  let answer;
  try {
    if (mode === "stream") answer = await sendStream(turn, body);
    else if (mode === "ws") answer = await sendSocket(turn, body);
    else answer = await sendSync(turn, body, mode === "async");
  } catch (error) {
    answer = { doc: { error: error.code || "FAILED", message: explain(error) }, status: error.status || 0 };
    notify(explain(error));
  }
  endTurn(turn, answer.doc, answer.status);
  if (answer.doc && answer.doc.error && answer.status !== 401) notify(`The turn failed: ${answer.doc.error}: ${answer.doc.message || ""}`);
  await showState(sessionId, answer.doc);
  await loadSessions(page.sessionsApi);
}

// ---- pipeline metrics ---------------------------------------------------------------------------

// Prometheus text format: "name{label="value",...} number" lines; comments start with "#".
// A metric the server declares ("# TYPE") without samples yet reads as 0.
function parseMetrics(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    const declared = /^# TYPE (\S+) (counter|gauge)/.exec(line);
    if (declared) samples.push({ name: declared[1], labels: {}, value: 0, declared: true });
    const match = /^([a-zA-Z_:][\w:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const labels = {};
    for (const pair of (match[3] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[pair[1]] = pair[2];
    samples.push({ name: match[1], labels, value: Number(match[4]) });
  }
  return samples;
}

function sum(samples, name, filter = () => true) {
  const found = samples.filter((s) => s.name === name && filter(s.labels));
  return found.length ? found.reduce((total, s) => total + s.value, 0) : null;
}

function pipelineRows(samples) {
  const rows = [];
  const depths = samples.filter((s) => s.name === "agentkernel_queue_depth" && !s.declared);
  const queues = [...new Set(depths.map((s) => s.labels.queue))];
  for (const queue of queues) rows.push([`queue depth: ${queue}`, sum(samples, "agentkernel_queue_depth", (l) => l.queue === queue)]);
  if (queues.length === 0) rows.push(["queue depth", null]);
  rows.push(["turns in flight", sum(samples, "agentkernel_turns_in_flight")]);
  rows.push(["turns finished", sum(samples, "agentkernel_turns_total")]);
  rows.push(["redeliveries", sum(samples, "agentkernel_redeliveries_total")]);
  rows.push(["permanent failures", sum(samples, "agentkernel_permanent_failures_total")]);
  return rows;
}

function showPipeline(rows, note) {
  const list = $("pipeline");
  list.replaceChildren();
  for (const [label, value] of rows) {
    const term = document.createElement("dt");
    term.textContent = label;
    const data = document.createElement("dd");
    data.textContent = value === null ? "—" : String(value);
    data.dataset.metric = label;
    list.append(term, data);
  }
  $("metrics-at").textContent = note;
}

function serverIs(up) {
  const pill = $("server");
  pill.dataset.up = String(up);
  pill.textContent = up ? "server: up" : "server: unreachable";
  const cameBack = up && page.up === false;
  page.up = up;
  if (cameBack) {
    if (page.socket) page.socket.close();
    refresh();
  }
}

async function pollMetrics() {
  if (document.hidden) return void setTimeout(pollMetrics, METRICS_EVERY_MS); // nobody looks
  try {
    const response = await call("/metrics");
    serverIs(true);
    if (!response.ok) return showPipeline([], `metrics: HTTP ${response.status}`);
    showPipeline(pipelineRows(parseMetrics(await response.text())), `at ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    serverIs(!(error instanceof TypeError));
    showPipeline([], error instanceof ApiError ? "metrics need the credential" : "server unreachable");
  } finally {
    setTimeout(pollMetrics, METRICS_EVERY_MS);
  }
}

// ---- start --------------------------------------------------------------------------------------

async function refresh() {
  try {
    await loadAgents();
    await loadSessions();
    notify("");
  } catch (error) {
    notify(explain(error));
  }
}

function credentialChanged() {
  if (page.socket) page.socket.close(); // a socket keeps the identity it was opened with
  refresh();
}

function start() {
  $("composer").addEventListener("submit", send);
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) send(event);
  });
  $("agent").addEventListener("input", showAgent);
  $("session").addEventListener("change", () => {
    $("session-id").value = $("session").value;
    showState($("session").value, null);
  });
  $("new-session").addEventListener("click", () => {
    $("session-id").value = newSessionId();
    $("state").textContent = "new session: no turn yet";
  });
  $("auth").addEventListener("submit", (event) => {
    event.preventDefault();
    credentialChanged();
  });
  $("credential").addEventListener("change", credentialChanged);
  $("scheme").addEventListener("change", credentialChanged);
  refresh();
  pollMetrics();
}

start();
