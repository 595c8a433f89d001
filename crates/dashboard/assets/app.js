// agent-relay dashboard. Plain JavaScript, no build step, no network beyond this relay.
// Every text from the relay goes into the page as text (textContent), never as HTML.
'use strict';

const TOKEN = new URLSearchParams(location.search).get('token') || '';
const FLOW_MAX = 200;
const $ = (sel) => document.querySelector(sel);

function url(path, params = {}) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, v);
  q.set('token', TOKEN);
  return `${path}?${q}`;
}

async function api(path, params) {
  const res = await fetch(url(path, params), { cache: 'no-store' });
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error((body.error && body.error.message) || `${res.status} ${res.statusText}`);
  return body;
}

// A function that runs `fn` once, `ms` (or the delay given to its first call) after the first
// of the calls made meanwhile: a burst of events reloads a view once.
function coalesced(fn, ms) {
  let timer = null;
  return (delay = ms) => {
    if (timer) return;
    timer = setTimeout(() => { timer = null; fn(); }, delay);
  };
}

// el('li', {class: 'x', dataset: {id}}, 'text', child...)
function el(tag, attrs = {}, ...kids) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') n.className = v;
    else if (k === 'dataset') Object.assign(n.dataset, v);
    else if (k.startsWith('on')) n.addEventListener(k.slice(2), v);
    else n.setAttribute(k, v);
  }
  for (const kid of kids.flat(Infinity)) if (kid !== null && kid !== undefined && kid !== false) n.append(kid instanceof Node ? kid : String(kid));
  return n;
}

const pad = (n) => String(n).padStart(2, '0');
function clock(ms) { const d = new Date(ms); return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`; }
function ago(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.round(s / 60)}m ago`;
  if (s < 86400) return `${Math.round(s / 3600)}h ago`;
  return new Date(ms).toLocaleDateString();
}
const fmt = (n) => Number(n).toLocaleString();

// ---- state ----
const flow = new Map(); // id -> {rec, li}
const acceptedAt = new Map(); // id -> ts, for latency of live messages
const latencies = []; // ms, newest last
let selected = null;
let rates = [];
let totals = null;

// ---- agents ----
const refreshAgentsSoon = coalesced(() => loadAgents(), 400);
let agentsCache = [];
async function loadAgents() {
  const { agents } = await api('/api/agents');
  agentsCache = agents;
  renderAgents(agents);
}
function stateTitle(a) {
  const waiting = a.inflight ? `${a.inflight} message(s) handed to it, not yet typed in` : '';
  const since = a.since && a.state !== 'offline' ? `since ${new Date(a.since).toLocaleTimeString()}` : '';
  const thread = a.thread ? `thread ${a.thread}` : '';
  return [since, a.why, waiting, thread].filter(Boolean).join('; ') || null;
}
function renderAgents(agents) {
  const tbody = $('#agents tbody');
  tbody.replaceChildren(...agents.map((a) => el('tr', { dataset: { agent: a.name } },
    el('td', {}, el('b', {}, a.name)),
    el('td', {}, el('span', { class: `state ${a.state}`, title: stateTitle(a) }, a.state),
      a.why && a.state !== 'idle' ? el('span', { class: 'hint why' }, ` ${a.why}`) : null),
    el('td', {}, a.cli ? a.cli.split('/').pop() : '–'),
    el('td', {}, a.backend || '–'),
    el('td', { class: 'num', title: 'stored for it, not yet acknowledged' }, fmt(a.pending)),
    el('td', { class: 'num', title: 'received since the relay started' }, fmt(a.received)),
    el('td', { class: 'num', title: 'sent since the relay started' }, fmt(a.sent)),
    el('td', { title: new Date(a.last_seen).toLocaleString() }, a.online ? 'now' : ago(a.last_seen)),
  )));
  const online = agents.filter((a) => a.online).length;
  $('#agents-count').textContent = agents.length ? `${online} online · ${agents.length} known` : '';
  $('#agents-empty').hidden = agents.length > 0;
}

