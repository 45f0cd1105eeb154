// The muster dashboard: plain JavaScript, no framework, no network but the head's API.
//
// The page asks for a token (kept in localStorage) and reads the JSON API with it.
// Every REFRESH_MS it fetches what the sections need, in parallel, and re-renders
// them. A section is an object in SECTIONS: {id, title, needs, render}; `needs`
// names the API paths it reads, `render` fills its card from their replies. Nodes,
// sessions, iterations and shared blobs become sections the same way when the head
// serves them (see docs/dashboard.md).
//
// Views: "/" is the whole head; "#/worker/ID" one worker; under
// "/compat/distcompute/NAME" the same views are limited to that DistCompute
// pipeline, with its "/leaderboard" and "/worker/STAGE/DISPLAY_NAME" pages.
'use strict';

(function () {
  const TOKEN_KEY = 'muster.token';
  const params = new URLSearchParams(location.search);
  const REFRESH_MS = Math.max(250, parseInt(params.get('refresh') || '2000', 10) || 2000);
  const RATE_WINDOW_S = 300; // completion rate and ETA over the last 5 minutes
  const CHART_SECONDS = 600;
  const CHART_BIN_S = 10;
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

  function parseView() {
    const m = location.pathname.match(
      /^\/compat\/distcompute\/([^/]+)(?:\/(leaderboard|worker\/([^/]+)\/([^/]+)))?\/?$/);
    const hash = location.hash.match(/^#\/worker\/(\d+)$/);
    if (m) {
      const view = {pipeline: decodeURIComponent(m[1]), page: 'main'};
      if (m[2] === 'leaderboard') view.page = 'leaderboard';
      else if (m[2]) Object.assign(view, {page: 'worker', stage: decodeURIComponent(m[3]),
                                          name: decodeURIComponent(m[4])});
      if (hash) Object.assign(view, {page: 'worker', id: +hash[1]});
      return view;
    }
    return hash ? {page: 'worker', id: +hash[1]} : {page: 'main'};
  }

  async function api(path) {
    const res = await fetch(path, {headers: {Authorization: 'Bearer ' + state.token},
                                   cache: 'no-store'});
    if (res.status === 401) throw new AuthError('token refused');
    if (!res.ok) {
      let message = res.status + ' ' + res.statusText;
      try { message = (await res.json()).error.message; } catch (e) { /* keep the status */ }
      throw new Error(path + ': ' + message);
    }
    return res.json();
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
      data.workers = data.workers.filter(w => w.labels && w.labels.distcompute === data.pipeline.name);
    }
    // The tasks each worker holds: one listing of leased tasks per busy queue.
    data.holding = {};
    await Promise.all(data.queues.filter(q => q.counts.leased > 0).map(async q => {
      const reply = await api('/v1/queues/' + encodeURIComponent(q.name) +
                              '/tasks?state=leased&limit=1000');
      for (const task of reply.tasks) {
        const worker = task.lease && task.lease.worker;
        if (worker) (data.holding[worker] = data.holding[worker] || []).push(task);
      }
    }));
    return data;
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
      const eta = remaining === 0 ? 'done' : perSecond > 0 ? fmtDuration(remaining / perSecond) : '—';
      const total = c.queued + c.leased + c.done + c.failed + c.dead;
      const bar = el('span');
      bar.style.width = (total ? 100 * c.done / total : 0).toFixed(1) + '%';
      const letter = stageLetter(data, q.name);
      const row = el('tr', {dataset: {queue: q.name}},
        el('td', {}, letter ? letter + ' · ' : '', el('strong', {text: q.name})),
        el('td', {class: 'muted', text: q.next || '—'}));
      for (const key of ['queued', 'leased', 'done', 'failed', 'dead'])
        row.append(el('td', {class: 'num', dataset: {field: key}, text: fmtInt(c[key])}));
      row.append(el('td', {class: 'num', dataset: {field: 'rate'}, text: (perSecond * 60).toFixed(1)}),
                 el('td', {class: 'num', dataset: {field: 'eta'}, text: eta}),
                 el('td', {}, el('div', {class: 'bar'}, bar)));
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
      g.fillText((max * i / 4).toPrecision(2).replace(/\.0+$/, '') + '/s', left - 6, y + 4);
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

  function niceCeil(v) {
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  function renderWorkers(card, data) {
    const toggle = el('input', {type: 'checkbox', id: 'show-gone'});
    toggle.checked = state.showGone;
    toggle.addEventListener('change', () => { state.showGone = toggle.checked; refresh(); });
    const active = data.workers.filter(w => w.state === 'active').length;
    card.append(el('div', {class: 'toolbar'},
      el('span', {id: 'workers-active', text: active + ' active, ' + (data.workers.length - active) + ' gone'}),
      el('label', {}, toggle, ' show gone workers')));
    const shown = data.workers.filter(w => state.showGone || w.state === 'active')
      .sort((a, b) => b.last_seen_ms - a.last_seen_ms).slice(0, 500);
    const table = el('table', {id: 'workers-table'},
      el('thead', {}, el('tr', {}, ...['Worker', 'Nickname', 'Node', 'Stage', 'Task', 'Progress',
        'Last seen', 'State'].map(t => el('th', {text: t})), el('th', {class: 'num', text: 'Done'}))));
    const body = el('tbody');
    for (const w of shown) {
      const tasks = (data.holding[w.id] || []).map(t => '#' + t.id).join(' ');
      body.append(el('tr', {dataset: {worker: w.name}},
        el('td', {}, el('a', {href: workerHref(data, w), text: w.name})),
        el('td', {dataset: {field: 'nickname'}, text: w.nickname}),
        el('td', {class: 'muted', text: w.node || '—'}),
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
    card.append(table);
  }

  // Totals per nickname: the head's leaderboard, or one computed from the
  // pipeline's own workers in a DistCompute view.
  function leaderboard(data) {
    if (!data.pipeline) return data.replies['/v1/leaderboard'].leaderboard;
    const by = {};
    for (const w of data.workers) {
      const e = by[w.nickname] = by[w.nickname] ||
        {nickname: w.nickname, completed: 0, failed: 0, flagged: 0, workers: 0};
      e.completed += w.completed; e.failed += w.failed; e.flagged += w.flagged; e.workers++;
    }
    return Object.values(by).sort((a, b) => b.completed - a.completed ||
                                            a.nickname.localeCompare(b.nickname));
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

  const SECTIONS = [
    {id: 'queues', title: 'Queues', needs: ['/v1/throughput?seconds=' + CHART_SECONDS],
     pages: ['main'], render: renderQueues},
    {id: 'throughput', title: 'Throughput', note: 'completions per second, last 10 minutes',
     needs: ['/v1/throughput?seconds=' + CHART_SECONDS], pages: ['main'], render: renderThroughput},
    {id: 'workers', title: 'Workers', needs: [], pages: ['main'], render: renderWorkers},
    {id: 'leaderboard', title: 'Leaderboard', needs: ['/v1/leaderboard'],
     pages: ['main', 'leaderboard'], render: renderLeaderboard},
    {id: 'worker', title: 'Worker', needs: [], pages: ['worker'], render: renderWorker},
  ];

  function visibleSections() {
    return SECTIONS.filter(s => s.pages.includes(state.view.page));
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
    const tasks = data.holding[w.id] || [];
    card.append(el('h3', {text: tasks.length ? 'Working on' : 'Not working on a task now'}));
    for (const t of tasks) {
      const payload = typeof t.payload === 'string' ? t.payload : JSON.stringify(t.payload, null, 2);
      card.append(el('p', {}, el('strong', {text: 'task #' + t.id}), ' in ' + t.queue +
                     ', attempt ' + t.attempts + ', lease until ' + fmtTime(t.lease.deadline_ms)),
                  el('pre', {text: payload.length > 2000 ? payload.slice(0, 2000) + '…' : payload}));
    }
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
