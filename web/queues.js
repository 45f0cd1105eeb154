// The dashboard's queues: their order (pipelines along `next`), the queues table
// with its rate and ETA, each queue's panel of why its tasks failed or died, and the
// throughput chart. Loaded after common.js.
'use strict';

(function (muster) {
  const {CHART_SECONDS, state, el, compareNames, fmtInt, fmtDuration, fmtAgo, fmtTime,
         fmtPercent, bar, api} = muster;
  const MAX_FAILURES_SHOWN = 20; // tasks in a queue's panel of failed and dead tasks
  const RATE_WINDOW_S = 300; // completion rate and ETA over the last 5 minutes
  const CHART_BIN_S = 10;
  const NONE_LEASED_TITLE = 'none of its tasks is leased and none was done in the last 5 ' +
    'minutes: no worker serves this queue, or its tasks wait for their delay_ms';
  // Where a queue's cancelled tasks come from (muster status counts them too).
  const CANCELLED_TITLE = 'tasks flagged max_flags times, whose task of the stage before was ' +
    'queued again, and the unfinished tasks of closed sessions';
  const COLORS = ['#2f6fde', '#1e8e4e', '#d9822b', '#8e44ad', '#c0392b', '#16a085', '#7f8c8d',
                  '#b7950b'];

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

  // The ETA cell: when the `remaining` tasks (queued and leased) will be done at
  // `perSecond`. Nothing remaining is "waiting" in a stage whose earlier stages still
  // have tasks to send it (`fed`), else "done" for a queue that had tasks: one that
  // never had any (or whose tasks were all purged) has "no tasks". Tasks left with
  // none leased and none done lately are "none leased" (NONE_LEASED_TITLE says why):
  // a bare "—" did not say that nothing is working on them.
  function etaText(remaining, leased, everyTask, perSecond, fed) {
    if (remaining === 0) return fed ? 'waiting' : everyTask === 0 ? 'no tasks' : 'done';
    if (perSecond > 0) return fmtDuration(remaining / perSecond);
    return leased === 0 ? 'none leased' : '—';
  }

  // The names of the queues that work still to do will reach: those after a queue
  // with tasks queued or leased along `next`. A stage that had done all it had while
  // the one before it was still busy was called "done", with a full bar.
  function fedQueues(queues) {
    const byName = new Map(queues.map(q => [q.name, q]));
    const fed = new Set();
    for (const q of queues) {
      if (q.counts.queued + q.counts.leased === 0) continue;
      // Each queue is added once: a walk stops where an earlier one went on (or at
      // its own start, in a loop of `next`s).
      for (let n = byName.get(q.next); n && !fed.has(n.name); n = byName.get(n.next)) fed.add(n.name);
    }
    return fed;
  }

  // A queue's tasks for its progress bar and ETA. The done tasks its retention
  // (keep_done_ms) removed count as done: counts.done counts only those still kept,
  // so without `reaped` the bar would shrink, and a queue whose done tasks all went
  // would have "no tasks", as each removal goes.
  function queueProgress(q) {
    const c = q.counts, reaped = q.reaped || 0;
    const done = c.done + reaped;
    const total = c.queued + c.leased + done + c.failed + c.dead;
    return {done, reaped, total, everyTask: total + (c.cancelled || 0)};
  }

  function renderQueues(card, data) {
    const table = el('table', {id: 'queues-table'},
      el('thead', {}, el('tr', {},
        el('th', {text: data.pipeline ? 'Stage' : 'Queue'}), el('th', {text: 'Next'}),
        ...['Queued', 'Leased', 'Done', 'Failed', 'Dead'].map(t => el('th', {class: 'num', text: t})),
        el('th', {class: 'num', text: 'Cancelled', title: CANCELLED_TITLE}),
        el('th', {class: 'num', text: 'Done/min'}), el('th', {class: 'num', text: 'ETA'}),
        el('th', {text: 'Progress'}))));
    const body = el('tbody');
    const span = rateWindow(data), fed = fedQueues(data.queues);
    for (const q of data.queues) {
      body.append(queueRow(data, q, span, fed.has(q.name)));
      if (data.failures && data.failures[q.name]) body.append(failuresRow(q, data.failures[q.name]));
    }
    if (!data.queues.length)
      body.append(el('tr', {}, el('td', {class: 'empty', colspan: 11, id: 'queues-empty',
        text: 'No queues yet: create one with `muster queue create NAME`.'})));
    table.append(body);
    card.append(table);
  }

  // One row of the queues table; `fed`: an earlier stage still has work for it. The
  // rate counts completions (the head's ring), not done tasks, so the removals of a
  // queue's retention do not lower it.
  function queueRow(data, q, span, fed) {
    const c = q.counts, p = queueProgress(q);
    const perSecond = completions(data, q.name, span) / span;
    const letter = stageLetter(data, q.name);
    const row = el('tr', {dataset: {queue: q.name}},
      el('td', {class: 'name'}, letter ? letter + ' · ' : '', el('strong', {text: q.name})),
      el('td', {class: 'muted name', text: q.next || '—'}));
    for (const key of ['queued', 'leased', 'done', 'failed', 'dead', 'cancelled'])
      row.append(el('td', {class: 'num', dataset: {field: key}},
                    (key === 'failed' || key === 'dead') && c[key] > 0 ? failuresToggle(q, key)
                                                                       : fmtInt(c[key])));
    // Done counts the tasks there are, as the API does; the removed ones are said here.
    if (p.reaped) row.querySelector('[data-field="done"]').title =
      'done and kept; ' + fmtInt(p.reaped) + ' more done and removed by the queue\'s retention';
    const title = fmtPercent(p.done, p.total) + ' done';
    row.append(el('td', {class: 'num', dataset: {field: 'rate'}, text: (perSecond * 60).toFixed(1)}),
               el('td', {class: 'num', dataset: {field: 'eta'},
                         text: etaText(c.queued + c.leased, c.leased, p.everyTask, perSecond, fed),
                         title: c.queued > 0 && c.leased === 0 && perSecond === 0 ? NONE_LEASED_TITLE
                                                                                : ''}),
               el('td', {},
                  bar([[p.total ? p.done / p.total : 0, ''],
                       [p.total ? (c.failed + c.dead) / p.total : 0, 'failed']], title)));
    return row;
  }

  // ---- why tasks failed or died ----

  // A queue's failed or dead count as a button that opens (or closes) the panel of its
  // failed and dead tasks under its row; the page remembers which are open.
  function failuresToggle(q, key) {
    const open = state.failuresOpen.has(q.name);
    const button = el('button', {type: 'button', class: 'link', 'aria-expanded': String(open),
      'aria-controls': 'failures-' + q.name, text: fmtInt(q.counts[key]),
      title: (open ? 'hide' : 'show') + ' why the tasks of ' + q.name + ' failed or died'});
    button.addEventListener('click', () => {
      if (open) state.failuresOpen.delete(q.name); else state.failuresOpen.add(q.name);
      muster.refresh();
    });
    return button;
  }

  // The newest failed and dead tasks of each queue whose panel is open, with their
  // errors: per state with tasks, one listing of its newest (order=recent: by when they
  // failed or died, so a task requeued and dead again is among them) without payloads;
  // the two merged, newest first. A queue with none left has no panel.
  async function loadFailures(data) {
    data.failures = {};
    const open = data.queues.filter(q => state.failuresOpen.has(q.name) &&
                                         q.counts.failed + q.counts.dead > 0);
    await Promise.all(open.map(async q => {
      const replies = await Promise.all(['failed', 'dead'].filter(s => q.counts[s] > 0).map(s =>
        api('/v1/queues/' + encodeURIComponent(q.name) + '/tasks?state=' + s +
            '&order=recent&brief=true&limit=' + MAX_FAILURES_SHOWN)));
      data.failures[q.name] = [].concat(...replies.map(r => r.tasks))
        .sort((a, b) => b.updated_ms - a.updated_ms || b.id - a.id).slice(0, MAX_FAILURES_SHOWN);
    }));
  }

  // The row under queue q's with its failed and dead tasks `tasks`, newest first. Every
  // field is set as text: an error is what a worker sent.
  function failuresRow(q, tasks) {
    const all = q.counts.failed + q.counts.dead;
    const table = el('table', {class: 'failures-table'}, el('thead', {}, el('tr', {},
      ...['Task', 'State', 'Attempts', 'When', 'Error'].map(t => el('th', {text: t})))));
    const body = el('tbody');
    for (const t of tasks)
      body.append(el('tr', {dataset: {task: t.id}},
        el('td', {class: 'num', text: '#' + t.id}), el('td', {text: t.state}),
        el('td', {class: 'num', text: fmtInt(t.attempts)}),
        el('td', {class: 'when', title: fmtTime(t.updated_ms), text: fmtAgo(t.updated_ms)}),
        el('td', {dataset: {field: 'error'}}, el('div', {class: 'error-text', text: t.error || '—'}))));
    table.append(body);
    const what = 'Failed and dead tasks of ' + q.name + ', newest first' +
      (tasks.length < all ? ' (the ' + tasks.length + ' newest of ' + fmtInt(all) + ')' : '');
    return el('tr', {class: 'failures', id: 'failures-' + q.name, dataset: {failuresOf: q.name}},
      el('td', {colspan: 11}, el('p', {class: 'muted', text: what}), table));
  }

  // ---- throughput ----

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
    // A colour for COLORS.length queues: the busiest over the chart's span (the current
    // second too), drawn in the table's order (a tie keeps that order); the rest are
    // said, not drawn.
    const done = new Map(names.map(n => [n, tp.queues[n].reduce((sum, x) => sum + x, 0)]));
    const busiest = new Set([...names].sort((a, b) => done.get(b) - done.get(a)).slice(0, COLORS.length));
    const lines = names.filter(n => busiest.has(n))
      .map((n, i) => ({name: n, color: COLORS[i], values: binned(n)}));
    const canvas = el('canvas', {id: 'chart', width: 1200, height: 180});
    card.append(el('div', {class: 'chart-wrap'}, canvas));
    const legend = el('div', {class: 'legend'});
    for (const line of lines) {
      const swatch = el('i');
      swatch.style.background = line.color;
      legend.append(el('span', {}, swatch, line.name));
    }
    const left = names.filter(n => !busiest.has(n));
    if (left.length)
      legend.append(el('span', {class: 'muted', id: 'chart-more', title: left.join(', '),
                               text: 'and ' + left.length + ' more'}));
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

  Object.assign(muster, {pipelineOrder, renderQueues, loadFailures, renderThroughput});
})(window.muster);