// ---- messages ----
function deliveryChip(recipient, state) {
  return el('span', { class: 'chip', dataset: { recipient, state } }, `${recipient}: ${state}`);
}
function messageItem(m, onClick) {
  const head = el('div', { class: 'head' },
    el('span', { class: 'who' }, m.from), el('span', { class: 'arrow' }, '→'), el('span', { class: 'who' }, m.to),
    m.topic ? el('span', { class: 'tag topic' }, `#${m.topic}`) : null,
    m.kind && m.kind !== 'message' ? el('span', { class: `tag kind-${m.kind}` }, m.kind) : null,
    m.thread ? el('span', { class: 'tag', title: 'thread' }, `⋯ ${m.thread}`) : null,
    el('span', { class: 'deliveries' }, (m.deliveries || []).map((d) => deliveryChip(d.recipient, d.status))),
  );
  return el('li', { dataset: { id: m.id }, onclick: () => onClick(m.id) },
    el('span', { class: 'time', title: new Date(m.ts).toLocaleString() }, clock(m.ts)),
    head,
    el('span', { class: 'body', title: m.body }, m.body.replace(/\s+/g, ' ')));
}

function addToFlow(m, fresh) {
  if (flow.has(m.id)) return;
  const li = messageItem(m, showDetail);
  if (fresh) li.classList.add('new');
  const list = $('#flow');
  if (fresh) list.prepend(li); else list.append(li);
  flow.set(m.id, { rec: m, li });
  while (flow.size > FLOW_MAX) {
    const oldest = list.lastElementChild;
    flow.delete(oldest.dataset.id);
    oldest.remove();
  }
  $('#flow-empty').hidden = flow.size > 0;
}

const RANK = { queued: 0, sent: 1, acked: 2, verified: 3, failed: 3, expired: 3 };
function setDelivery(id, recipient, state) {
  const item = flow.get(id);
  if (!item) return;
  const chips = item.li.querySelector('.deliveries');
  const chip = chips.querySelector(`[data-recipient="${CSS.escape(recipient)}"]`);
  if (!chip) { chips.append(deliveryChip(recipient, state)); return; }
  if ((RANK[state] ?? 0) < (RANK[chip.dataset.state] ?? 0)) return; // never go backwards
  chip.dataset.state = state;
  chip.textContent = `${recipient}: ${state}`;
  if (selected === id) showDetail(id);
}

function refusedItem(ev) {
  const li = el('li', { class: 'refused new', dataset: { refused: ev.id } },
    el('span', { class: 'time' }, clock(ev.ts)),
    el('div', { class: 'head' }, el('span', { class: 'who' }, ev.from || '?'), el('span', { class: 'tag' }, `refused: ${ev.code}`)),
    el('span', { class: 'body' }, ev.reason));
  $('#flow').prepend(li);
  $('#flow-empty').hidden = true;
}

// ---- detail ----
async function showDetail(id) {
  selected = id;
  for (const li of document.querySelectorAll('.flow li.selected')) li.classList.remove('selected');
  for (const li of document.querySelectorAll(`.flow li[data-id="${CSS.escape(id)}"]`)) li.classList.add('selected');
  const card = $('#detail-card');
  card.hidden = false;
  $('#detail-id').textContent = id;
  let data;
  try { data = await api(`/api/messages/${encodeURIComponent(id)}`); } catch (e) {
    $('#detail').replaceChildren(el('p', { class: 'notice' }, e.message)); return;
  }
  if (selected !== id) return;
  const m = data.message;
  const facts = [['From', m.from], ['To', m.to], ['Topic', m.topic], ['Kind', m.kind], ['Thread', m.thread],
    ['In reply to', m.in_reply_to], ['Stored', new Date(m.ts).toLocaleString()]].filter(([, v]) => v);
  $('#detail').replaceChildren(...[
    el('dl', { class: 'detail-grid' }, facts.map(([k, v]) => [el('dt', {}, k), el('dd', {}, v)])),
    el('pre', { class: 'body' }, m.body),
    m.data !== undefined && m.data !== null ? el('pre', { class: 'body', title: 'data' }, JSON.stringify(m.data, null, 2)) : null,
    el('h3', { class: 'hint' }, 'Delivery trace'),
    el('ol', { class: 'trace', id: 'trace' }, data.trace.map((s) => el('li', { dataset: { event: s.state } },
      el('span', { class: 'when', title: new Date(s.ts).toLocaleString() }, clock(s.ts)),
      el('b', {}, s.state.replace(/_/g, ' ')),
      s.recipient ? ` ${s.recipient}` : '',
      s.detail ? el('span', { class: 'hint' }, ` ${s.detail}`) : ''))),
  ].filter(Boolean));
  card.scrollIntoView({ block: 'nearest', behavior: 'smooth' });
}
$('#detail-close').addEventListener('click', () => { selected = null; $('#detail-card').hidden = true; });

