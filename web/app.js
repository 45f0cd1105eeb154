// The muster dashboard's page: what to fetch, the table of sections, login and
// refresh. Loaded last, after common.js and the files of the sections.
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

(function (muster) {
  const {TOKEN_KEY, params, CHART_SECONDS, MAX_LEASED_LISTED, state, AuthError, NetworkError, el,
         $, fmtDuration, parseView, api, pipelineOrder} = muster;
  const REFRESH_MS = Math.max(250, parseInt(params.get('refresh') || '2000', 10) || 2000);

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

  // The sections in the order of the page; their functions come from the files
  // loaded before this one, through `muster`.
  const SECTIONS = [
    {id: 'queues', title: 'Queues', needs: ['/v1/throughput?seconds=' + CHART_SECONDS],
     pages: ['main'], load: muster.loadFailures, render: muster.renderQueues},
    {id: 'throughput', title: 'Throughput', note: 'completions per second, last 10 minutes',
     needs: ['/v1/throughput?seconds=' + CHART_SECONDS], pages: ['main'], render: muster.renderThroughput},
    {id: 'workers', title: 'Workers', needs: [], pages: ['main'], render: muster.renderWorkers},
    {id: 'leaderboard', title: 'Leaderboard', needs: ['/v1/leaderboard'],
     pages: ['main', 'leaderboard'], render: muster.renderLeaderboard},
    {id: 'nodes', title: 'Nodes', needs: ['/v1/nodes'], pages: ['main'], headOnly: true,
     render: muster.renderNodes},
    {id: 'sessions', title: 'Sessions', needs: ['/v1/sessions'], pages: ['main'], headOnly: true,
     render: muster.renderSessions},
    {id: 'iterations', title: 'Iterations', note: 'the current epoch, and each rank',
     needs: ['/v1/iterations'], pages: ['main'], headOnly: true, load: muster.loadIterations,
     render: muster.renderIterations},
    {id: 'shared', title: 'Shared data', note: 'newest level of each blob', needs: ['/v1/sessions'],
     pages: ['main'], headOnly: true, load: muster.loadShared, render: muster.renderShared},
    {id: 'worker', title: 'Worker', needs: [], pages: ['worker'], load: muster.loadWorkerTasks,
     render: muster.renderWorker},
    {id: 'node', title: 'Node', needs: ['/v1/nodes'], pages: ['node'], headOnly: true,
     render: muster.renderNode},
  ];

  function visibleSections() {
    return SECTIONS.filter(s => s.pages.includes(state.view.page) &&
                                !(s.headOnly && state.view.pipeline));
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
    state.updated = new Date().toLocaleTimeString();
    $('status').textContent = 'v' + data.health.version + ' · up ' +
      fmtDuration(data.health.uptime_ms / 1000) + ' · updated ' + state.updated;
  }

  // The line above the sections when a refresh failed. The sections keep what the
  // last refresh read, greyed (`stale`): their "just now"s would otherwise pass for live.
  // A head that gave no reply gets its likely causes: the browser's own message
  // ("Failed to fetch") names none.
  function refreshError(e) {
    const old = state.updated ? ' What is shown is from ' + state.updated + '.' : '';
    if (e instanceof NetworkError)
      return 'The head did not answer (' + e.message + '): it is down, restarting, or out of ' +
             'reach of this browser. Trying again every ' +
             (REFRESH_MS < 1000 ? REFRESH_MS + ' ms' : fmtDuration(REFRESH_MS / 1000)) + '.' + old;
    return 'Could not refresh: ' + e.message.replace(/\.?$/, '.') + old;
  }

  async function refresh() {
    clearTimeout(state.timer);
    try {
      const data = await load();
      render(data);
      $('error').hidden = true;
      $('sections').classList.remove('stale');
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
      $('error').textContent = refreshError(e);
      $('sections').classList.add('stale');
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

  muster.refresh = refresh;
})(window.muster);
