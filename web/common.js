// The muster dashboard: plain JavaScript, no framework, no network but the head's API.
//
// The page's scripts are plain files loaded by index.html in this order, with no
// build step: common.js (this file: helpers, formatting, the API), queues.js
// (queues and the throughput chart), workers.js (workers and one worker's page),
// leaderboard.js, nodes.js, sessions.js (sessions and iterations), shared.js
// (shared data), and app.js last (what to fetch, the table of sections, login and
// refresh). They share one global, `muster`: this file creates it, each later file
// takes what it uses from it at the top and adds what it defines at the bottom, so
// a file can use only what the files before it define (app.js's `refresh` is
// called through `muster.refresh` once the page runs). See docs/dashboard.md.
'use strict';

window.muster = (function () {
  const TOKEN_KEY = 'muster.token';
  const params = new URLSearchParams(location.search);
  const CHART_SECONDS = 600; // the throughput the page reads (the head keeps 10 minutes)
  const MAX_LEASED_LISTED = 1000; // leased tasks listed per queue (the API's largest page)

  const state = {
    token: localStorage.getItem(TOKEN_KEY) || '',
    timer: null,
    refreshes: 0,
    updated: '', // the time of the last refresh that worked, as shown
    showGone: false,
    failuresOpen: new Set(), // the queues whose panel of failed and dead tasks is open
    view: parseView(),
  };

  class AuthError extends Error {}
  // No reply at all: the head is down, restarting or out of reach. fetch() says so
  // with a TypeError, which a bug in the page's own code throws too; this tells the two apart.
  class NetworkError extends Error {}
  // An error reply: `message` names the path, `reason` is the head's message alone.
  class ApiError extends Error {
    constructor(message, status, code, reason) {
      super(message);
      Object.assign(this, {status, code, reason});
    }
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

  // "1 blob", "2 blobs": a count and its noun, singular for one.
  function fmtCount(n, noun) { return fmtInt(n) + ' ' + noun + (n === 1 ? '' : 's'); }

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
    let res;
    try {
      res = await fetch(path, {headers: {Authorization: 'Bearer ' + state.token}, cache: 'no-store'});
    } catch (e) {
      throw new NetworkError(e.message);
    }
    if (res.status === 401) throw new AuthError('token refused');
    if (!res.ok) {
      let message = res.status + ' ' + res.statusText, code = null;
      try {
        const error = (await res.json()).error;
        message = error.message;
        code = error.code;
      } catch (e) { /* keep the status */ }
      throw new ApiError(path + ': ' + message, res.status, code, message);
    }
    return res.json();
  }

  // Like api(), but a 404 answers {missing: CODE} (its error code) instead of failing.
  async function apiOr404(path) {
    try {
      return await api(path);
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) return {missing: e.code};
      throw e;
    }
  }

  // The link to worker w's page: in a pipeline's view the DistCompute URL its client
  // prints (stage, display name), elsewhere #/worker/ID.
  function workerHref(data, w) {
    if (data.pipeline) {
      const stage = (w.queues && w.queues[0]) || '';
      return data.pipeline.prefix + '/worker/' + encodeURIComponent(stage.toLowerCase()) + '/' +
             encodeURIComponent(w.name);
    }
    return '#/worker/' + w.id;
  }

  // A link to the page of node `name`, or '—' for a worker on no node.
  function nodeLink(name) {
    return name ? el('a', {href: '#/node/' + encodeURIComponent(name), text: name}) : '—';
  }

  return {
    TOKEN_KEY, params, CHART_SECONDS, MAX_LEASED_LISTED, state, AuthError, NetworkError, ApiError,
    el, $, compareNames, fmtInt, fmtCount, fmtDuration, fmtAgo, fmtTime, fmtIn, fmtBytes, fmtRate,
    fmtPercent, bar, parseView, api, apiOr404, workerHref, nodeLink,
  };
})();