// ---- search ----
let lastSearch = null;
function searchParams() {
  const f = new FormData($('#search'));
  const ms = (v) => (v ? new Date(v).getTime() : undefined);
  return { from: f.get('from'), to: f.get('to'), topic: f.get('topic'), text: f.get('text'),
    since: ms(f.get('since')), until: ms(f.get('until')), limit: 50 };
}
async function runSearch(params, append) {
  const out = $('#results');
  let data;
  try { data = await api('/api/messages', params); } catch (e) {
    out.replaceChildren(el('li', { class: 'notice' }, e.message)); return;
  }
  const items = data.messages.map((m) => messageItem(m, showDetail));
  if (append) out.append(...items); else out.replaceChildren(...items);
  $('#results-empty').hidden = out.children.length > 0;
  lastSearch = { ...params, before: data.next_before };
  $('#older').hidden = data.next_before === null || data.next_before === undefined;
}
$('#search').addEventListener('submit', (e) => { e.preventDefault(); runSearch(searchParams(), false); });
$('#older').addEventListener('click', () => lastSearch && runSearch(lastSearch, true));

// ---- dead letters ----
// The relay's dead-letter queue (what `agent-relay dlq` lists), with a button to put one back.
function deadItem(d) {
  const out = el('span', { class: 'notice outcome' });
  const retry = el('button', { type: 'button', class: 'retry', onclick: async (e) => {
    e.stopPropagation();
    retry.disabled = true;
    try {
      const res = await fetch(url(`/api/dead/${d.dlq_id}/retry`), { method: 'POST', cache: 'no-store' });
      const body = await res.json().catch(() => ({}));
      if (!res.ok) throw new Error((body.error && body.error.message) || `${res.status} ${res.statusText}`);
      li.dataset.retried = 'true';
      out.textContent = body.outcome;
      loadDeadSoon(1500);
    } catch (err) { out.textContent = err.message; retry.disabled = false; }
  } }, 'Retry');
  // A reply the hop budget stopped names its thread: a person may let that chain go on.
  const chain = d.code === 'budget_exceeded' && /chain extend (\S+) \d+/.exec(d.reason);
  const extend = chain ? el('button', { type: 'button', class: 'extend', onclick: async (e) => {
    e.stopPropagation();
    extend.disabled = true;
    try {
      const res = await fetch(url(`/api/chains/${encodeURIComponent(chain[1])}/extend`, { hops: 10 }), { method: 'POST', cache: 'no-store' });
      const body = await res.json().catch(() => ({}));
      if (!res.ok) throw new Error((body.error && body.error.message) || `${res.status} ${res.statusText}`);
      out.textContent = `the chain may now run ${body.max_hops} replies; Retry sends this one again`;
    } catch (err) { out.textContent = err.message; extend.disabled = false; }
  } }, 'Extend chain +10') : null;
  const li = el('li', { dataset: { dlq: d.dlq_id, id: d.msg_id, code: d.code },
    onclick: () => { if (d.pos !== undefined && d.pos !== null) showDetail(d.msg_id); } },
    el('span', { class: 'time', title: new Date(d.ts).toLocaleString() }, clock(d.ts)),
    el('div', { class: 'head' },
      el('span', { class: 'who' }, d.from), el('span', { class: 'arrow' }, '→'), el('span', { class: 'who' }, d.recipient),
      d.topic ? el('span', { class: 'tag topic' }, `#${d.topic}`) : null,
      el('span', { class: 'tag dead' }, d.code), el('span', { class: 'hint' }, `#${d.dlq_id}`), extend, retry),
    el('span', { class: 'body', title: d.body }, d.body.replace(/\s+/g, ' ') + (d.truncated ? '…' : '')),
    el('span', { class: 'hint reason' }, d.reason), out);
  return li;
}
async function loadDead() {
  const { dead_letters: dead } = await api('/api/dead');
  $('#dead').replaceChildren(...dead.map(deadItem));
  $('#dead-empty').hidden = dead.length > 0;
}
const loadDeadSoon = coalesced(() => loadDead().catch(() => {}), 300);

