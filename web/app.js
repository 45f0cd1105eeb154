// The muster dashboard: plain JavaScript, no framework, no network but the head's API.
//
// The page asks for a token (kept in localStorage) and reads the JSON API with it.
// Every REFRESH_MS it fetches what the sections need, in parallel, and re-renders
// them. A section is an object in SECTIONS: {id, title, needs, render}; `needs`
// names the API paths it reads, `render` fills its card from their replies. A
// section that reads per-item paths (each iteration's ranks, each scope's blobs)
// has a `load(data)` too, run after the shared fetch; `headOnly` sections are left
// out of the DistCompute views. See docs/dashboard.md.
//
// Views: "/" is the whole head; "#/worker/ID" one worker; "#/node/NAME" one node;
// under "/compat/distcompute/NAME" the same views are limited to that DistCompute
// pipeline, with its "/leaderboard" and "/worker/STAGE/DISPLAY_NAME" pages.
'use strict';

(function () {
  const TOKEN_KEY = 'muster.token';
  const params = new URLSearchParams(location.search);
  const REFRESH_MS = Math.max(250, parseInt(params.get('refresh') || '2000', 10) || 2000);
  const RATE_WINDOW_S = 300; // completion rate and ETA over the last 5 minutes
  const CHART_SECONDS = 600;
  const CHART_BIN_S = 10;
  const MAX_RANKS_SHOWN = 64;  // per iteration; the rest are summed up
  const MAX_SESSION_SCOPES = 50; // sessions whose shared data is listed
  const MAX_LEASED_LISTED = 1000; // leased tasks listed per queue (the API's largest page)
  const MAX_TASK_IDS_SHOWN = 3;   // task ids in a worker's row; the rest are counted
  const MAX_PAYLOADS_SHOWN = 20;  // payloads on a worker's page; the rest are counted
  const MAX_WORKERS_SHOWN = 500;  // rows of the workers table (those seen last); the rest are counted
  const COLORS = ['#2f6fde', '#1e8e4e', '#d9822b', '#8e44ad', '#c0392b', '#16a085', '#7f8c8d',
                  '#b7950b'];

  const state = {
    token: localStorage.getItem(TOKEN_KEY) || '',
    timer: null,
    refreshes: 0,
    showGone: false,
    view: parseView(),
  };

  class AuthError extends Error {}
  class ApiError extends Error {
    constructor(message, status, code) { super(message); this.status = status; this.code = code; }
  }

  // ---- helpers ----

  // el('td', {class: 'num', dataset: {field: 'done'}}, '5'): text is always
  // set as text, never parsed as markup.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === 'dataset') Object.assign(node.dataset, value);
      else if (key === 'class') node.className = value;
      else if (key === 'text') node.textContent = value;
      else node.setAttribute(key, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function $(id) { return document.getElementById(id); }

  // Names in code point order, the order of the head's replies (SQLite compares
  // UTF-8 bytes, which order as code points): not localeCompare, which puts
  // "alice" before "Bob" where the head puts it after, so a list sorted here and
  // one sorted there would disagree.
  function compareNames(a, b) {
    for (let i = 0; i < a.length && i < b.length;) {
      const x = a.codePointAt(i), y = b.codePointAt(i);
      if (x !== y) return x < y ? -1 : 1;
      i += x > 0xffff ? 2 : 1;
    }
    return a.length - b.length;
  }

  function fmtInt(n) { return (n || 0).toLocaleString('en-US'); }

  function fmtDuration(seconds) {
    if (!isFinite(seconds)) return '—';
    seconds = Math.round(seconds);
    const d = Math.floor(seconds / 86400), h = Math.floor(seconds % 86400 / 3600);
    const m = Math.floor(seconds % 3600 / 60), s = seconds % 60;
    if (d) return d + 'd ' + h + 'h';
    if (h) return h + 'h ' + m + 'm';
    if (m) return m + 'm ' + s + 's';
    return s + 's';
  }

  function fmtAgo(ms) {
    if (!ms) return '—';
    const s = Math.max(0, (Date.now() - ms) / 1000);
    return s < 1 ? 'just now' : fmtDuration(s) + ' ago';
  }

  function fmtTime(ms) { return ms ? new Date(ms).toLocaleString() : '—'; }

  // In how long `ms` (an epoch time) comes: "in 4m 10s", or "expired".
  function fmtIn(ms) {
    if (!ms) return '—';
    const s = (ms - Date.now()) / 1000;
    return s <= 0 ? 'expired' : 'in ' + fmtDuration(s);
  }

  function fmtBytes(n) {
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    n = n || 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : String(n)) + ' ' + units[i];
  }

  // Samples per second: one decimal below 100, whole numbers with separators above.
  function fmtRate(v) {
    return v >= 100 ? Math.round(v).toLocaleString('en-US') : (v || 0).toFixed(1);
  }

  function fmtPercent(part, whole) {
    return whole ? (100 * part / whole).toFixed(1).replace(/\.0$/, '') + '%' : '—';
  }

  // A progress bar: parts is [[fraction, class], ...], drawn left to right.
  function bar(parts, title) {
    const outer = el('div', {class: 'bar'});
    if (title) outer.title = title;
    for (const [fraction, cls] of parts) {
      const span = el('span', {class: cls || ''});
      span.style.width = (100 * Math.max(0, Math.min(1, fraction || 0))).toFixed(1) + '%';
      outer.append(span);
    }
    return outer;
  }

  function parseView() {
    const m = location.pathname.match(
      /^\/compat\/distcompute\/([^/]+)(?:\/(leaderboard|worker\/([^/]+)\/([^/]+)))?\/?$/);
    const hash = location.hash.match(/^#\/worker\/(\d+)$/);
    const node = location.hash.match(/^#\/node\/([^/]+)$/);
    if (m) {
      const view = {pipeline: decodeURIComponent(m[1]), page: 'main'};
      if (m[2] === 'leaderboard') view.page = 'leaderboard';
      else if (m[2]) Object.assign(view, {page: 'worker', stage: decodeURIComponent(m[3]),
                                          name: decodeURIComponent(m[4])});
      if (hash) Object.assign(view, {page: 'worker', id: +hash[1]});
      return view;
    }
    if (node) return {page: 'node', node: decodeURIComponent(node[1])};
    return hash ? {page: 'worker', id: +hash[1]} : {page: 'main'};
  }

  async function api(path) {
    const res = await fetch(path, {headers: {Authorization: 'Bearer ' + state.token},
                                   cache: 'no-store'});
    if (res.status === 401) throw new AuthError('token refused');
    if (!res.ok) {
      let message = res.status + ' ' + res.statusText, code = null;
      try {
        const error = (await res.json()).error;
        message = error.message;
        code = error.code;
      } catch (e) { /* keep the status */ }
      throw new ApiError(path + ': ' + message, res.status, code);
    }
    return res.json();
  }

  // Like api(), but a 404 answers null instead of failing.
  async function apiOr404(path) {
    try {
      return await api(path);
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) return {missing: e.code};
      throw e;
    }
  }

  // ---- what the head tells us, scoped to a pipeline when the view has one ----

  // Fetches every path the visible sections need, once each, in parallel.
  async function load() {
    const paths = new Set(['/v1/health', '/v1/queues', '/v1/workers']);
    for (const section of visibleSections()) section.needs.forEach(p => paths.add(p));
    if (state.view.pipeline) paths.add('/v1/distcompute');
    const replies = {};
    await Promise.all([...paths].map(async p => { replies[p] = await api(p); }));
    const data = {replies, health: replies['/v1/health']};
    data.queues = replies['/v1/queues'].queues;
    data.workers = replies['/v1/workers'].workers;
    data.pipeline = null;
    if (state.view.pipeline) {
      data.pipeline = replies['/v1/distcompute'].pipelines.find(p => p.name === state.view.pipeline);
      if (!data.pipeline) throw new Error('this head exposes no pipeline "' + state.view.pipeline + '"');
      const order = data.pipeline.stages.map(s => s.queue);
      data.queues = order.map(q => data.queues.find(x => x.name === q)).filter(Boolean);
      // The pipeline's workers: its DistCompute clients, and every other worker that
      // serves one of its stages (native `muster worker`s, muster.distcompute clients).
      const name = data.pipeline.name;
      data.workers = data.workers.filter(w => {
        const dc = w.labels && w.labels.distcompute;
        return dc ? dc === name : (w.queues || []).some(q => order.includes(q));
      });
    } else {
      data.queues = pipelineOrder(data.queues);
    }
    // The tasks each worker holds: one listing of leased tasks per busy queue,
    // without payloads (a payload may be a megabyte; the worker page reads its own).
    data.holding = {};
    await Promise.all(data.queues.filter(q => q.counts.leased > 0).map(async q => {
      const reply = await api('/v1/queues/' + encodeURIComponent(q.name) +
                              '/tasks?state=leased&brief=true&limit=' + MAX_LEASED_LISTED);
      for (const task of reply.tasks) {
        const worker = task.lease && task.lease.worker;
        if (worker) (data.holding[worker] = data.holding[worker] || []).push(task);
      }
    }));
    await Promise.all(visibleSections().filter(s => s.load).map(s => s.load(data)));
    return data;
  }

  // The queues in pipeline order (the head lists them by name): each pipeline
  // (queues chained by `next`) from its first stage along its `next`s, pipelines by
  // the name of their first stage; then loops of `next`s (the head allows one, though
  // no task ever leaves it), each from its first name; then the queues of no
  // pipeline, by name. A stage that two queues feed comes after the first of them.
  function pipelineOrder(queues) {
    const byName = new Map(queues.map(q => [q.name, q]));
    const fed = new Set(queues.filter(q => byName.has(q.next)).map(q => q.next));
    const inPipeline = q => byName.has(q.next) || fed.has(q.name);
    const sorted = queues.slice().sort((a, b) => compareNames(a.name, b.name));
    const order = [], seen = new Set();
    const walk = q => {
      for (; q && !seen.has(q.name); q = byName.get(q.next)) { seen.add(q.name); order.push(q); }
    };
    sorted.filter(q => inPipeline(q) && !fed.has(q.name)).forEach(walk); // first stages
    sorted.filter(inPipeline).forEach(walk); // what is left is in loops
    return order.concat(sorted.filter(q => !inPipeline(q)));
  }

  // Completions per second of `queue` over the last `seconds` (null: all queues).
  function completions(data, queue, seconds) {
    const tp = data.replies['/v1/throughput?seconds=' + CHART_SECONDS];
    if (!tp) return 0;
    const series = queue === null ? tp.total : (tp.queues[queue] || []);
    // The last bucket is the current, partial second: leave it out.
    const upto = series.length - 1, from = Math.max(0, upto - seconds);
    let sum = 0;
    for (let i = from; i < upto; i++) sum += series[i];
    return sum;
  }

  function rateWindow(data) {
    const up = Math.max(1, Math.floor((data.health.uptime_ms || 0) / 1000));
    return Math.min(RATE_WINDOW_S, up);
  }

  function stageLetter(data, queue) {
    if (!data.pipeline) return null;
    const stage = data.pipeline.stages.find(s => s.queue === queue);
    return stage ? stage.stage : null;
  }

  function workerHref(data, w) {
    if (data.pipeline) {
      const stage = (w.queues && w.queues[0]) || '';
      return data.pipeline.prefix + '/worker/' + encodeURIComponent(stage.toLowerCase()) + '/' +
             encodeURIComponent(w.name);
    }
    return '#/worker/' + w.id;
  }

  // ---- sections ----

  // The ETA cell: when the `remaining` tasks (queued and leased) will be done at
  // `perSecond`. Nothing remaining is "done" only for a queue that had tasks: one
  // that never had any (or whose tasks were all purged) has "no tasks".
  function etaText(remaining, everyTask, perSecond) {
    if (remaining === 0) return everyTask === 0 ? 'no tasks' : 'done';
    return perSecond > 0 ? fmtDuration(remaining / perSecond) : '—';
  }

  function renderQueues(card, data) {
    const span = rateWindow(data);
    const table = el('table', {id: 'queues-table'},
      el('thead', {}, el('tr', {},
        el('th', {text: data.pipeline ? 'Stage' : 'Queue'}), el('th', {text: 'Next'}),
        ...['Queued', 'Leased', 'Done', 'Failed', 'Dead'].map(t => el('th', {class: 'num', text: t})),
        el('th', {class: 'num', text: 'Done/min'}), el('th', {class: 'num', text: 'ETA'}),
        el('th', {text: 'Progress'}))));
    const body = el('tbody');
    for (const q of data.queues) {
      const c = q.counts;
      const perSecond = completions(data, q.name, span) / span;
      const remaining = c.queued + c.leased;
      const total = c.queued + c.leased + c.done + c.failed + c.dead;
      const eta = etaText(remaining, total + (c.cancelled || 0), perSecond);
      const letter = stageLetter(data, q.name);
      const row = el('tr', {dataset: {queue: q.name}},
        el('td', {}, letter ? letter + ' · ' : '', el('strong', {text: q.name})),
        el('td', {class: 'muted', text: q.next || '—'}));
      for (const key of ['queued', 'leased', 'done', 'failed', 'dead'])
        row.append(el('td', {class: 'num', dataset: {field: key}, text: fmtInt(c[key])}));
      row.append(el('td', {class: 'num', dataset: {field: 'rate'}, text: (perSecond * 60).toFixed(1)}),
                 el('td', {class: 'num', dataset: {field: 'eta'}, text: eta}),
                 el('td', {}, bar([[total ? c.done / total : 0, ''],
                                   [total ? (c.failed + c.dead) / total : 0, 'failed']],
                                  fmtPercent(c.done, total) + ' done')));
      body.append(row);
    }
    if (!data.queues.length)
      body.append(el('tr', {}, el('td', {class: 'empty', colspan: 10, text: 'No queues yet.'})));
    table.append(body);
    card.append(table);
  }

  function renderThroughput(card, data) {
    const tp = data.replies['/v1/throughput?seconds=' + CHART_SECONDS];
    const names = data.queues.map(q => q.name).filter(n => tp.queues[n]);
    const bins = Math.floor(CHART_SECONDS / CHART_BIN_S);
    const binned = name => {
      const series = name === null ? tp.total : tp.queues[name];
      const out = new Array(bins).fill(0);
      // Whole seconds only: the last bucket is the current, partial one.
      const end = series.length - 1;
      for (let i = 0; i < end; i++) {
        const bin = bins - 1 - Math.floor((end - 1 - i) / CHART_BIN_S);
        if (bin >= 0) out[bin] += series[i] / CHART_BIN_S;
      }
      return out;
    };
    const lines = names.slice(0, COLORS.length).map((n, i) => ({name: n, color: COLORS[i], values: binned(n)}));
    const canvas = el('canvas', {id: 'chart', width: 1200, height: 180});
    card.append(el('div', {class: 'chart-wrap'}, canvas));
    const legend = el('div', {class: 'legend'});
    for (const line of lines) {
      const swatch = el('i');
      swatch.style.background = line.color;
      legend.append(el('span', {}, swatch, line.name));
    }
    legend.append(el('span', {class: 'muted', id: 'chart-total',
                             text: 'last minute: ' + fmtInt(completions(data, null, 60)) + ' completed'}));
    card.append(legend);
    drawChart(canvas, lines);
  }

  // Draws completions per second, one line per queue, over the last ten minutes.
  function drawChart(canvas, lines) {
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || 1200, height = canvas.clientHeight || 180;
    canvas.width = width * ratio;
    canvas.height = height * ratio;
    const g = canvas.getContext('2d');
    g.scale(ratio, ratio);
    const left = 44, right = 10, top = 10, bottom = 22;
    const w = width - left - right, h = height - top - bottom;
    let max = 0;
    for (const line of lines) for (const v of line.values) max = Math.max(max, v);
    max = max > 0 ? niceCeil(max) : 1;
    g.font = '11px system-ui, sans-serif';
    g.fillStyle = '#6b7385';
    g.strokeStyle = '#e3e6ec';
    g.lineWidth = 1;
    for (let i = 0; i <= 4; i++) {
      const y = top + h - h * i / 4;
      g.beginPath(); g.moveTo(left, y); g.lineTo(left + w, y); g.stroke();
      g.textAlign = 'right';
      g.fillText(String(Number((max * i / 4).toPrecision(3))) + '/s', left - 6, y + 4);
    }
    g.textAlign = 'left';
    g.fillText('10 min ago', left, height - 6);
    g.textAlign = 'right';
    g.fillText('now', left + w, height - 6);
    for (const line of lines) {
      const n = line.values.length;
      g.strokeStyle = line.color;
      g.lineWidth = 2;
      g.beginPath();
      line.values.forEach((v, i) => {
        const x = left + w * i / (n - 1), y = top + h - h * v / max;
        if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
      });
      g.stroke();
    }
  }

  // The chart's top: v rounded up to 1, 2, 4 or 5 times a power of ten, whose
  // quarters (the grid lines) are short exact numbers (not 2.5, whose 1.875 would
  // be labelled 1.9).
  function niceCeil(v) {
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 4, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  function nodeLink(name) {
    return name ? el('a', {href: '#/node/' + encodeURIComponent(name), text: name}) : '—';
  }

  function renderWorkers(card, data) {
    const toggle = el('input', {type: 'checkbox', id: 'show-gone'});
    toggle.checked = state.showGone;
    toggle.addEventListener('change', () => { state.showGone = toggle.checked; refresh(); });
    const active = data.workers.filter(w => w.state === 'active').length;
    card.append(el('div', {class: 'toolbar'},
      el('span', {id: 'workers-active', text: active + ' active, ' + (data.workers.length - active) + ' gone'}),
      el('label', {}, toggle, ' show gone workers')));
    const listed = data.workers.filter(w => state.showGone || w.state === 'active')
      .sort((a, b) => b.last_seen_ms - a.last_seen_ms);
    const shown = listed.slice(0, MAX_WORKERS_SHOWN);
    // Said above the table, where it is seen before scrolling through the rows.
    if (listed.length > shown.length)
      card.append(el('p', {class: 'muted', id: 'workers-unlisted', text: 'Showing ' +
        fmtInt(shown.length) + ' of ' + fmtInt(listed.length) + ' workers, those seen most ' +
        'recently (GET /v1/workers lists them all).'}));
    card.append(workersTable(data, shown, 'workers-table'));
  }

  // How many tasks worker w holds: its `leases` count is the truth; the listings
  // of leased tasks stop at MAX_LEASED_LISTED per queue and so may not name them all.
  function heldCount(data, w) {
    return Math.max(w.leases || 0, (data.holding[w.id] || []).length);
  }

  // The tasks a worker holds, as "#7 #8 #9 +997 more".
  function heldTasksText(data, w) {
    const known = data.holding[w.id] || [];
    const held = heldCount(data, w);
    const ids = known.slice(0, MAX_TASK_IDS_SHOWN).map(t => '#' + t.id).join(' ');
    if (held === 0) return '';
    if (!ids) return held === 1 ? '1 task' : fmtInt(held) + ' tasks';
    return held > MAX_TASK_IDS_SHOWN ? ids + ' +' + fmtInt(held - MAX_TASK_IDS_SHOWN) + ' more' : ids;
  }

  function workersTable(data, shown, id) {
    const table = el('table', {id: id},
      el('thead', {}, el('tr', {}, ...['Worker', 'Nickname', 'Node', 'Stage', 'Task', 'Progress',
        'Last seen', 'State'].map(t => el('th', {text: t})), el('th', {class: 'num', text: 'Done'}))));
    const body = el('tbody');
    for (const w of shown) {
      const tasks = heldTasksText(data, w);
      body.append(el('tr', {dataset: {worker: w.name}},
        el('td', {}, el('a', {href: workerHref(data, w), text: w.name})),
        el('td', {dataset: {field: 'nickname'}, text: w.nickname}),
        el('td', {class: 'muted'}, data.pipeline ? w.node || '—' : nodeLink(w.node)),
        el('td', {text: (w.queues || []).join(', ') || '—'}),
        el('td', {dataset: {field: 'task'}, text: tasks || '—'}),
        el('td', {class: 'progress', dataset: {field: 'progress'}, text: w.progress || ''}),
        el('td', {text: fmtAgo(w.last_seen_ms)}),
        el('td', {class: 'state-' + w.state, text: w.state}),
        el('td', {class: 'num', dataset: {field: 'completed'}, text: fmtInt(w.completed)})));
    }
    if (!shown.length)
      body.append(el('tr', {}, el('td', {class: 'empty', colspan: 9, text: 'No workers.'})));
    table.append(body);
    return table;
  }

  // The leaderboard's one order, on every page: most completed tasks first, ties
  // by nickname (as the head orders GET /v1/leaderboard).
  function leaderboardOrder(a, b) {
    return b.completed - a.completed || compareNames(a.nickname, b.nickname);
  }

  // Totals per nickname: the head's leaderboard, or one computed from the
  // pipeline's own workers in a DistCompute view; both in leaderboardOrder (the
  // head's reply is sorted again so that the page does not depend on its order).
  function leaderboard(data) {
    if (!data.pipeline) return data.replies['/v1/leaderboard'].leaderboard.slice().sort(leaderboardOrder);
    const by = {};
    for (const w of data.workers) {
      const e = by[w.nickname] = by[w.nickname] ||
        {nickname: w.nickname, completed: 0, failed: 0, flagged: 0, workers: 0};
      e.completed += w.completed; e.failed += w.failed; e.flagged += w.flagged; e.workers++;
    }
    return Object.values(by).sort(leaderboardOrder);
  }

  function renderLeaderboard(card, data) {
    const table = el('table', {id: 'leaderboard-table'},
      el('thead', {}, el('tr', {}, el('th', {class: 'num', text: '#'}), el('th', {text: 'Nickname'}),
        ...['Completed', 'Failed', 'Flagged', 'Workers'].map(t => el('th', {class: 'num', text: t})))));
    const body = el('tbody');
    leaderboard(data).forEach((e, i) => {
      const row = el('tr', {dataset: {nickname: e.nickname}},
        el('td', {class: 'num', text: i + 1}), el('td', {}, el('strong', {text: e.nickname})));
      for (const key of ['completed', 'failed', 'flagged', 'workers'])
        row.append(el('td', {class: 'num', dataset: {field: key}, text: fmtInt(e[key])}));
      body.append(row);
    });
    if (!body.children.length)
      body.append(el('tr', {}, el('td', {class: 'empty', colspan: 6, text: 'Nobody has finished a task yet.'})));
    table.append(body);
    card.append(table);
  }

  // ---- nodes ----

  // "0", or "0:1" for a MIG instance of GPU 0 (as the node agent names it).
  function gpuLabel(g) {
    return g.mig == null ? String(g.index) : g.index + ':' + g.mig;
  }

  function gpuLine(g) {
    const memory = g.memory_total_mb ? fmtBytes(g.memory_total_mb * 1048576) : '';
    const free = g.memory_total_mb ? ' (' + fmtBytes((g.memory_free_mb || 0) * 1048576) + ' free)' : '';
    return el('div', {class: 'gpu', dataset: {gpu: gpuLabel(g)}},
      el('strong', {text: 'GPU ' + gpuLabel(g)}), ' ' + (g.name || '') + (memory ? ' · ' + memory + free : ''));
  }

  function nodeWorkers(data, name) {
    return data.workers.filter(w => w.node === name);
  }

  function renderNodes(card, data) {
    const nodes = data.replies['/v1/nodes'].nodes.slice()
      .sort((a, b) => (a.state === 'active' ? 0 : 1) - (b.state === 'active' ? 0 : 1) ||
                      compareNames(a.name, b.name));
    const active = nodes.filter(n => n.state === 'active');
    const gpus = active.reduce((sum, n) => sum + n.gpus.length, 0);
    card.append(el('div', {class: 'toolbar'}, el('span', {id: 'nodes-summary',
      text: active.length + ' active, ' + (nodes.length - active.length) + ' gone · ' + gpus +
            ' GPUs, ' + active.reduce((sum, n) => sum + n.cpus, 0) + ' CPUs on active nodes'})));
    const table = el('table', {id: 'nodes-table'},
      el('thead', {}, el('tr', {}, ...['Node', 'Address', 'State', 'GPUs'].map(t => el('th', {text: t})),
        el('th', {class: 'num', text: 'CPUs'}), el('th', {class: 'num', text: 'Workers'}),
        el('th', {text: 'Its workers'}), el('th', {text: 'Last seen'}))));
    const body = el('tbody');
    for (const n of nodes) {
      const names = el('td', {class: 'names', dataset: {field: 'worker-names'}});
      for (const w of nodeWorkers(data, n.name).filter(w => w.state === 'active')) {
        if (names.children.length) names.append(' ');
        names.append(el('a', {href: workerHref(data, w), text: w.name}));
      }
      body.append(el('tr', {dataset: {node: n.name}, class: n.state === 'gone' ? 'gone' : ''},
        el('td', {}, el('strong', {}, nodeLink(n.name))),
        el('td', {class: 'muted', dataset: {field: 'address'}, text: n.address || '—'}),
        el('td', {class: 'state-' + n.state, dataset: {field: 'state'}, text: n.state}),
        el('td', {dataset: {field: 'gpus'}}, ...(n.gpus.length ? n.gpus.map(gpuLine) : ['—'])),
        el('td', {class: 'num', dataset: {field: 'cpus'}, text: fmtInt(n.cpus)}),
        el('td', {class: 'num', dataset: {field: 'workers'}, text: fmtInt(n.workers)}),
        names,
        el('td', {dataset: {field: 'last_seen'}, text: fmtAgo(n.last_seen_ms)})));
    }
    if (!nodes.length)
      body.append(el('tr', {}, el('td', {class: 'empty', colspan: 8,
        text: 'No nodes: start `muster node --join URL` on a machine.'})));
    table.append(body);
    card.append(table);
  }

  function renderNode(card, data) {
    const n = data.replies['/v1/nodes'].nodes.find(x => x.name === state.view.node);
    card.querySelector('h2').textContent = n ? 'Node ' + n.name : 'Node';
    if (!n) {
      card.append(el('p', {class: 'empty', id: 'node-missing', text: 'No such node.'}));
      return;
    }
    const fields = el('dl', {class: 'fields', id: 'node-fields'});
    const add = (label, value, key) =>
      fields.append(el('dt', {text: label}), el('dd', {dataset: {field: key || label.toLowerCase()}, text: value}));
    add('Name', n.name);
    add('State', n.state);
    add('Hostname', n.hostname || '—');
    add('Address', n.address || '—');
    add('CPUs', fmtInt(n.cpus), 'cpus');
    add('Active workers', fmtInt(n.workers), 'workers');
    add('Last seen', fmtAgo(n.last_seen_ms) + ' (' + fmtTime(n.last_seen_ms) + ')', 'last_seen');
    add('Registered', fmtTime(n.created_ms), 'created');
    add('Heartbeat timeout', fmtDuration(n.timeout_ms / 1000), 'timeout');
    add('Labels', Object.keys(n.labels || {}).length ? JSON.stringify(n.labels) : '—', 'labels');
    card.append(fields);
    card.append(el('h3', {text: n.gpus.length ? 'GPUs' : 'No GPUs'}));
    if (n.gpus.length) {
      const gpus = el('table', {id: 'node-gpus'}, el('thead', {}, el('tr', {},
        el('th', {class: 'num', text: 'Index'}), el('th', {text: 'Name'}),
        el('th', {class: 'num', text: 'Memory'}), el('th', {class: 'num', text: 'Free'}),
        el('th', {text: 'Used'}))));
      const body = el('tbody');
      for (const g of n.gpus) {
        const total = g.memory_total_mb || 0, free = g.memory_free_mb || 0;
        body.append(el('tr', {dataset: {gpu: gpuLabel(g)}},
          el('td', {class: 'num', text: gpuLabel(g)}), el('td', {text: g.name || '—'}),
          el('td', {class: 'num', dataset: {field: 'memory'}, text: fmtBytes(total * 1048576)}),
          el('td', {class: 'num', dataset: {field: 'free'}, text: fmtBytes(free * 1048576)}),
          el('td', {}, bar([[total ? (total - free) / total : 0, 'used']], fmtPercent(total - free, total) + ' used'))));
      }
      gpus.append(body);
      card.append(gpus);
    }
    const workers = nodeWorkers(data, n.name).sort((a, b) => b.last_seen_ms - a.last_seen_ms);
    card.append(el('h3', {text: workers.length ? 'Workers' : 'No workers on this node'}));
    if (workers.length) card.append(workersTable(data, workers, 'node-workers-table'));
    card.append(el('p', {}, el('a', {href: '/', id: 'back', text: '← the whole head'})));
  }

  // ---- sessions ----

  function renderSessions(card, data) {
    const sessions = data.replies['/v1/sessions'].sessions;
    const table = el('table', {id: 'sessions-table'},
      el('thead', {}, el('tr', {}, el('th', {text: 'Session'}), el('th', {text: 'Queue'}),
        ...['Done', 'Failed', 'Total'].map(t => el('th', {class: 'num', text: t})),
        el('th', {text: 'Progress'}), el('th', {class: 'num', text: '%'}),
        el('th', {text: 'Age'}), el('th', {text: 'Client last called'}),
        el('th', {text: 'Cleanup on exit'}))));
    const body = el('tbody');
    for (const s of sessions) {
      const c = s.counts;
      body.append(el('tr', {dataset: {session: s.id}},
        el('td', {}, el('code', {text: s.id})),
        el('td', {dataset: {field: 'queue'}, text: s.queue}),
        el('td', {class: 'num', dataset: {field: 'done'}, text: fmtInt(c.done)}),
        el('td', {class: 'num', dataset: {field: 'failed'}, text: fmtInt(c.failed)}),
        el('td', {class: 'num', dataset: {field: 'total'}, text: fmtInt(c.total)}),
        el('td', {}, bar([[c.total ? c.done / c.total : 0, ''], [c.total ? c.failed / c.total : 0, 'failed']],
                         c.done + ' done, ' + c.failed + ' failed, ' + c.pending + ' pending')),
        el('td', {class: 'num', dataset: {field: 'percent'}, text: fmtPercent(c.done + c.failed, c.total)}),
        el('td', {dataset: {field: 'age'}, text: fmtDuration((Date.now() - s.created_ms) / 1000)}),
        el('td', {text: fmtAgo(s.last_seen_ms)}),
        el('td', {dataset: {field: 'cleanup'}, text: s.cleanup_on_exit ? 'yes' : 'no',
                  title: s.cleanup_on_exit ? 'closed after ' + fmtDuration(s.timeout_ms / 1000) +
                         ' without a call from its client' : 'stays open until closed'})));
    }
    if (!sessions.length)
      body.append(el('tr', {}, el('td', {class: 'empty', colspan: 10, text: 'No open sessions.'})));
    table.append(body);
    card.append(table);
  }

  // ---- iterations ----

  // Each iteration's status with its ranks: one GET /v1/iterations/{name} each.
  async function loadIterations(data) {
    data.iterations = await Promise.all(data.replies['/v1/iterations'].iterations.map(
      it => api('/v1/iterations/' + encodeURIComponent(it.name)).catch(e => {
        if (e instanceof ApiError && e.status === 404) return null; // deleted meanwhile
        throw e;
      })));
    data.iterations = data.iterations.filter(Boolean);
  }

  const HEALTHS = ['active', 'slow', 'idle', 'failed', 'unknown'];

  function renderIterations(card, data) {
    const its = data.iterations;
    const table = el('table', {id: 'iterations-table'},
      el('thead', {}, el('tr', {}, el('th', {text: 'Iteration'}), el('th', {text: 'Strategy'}),
        el('th', {text: 'Epoch'}), ...['Blocks done', 'Leased', 'Pending'].map(t => el('th', {class: 'num', text: t})),
        el('th', {text: 'Progress'}), el('th', {class: 'num', text: 'Samples/s'}),
        el('th', {text: 'Ranks'}))));
    const body = el('tbody');
    for (const it of its) {
      const b = it.blocks, epochs = it.config.epochs;
      const throughput = it.ranks.reduce((sum, r) => sum + (r.health === 'failed' ? 0 : r.throughput), 0);
      const health = {};
      for (const r of it.ranks) health[r.health] = (health[r.health] || 0) + 1;
      const chips = el('td', {class: 'health', dataset: {field: 'health'}});
      for (const h of HEALTHS)
        if (health[h]) chips.append(el('span', {class: 'chip health-' + h, dataset: {health: h}, text: health[h] + ' ' + h}));
      const epoch = el('td', {},
        it.finished ? el('span', {dataset: {field: 'epoch'}, text: 'finished'})
                    : el('span', {dataset: {field: 'epoch'}, text: String(it.epoch)}),
        el('span', {class: 'muted', text: it.finished ? '' : epochs ? ' of ' + epochs : ' (unbounded)'}));
      body.append(el('tr', {dataset: {iteration: it.name}},
        el('td', {}, el('strong', {text: it.name}), it.cluster_sync ? null : el('span', {class: 'muted', text: ' (on a node)'})),
        el('td', {dataset: {field: 'strategy'}, text: it.config.strategy}),
        epoch,
        el('td', {class: 'num'}, el('span', {dataset: {field: 'done'}, text: fmtInt(b.done)}),
           el('span', {class: 'muted'}, ' / ', el('span', {dataset: {field: 'total'}, text: fmtInt(b.total)}))),
        el('td', {class: 'num', dataset: {field: 'leased'}, text: fmtInt(b.leased)}),
        el('td', {class: 'num', dataset: {field: 'pending'}, text: fmtInt(b.pending)}),
        el('td', {}, bar(it.finished ? [[1, '']] : [[b.total ? b.done / b.total : 0, ''],
                                                    [b.total ? b.leased / b.total : 0, 'leased']],
                         it.finished ? 'finished' : fmtPercent(b.done, b.total) + ' of epoch ' + it.epoch)),
        el('td', {class: 'num', dataset: {field: 'throughput'}, text: fmtRate(throughput)}),
        chips));
    }
    if (!its.length)
      body.append(el('tr', {}, el('td', {class: 'empty', colspan: 9, text: 'No iterations.'})));
    table.append(body);
    card.append(table);
    for (const it of its) card.append(ranksTable(it));
  }

  function ranksTable(it) {
    const wrap = el('div', {class: 'ranks'}, el('h3', {text: it.name + ': ranks'}));
    const table = el('table', {class: 'ranks-table', dataset: {iteration: it.name}},
      el('thead', {}, el('tr', {}, el('th', {class: 'num', text: 'Rank'}), el('th', {text: 'Health'}),
        ...['Samples', 'Blocks', 'Samples/s', 'Leases', 'Taken over', 'Expired'].map(t => el('th', {class: 'num', text: t})),
        el('th', {text: 'Last seen'}))));
    const body = el('tbody');
    for (const r of it.ranks.slice(0, MAX_RANKS_SHOWN)) {
      const row = el('tr', {dataset: {rank: r.rank}},
        el('td', {class: 'num', text: r.rank}),
        el('td', {}, el('span', {class: 'chip health-' + r.health, dataset: {field: 'health'}, text: r.health})));
      for (const key of ['samples', 'blocks'])
        row.append(el('td', {class: 'num', dataset: {field: key}, text: fmtInt(r[key])}));
      row.append(el('td', {class: 'num', dataset: {field: 'throughput'}, text: fmtRate(r.throughput)}));
      for (const key of ['leases', 'taken_over', 'expired'])
        row.append(el('td', {class: 'num', dataset: {field: key}, text: fmtInt(r[key])}));
      row.append(el('td', {text: fmtAgo(r.last_seen_ms)}));
      body.append(row);
    }
    if (it.ranks.length > MAX_RANKS_SHOWN)
      body.append(el('tr', {}, el('td', {class: 'empty', colspan: 9,
        text: (it.ranks.length - MAX_RANKS_SHOWN) + ' more ranks (their health is counted above).'})));
    table.append(body);
    wrap.append(table);
    return wrap;
  }

  // ---- shared data ----

  // The scopes whose blobs are listed (the API has no list of scopes): the open
  // sessions (each is a scope), scopes named by the tasks being worked on, and those
  // given in the URL (?shared=models,tables).
  async function loadShared(data) {
    const scopes = new Set((params.get('shared') || '').split(',').map(s => s.trim()).filter(Boolean));
    for (const tasks of Object.values(data.holding))
      for (const t of tasks)
        for (const req of t.requires || []) if (req && req.scope) scopes.add(req.scope);
    for (const s of data.replies['/v1/sessions'].sessions.slice(0, MAX_SESSION_SCOPES)) scopes.add(s.id);
    data.shared = {served: null, scopes: [...scopes].sort(), blobs: []};
    const replies = await Promise.all(data.shared.scopes.map(
      s => apiOr404('/v1/shared/' + encodeURIComponent(s))));
    replies.forEach((reply, i) => {
      if (reply.missing === 'not_found') {
        // The route itself is missing (not shared_not_found): an older head.
        if (data.shared.served === null) data.shared.served = false;
        return;
      }
      data.shared.served = true;
      if (reply.missing) return; // a scope without blobs, or a session just closed
      for (const blob of reply.blobs || []) data.shared.blobs.push(Object.assign({scope: data.shared.scopes[i]}, blob));
    });
  }

  function renderShared(card, data) {
    const sh = data.shared;
    if (sh.served === false) {
      card.append(el('p', {class: 'empty', id: 'shared-unavailable',
        text: 'This head does not serve shared data (GET /v1/shared/{scope} is not there).'}));
      return;
    }
    const bytes = sh.blobs.reduce((sum, b) => sum + (b.size || 0), 0);
    card.append(el('div', {class: 'toolbar'}, el('span', {id: 'shared-summary',
      text: sh.blobs.length + ' blobs, ' + fmtBytes(bytes) + ' at their newest levels, in ' +
            sh.scopes.length + ' scopes looked at'})));
    const table = el('table', {id: 'shared-table'},
      el('thead', {}, el('tr', {}, el('th', {text: 'Scope'}), el('th', {text: 'Name'}),
        el('th', {class: 'num', text: 'Level'}), el('th', {text: 'Levels kept'}),
        el('th', {class: 'num', text: 'Size'}), el('th', {text: 'Checksum'}), el('th', {text: 'Expires'}))));
    const body = el('tbody');
    for (const b of sh.blobs) {
      body.append(el('tr', {dataset: {scope: b.scope, blob: b.name}},
        el('td', {}, el('code', {text: b.scope})),
        el('td', {}, el('strong', {text: b.name})),
        el('td', {class: 'num', dataset: {field: 'level'}, text: b.level}),
        el('td', {class: 'muted', dataset: {field: 'levels'}, text: (b.levels || [b.level]).join(', ')}),
        el('td', {class: 'num', dataset: {field: 'size'}, text: fmtBytes(b.size), title: fmtInt(b.size) + ' bytes'}),
        el('td', {class: 'muted'}, el('code', {text: b.checksum || '—'})),
        el('td', {dataset: {field: 'expires'}, text: fmtIn(b.expires_ms), title: fmtTime(b.expires_ms)})));
    }
    if (!sh.blobs.length)
      body.append(el('tr', {}, el('td', {class: 'empty', colspan: 7, text: sh.scopes.length ?
        'No shared data in the scopes looked at.' :
        'No scopes to look at: sessions are listed on their own; add global scopes with ?shared=NAME,NAME.'})));
    table.append(body);
    card.append(table);
  }

  const SECTIONS = [
    {id: 'queues', title: 'Queues', needs: ['/v1/throughput?seconds=' + CHART_SECONDS],
     pages: ['main'], render: renderQueues},
    {id: 'throughput', title: 'Throughput', note: 'completions per second, last 10 minutes',
     needs: ['/v1/throughput?seconds=' + CHART_SECONDS], pages: ['main'], render: renderThroughput},
    {id: 'workers', title: 'Workers', needs: [], pages: ['main'], render: renderWorkers},
    {id: 'leaderboard', title: 'Leaderboard', needs: ['/v1/leaderboard'],
     pages: ['main', 'leaderboard'], render: renderLeaderboard},
    {id: 'nodes', title: 'Nodes', needs: ['/v1/nodes'], pages: ['main'], headOnly: true,
     render: renderNodes},
    {id: 'sessions', title: 'Sessions', needs: ['/v1/sessions'], pages: ['main'], headOnly: true,
     render: renderSessions},
    {id: 'iterations', title: 'Iterations', note: 'the current epoch, and each rank',
     needs: ['/v1/iterations'], pages: ['main'], headOnly: true, load: loadIterations,
     render: renderIterations},
    {id: 'shared', title: 'Shared data', note: 'newest level of each blob', needs: ['/v1/sessions'],
     pages: ['main'], headOnly: true, load: loadShared, render: renderShared},
    {id: 'worker', title: 'Worker', needs: [], pages: ['worker'], load: loadWorkerTasks,
     render: renderWorker},
    {id: 'node', title: 'Node', needs: ['/v1/nodes'], pages: ['node'], headOnly: true,
     render: renderNode},
  ];

  function visibleSections() {
    return SECTIONS.filter(s => s.pages.includes(state.view.page) &&
                                !(s.headOnly && state.view.pipeline));
  }

  // ---- one worker ----

  function findWorker(data) {
    const v = state.view;
    if (v.id) return data.workers.find(w => w.id === v.id);
    // DistCompute URLs name the stage (its queue, lowercased by the client, or
    // its letter) and the display name.
    return data.workers.find(w => w.name === v.name && (!v.stage ||
      (w.queues || []).some(q => q.toLowerCase() === v.stage.toLowerCase()) ||
      (w.labels && w.labels.stage === v.stage)));
  }

  // The tasks the worker of the page holds, with their payloads (the listings
  // are brief): one GET /v1/tasks/{id} for each of the first MAX_PAYLOADS_SHOWN.
  async function loadWorkerTasks(data) {
    const w = findWorker(data);
    const held = w ? (data.holding[w.id] || []).slice(0, MAX_PAYLOADS_SHOWN) : [];
    data.workerTasks = (await Promise.all(held.map(t => apiOr404('/v1/tasks/' + t.id))))
      .filter(t => !t.missing && t.state === 'leased' && t.lease && t.lease.worker === w.id);
  }

  function renderWorker(card, data) {
    const w = findWorker(data);
    card.querySelector('h2').textContent = w ? w.name : 'Worker';
    if (!w) {
      card.append(el('p', {class: 'empty', id: 'worker-missing', text: 'No such worker.'}));
      return;
    }
    const fields = el('dl', {class: 'fields', id: 'worker-fields'});
    const add = (label, value, key) =>
      fields.append(el('dt', {text: label}), el('dd', {dataset: {field: key || label.toLowerCase()}, text: value}));
    add('Id', w.id);
    add('Nickname', w.nickname);
    add('State', w.state);
    add('Node', w.node || '—');
    add('Queues', (w.queues || []).join(', ') || '—');
    add('Progress', w.progress || '—');
    add('Last seen', fmtAgo(w.last_seen_ms) + ' (' + fmtTime(w.last_seen_ms) + ')', 'last_seen');
    add('Registered', fmtTime(w.created_ms), 'created');
    add('Heartbeat timeout', fmtDuration(w.timeout_ms / 1000), 'timeout');
    add('Completed', fmtInt(w.completed));
    add('Failed', fmtInt(w.failed));
    add('Flagged', fmtInt(w.flagged));
    add('Labels', w.labels ? JSON.stringify(w.labels) : '—');
    card.append(fields);
    const held = heldCount(data, w);
    card.append(el('h3', {id: 'worker-holding', text: held === 0 ? 'Not working on a task now' :
      held === 1 ? 'Working on 1 task' : 'Working on ' + fmtInt(held) + ' tasks'}));
    const listed = data.workerTasks || [];
    for (const t of listed) {
      const payload = typeof t.payload === 'string' ? t.payload : JSON.stringify(t.payload, null, 2);
      card.append(el('p', {}, el('strong', {text: 'task #' + t.id}), ' in ' + t.queue +
                     ', attempt ' + t.attempts + ', lease until ' + fmtTime(t.lease.deadline_ms)),
                  el('pre', {text: payload.length > 2000 ? payload.slice(0, 2000) + '…' : payload}));
    }
    if (held > listed.length)
      card.append(el('p', {class: 'muted', id: 'worker-unlisted', text: fmtInt(held - listed.length) +
        (listed.length ? ' more' : '') + ' not shown (the page lists the first ' +
        fmtInt(MAX_PAYLOADS_SHOWN) + ' of the first ' + fmtInt(MAX_LEASED_LISTED) +
        ' leased tasks of each queue).'}));
    const back = data.pipeline ? data.pipeline.prefix + '/' : '/';
    card.append(el('p', {}, el('a', {href: back, id: 'back', text: '← all workers'})));
  }

  // ---- the page ----

  function showLogin(message) {
    clearTimeout(state.timer);
    $('app').hidden = true;
    $('logout').hidden = true;
    $('login').hidden = false;
    $('status').textContent = '';
    $('login-error').hidden = !message;
    $('login-error').textContent = message || '';
    $('token').focus();
  }

  function render(data) {
    const root = $('sections');
    root.replaceChildren();
    for (const section of visibleSections()) {
      const card = el('section', {class: 'card', id: section.id},
        el('h2', {}, section.title, section.note ? el('span', {class: 'muted', text: ' — ' + section.note}) : null));
      root.append(card);
      section.render(card, data);
    }
    const scope = data.pipeline ? 'DistCompute project ' + data.pipeline.project : '';
    $('scope').textContent = scope;
    $('brand').href = data.pipeline ? data.pipeline.prefix + '/' : '/';
    $('status').textContent = 'v' + data.health.version + ' · up ' +
      fmtDuration(data.health.uptime_ms / 1000) + ' · updated ' + new Date().toLocaleTimeString();
  }

  async function refresh() {
    clearTimeout(state.timer);
    try {
      const data = await load();
      render(data);
      $('error').hidden = true;
      state.refreshes++;
      document.body.dataset.refreshes = state.refreshes;
    } catch (e) {
      if (e instanceof AuthError) {
        localStorage.removeItem(TOKEN_KEY);
        state.token = '';
        showLogin(state.refreshes ? 'The token is no longer accepted.' : 'That token was refused.');
        return;
      }
      $('error').hidden = false;
      $('error').textContent = 'Could not refresh: ' + e.message;
    }
    state.timer = setTimeout(refresh, REFRESH_MS);
  }

  function start() {
    $('login').hidden = true;
    $('app').hidden = false;
    $('logout').hidden = false;
    refresh();
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('login-form').addEventListener('submit', event => {
      event.preventDefault();
      state.token = $('token').value.trim();
      $('token').value = '';
      localStorage.setItem(TOKEN_KEY, state.token);
      state.refreshes = 0;
      start();
    });
    $('logout').addEventListener('click', () => {
      localStorage.removeItem(TOKEN_KEY);
      state.token = '';
      showLogin('');
    });
    window.addEventListener('hashchange', () => { state.view = parseView(); if (state.token) refresh(); });
    if (state.token) start(); else showLogin('');
  });
})();