// ---- the person's inbox ----
// Messages to `human` (a mailbox that always exists), each with a reply box: the answer goes to
// its sender in its thread, as `agent-relay reply` sends it.
function inboxItem(m) {
  const out = el('span', { class: 'notice outcome' });
  const text = el('textarea', { rows: 2, placeholder: `answer ${m.from}…`, 'aria-label': `answer to ${m.from}` });
  const send = el('button', { type: 'button', class: 'reply', onclick: async (e) => {
    e.stopPropagation();
    if (!text.value.trim()) return;
    send.disabled = true;
    try {
      const res = await fetch(url('/api/reply'), { method: 'POST', cache: 'no-store',
        headers: { 'content-type': 'application/json' }, body: JSON.stringify({ id: m.id, body: text.value }) });
      const body = await res.json().catch(() => ({}));
      if (!res.ok) throw new Error((body.error && body.error.message) || `${res.status} ${res.statusText}`);
      out.textContent = `sent to ${body.to} (${body.status})`;
      text.value = '';
    } catch (err) { out.textContent = err.message; }
    send.disabled = false;
  } }, 'Reply');
  return el('li', { dataset: { id: m.id, unread: m.unread ? 'true' : 'false' } },
    el('span', { class: 'time', title: new Date(m.ts).toLocaleString() }, clock(m.ts)),
    el('div', { class: 'head' },
      el('span', { class: 'who' }, m.from),
      m.thread ? el('span', { class: 'tag' }, `thread ${m.thread.slice(-8)}`) : null,
      m.unread ? el('span', { class: 'tag' }, 'unread') : null),
    el('span', { class: 'body' }, m.body),
    el('div', { class: 'reply-box' }, text, send), out);
}
async function loadInbox() {
  const { messages } = await api('/api/inbox');
  $('#inbox').replaceChildren(...messages.map(inboxItem));
  $('#inbox-empty').hidden = messages.length > 0;
  const unread = messages.filter((m) => m.unread).length;
  $('#inbox-count').textContent = unread ? `${unread} unread` : '';
}
const loadInboxSoon = coalesced(() => loadInbox().catch(() => {}), 300);

// ---- people adapters (shown only when the project declares people) ----
async function loadAdapters() {
  const { adapters } = await api('/api/adapters');
  $('#adapters tbody').replaceChildren(...adapters.map((a) => el('tr', {},
    el('td', {}, el('b', {}, a.name)),
    el('td', {}, el('span', { class: `state ${a.state === 'connected' ? 'idle' : a.state === 'failing' ? 'blocked' : 'busy'}` }, a.state)),
    el('td', {}, a.people.join(', ')),
    el('td', { class: 'num' }, fmt(a.sent)),
    el('td', { class: 'num' }, fmt(a.received)),
    el('td', { class: 'num', title: 'bad signature, replay, unknown sender' }, fmt(a.refused)),
    el('td', { class: 'hint' }, a.last_error || ''),
  )));
  $('#adapters-card').hidden = adapters.length === 0;
}

// ---- figures and chart ----
function percentile(sorted, p) { return sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] : null; }
function drawFigures() {
  const t = totals || {};
  const last = rates.length ? rates[rates.length - 1] : null;
  const sorted = [...latencies].sort((a, b) => a - b);
  const ms = (v) => (v === null ? '–' : `${fmt(v)} ms`);
  const figs = [
    ['msgs/s now', last ? fmt(last.accepted) : '–'],
    ['stored', fmt(t.accepted || 0)], ['delivered', fmt(t.delivered || 0)], ['acked', fmt(t.acked || 0)],
    ['refused', fmt(t.refused || 0)], ['failed', fmt(t.failed || 0)], ['expired', fmt(t.expired || 0)],
    ['latency p50', ms(percentile(sorted, 0.5))], ['latency p95', ms(percentile(sorted, 0.95))],
  ];
  $('#figures').replaceChildren(...figs.map(([k, v]) => el('div', {}, el('dt', {}, k), el('dd', {}, v))));
  drawChart();
}
let drawPending = false;
function drawSoon() {
  if (drawPending) return;
  drawPending = true;
  requestAnimationFrame(() => { drawPending = false; drawFigures(); });
}
function drawChart() {
  const svg = $('#chart');
  const W = 600, H = 120, N = 300;
  const pts = rates.slice(-N);
  const max = Math.max(1, ...pts.map((r) => r.accepted));
  const x = (i) => W - (pts.length - 1 - i) * (W / (N - 1));
  const y = (v) => H - 14 - (v / max) * (H - 28);
  const ns = 'http://www.w3.org/2000/svg';
  const mk = (tag, attrs) => { const n = document.createElementNS(ns, tag); for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v); return n; };
  const kids = [mk('line', { class: 'grid', x1: 0, x2: W, y1: y(0), y2: y(0) }), mk('line', { class: 'grid', x1: 0, x2: W, y1: y(max), y2: y(max) })];
  const top = mk('text', { x: 4, y: y(max) - 3 }); top.textContent = `${fmt(max)}/s`; kids.push(top);
  if (pts.length > 1) {
    const line = pts.map((r, i) => `${x(i).toFixed(1)},${y(r.accepted).toFixed(1)}`).join(' ');
    kids.push(mk('polygon', { class: 'area', points: `${x(0).toFixed(1)},${y(0)} ${line} ${x(pts.length - 1).toFixed(1)},${y(0)}` }));
    kids.push(mk('polyline', { class: 'line', points: line }));
  }
  svg.replaceChildren(...kids);
}
async function loadStats() {
  const s = await api('/api/stats');
  totals = s.totals;
  rates = s.rates;
  const st = s.status;
  $('#facts').replaceChildren(
    el('span', {}, el('b', {}, fmt(st.agents)), ' online'),
    el('span', {}, el('b', {}, fmt(st.messages)), ' stored'),
    el('span', {}, el('b', {}, fmt(st.pending)), ' waiting'),
    el('span', { title: st.db }, `v${st.version} · ${st.storage}`),
    ...linkFacts(st.federation));
  drawFigures();
}
// The federation link (`up --cluster`): its state and what waits here for other nodes.
let federated = false;
function linkFacts(f) {
  federated = Boolean(f);
  if (!f) return [];
  return [el('span', { id: 'link', class: `link-${f.link}`, title: f.error ? `${f.cluster}: ${f.error}` : f.cluster },
    `node ${f.node} · link `, el('b', {}, f.link), ' · backlog ', el('b', {}, fmt(f.backlog)),
    ...(f.error ? [' · ', el('b', {}, f.error)] : []))];
}

// ---- live feed ----
const loadStatsSoon = coalesced(() => loadStats(), 5000);
function onEvent(ev) {
  switch (ev.type) {
    case 'accepted':
      acceptedAt.set(ev.id, ev.ts);
      if (acceptedAt.size > 5000) acceptedAt.delete(acceptedAt.keys().next().value);
      addToFlow({ id: ev.id, ts: ev.ts, from: ev.from, to: ev.to, topic: ev.topic, kind: ev.kind, thread: ev.thread,
        body: ev.truncated ? `${ev.body}…` : ev.body, deliveries: ev.recipients.map((r) => ({ recipient: r, status: 'queued' })) }, true);
      refreshAgentsSoon();
      if (ev.recipients.includes('human')) loadInboxSoon();
      break;
    case 'delivered': setDelivery(ev.id, ev.recipient, 'sent'); break;
    case 'acked': {
      setDelivery(ev.id, ev.recipient, ev.state);
      if (ev.state === 'failed') loadDeadSoon();
      const t0 = acceptedAt.get(ev.id);
      if (t0 !== undefined) {
        latencies.push(Math.max(0, ev.ts - t0));
        if (latencies.length > 500) latencies.shift();
        drawSoon();
      }
      refreshAgentsSoon();
      break;
    }
    case 'refused': refusedItem(ev); loadDeadSoon(); break;
    case 'agent_connected': case 'agent_disconnected': case 'agent_state': refreshAgentsSoon(); break;
    case 'expired': loadDeadSoon(); refreshAgentsSoon(); break;
    case 'lagged': reloadSoon(); break;
    case 'stats':
      totals = ev.totals;
      if (ev.rate) { rates.push(ev.rate); if (rates.length > 300) rates.shift(); }
      drawFigures();
      loadStatsSoon();
      break;
    default: break;
  }
}

// After missed events: reload what is shown, at most every two seconds (a flood can make the
// stream fall behind many times a second).
let reloadTimer = null;
function reloadSoon() {
  if (reloadTimer) return;
  $('#conn-text').textContent = 'live (busy: catching up)';
  reloadTimer = setTimeout(() => {
    reloadTimer = null;
    loadSnapshot().then(() => { $('#conn-text').textContent = 'live'; }).catch(() => {});
  }, 2000);
}

async function loadSnapshot() {
  const { messages } = await api('/api/messages', { limit: 100 });
  for (const m of messages) addToFlow(m, false);
  await Promise.all([loadAgents(), loadStats(), loadDead(), loadAdapters(), loadInbox()]);
}

function connect() {
  const conn = $('#conn');
  const es = new EventSource(url('/api/events'));
  es.onopen = () => {
    conn.dataset.state = 'live';
    $('#conn-text').textContent = 'live';
    loadSnapshot().catch((e) => { $('#conn-text').textContent = e.message; });
  };
  es.onmessage = (m) => { try { onEvent(JSON.parse(m.data)); } catch (e) { console.error(e); } };
  es.onerror = () => {
    if (conn.dataset.state === 'refused') return;
    conn.dataset.state = 'down';
    $('#conn-text').textContent = 'reconnecting…';
    // A stream the relay refuses (401: the token was rotated) is not retried by the browser:
    // ask why, and say so instead of "reconnecting…" over stale figures.
    fetch(url('/api/stats'), { cache: 'no-store' }).then((res) => {
      if (res.status === 401) {
        es.close();
        conn.dataset.state = 'refused';
        $('#conn-text').textContent = 'access token refused (rotated?): open the URL `agent-relay dashboard` prints';
      } else if (es.readyState === EventSource.CLOSED) {
        setTimeout(connect, 2000);
      }
    }).catch(() => { if (es.readyState === EventSource.CLOSED) setTimeout(connect, 2000); });
  };
}

setInterval(() => renderAgents(agentsCache), 30000); // keeps "last seen … ago" true without asking
setInterval(() => { if (!$('#adapters-card').hidden) loadAdapters().catch(() => {}); }, 5000); // adapters' state has no live event
setInterval(() => { if (federated) loadStats().catch(() => {}); }, 2000); // nor has the federation link's
connect();
