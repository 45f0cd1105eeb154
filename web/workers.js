// The dashboard's workers: the workers table (also on a node's page), the tasks each
// holds, and one worker's page. Loaded after common.js.
'use strict';

(function (muster) {
  const {MAX_LEASED_LISTED, state, el, fmtInt, fmtDuration, fmtAgo, fmtTime, apiOr404,
         workerHref, nodeLink} = muster;
  const MAX_TASK_IDS_SHOWN = 3;   // task ids in a worker's row; the rest are counted
  const MAX_PAYLOADS_SHOWN = 20;  // payloads on a worker's page; the rest are counted
  const MAX_WORKERS_SHOWN = 500;  // rows of the workers table (those seen last); the rest are counted
  // Why a worker went (its gone_reason): the words of its State, and what they mean.
  const GONE_WHY = {
    bye: ['said bye', 'it said goodbye'],
    timeout: ['timed out', 'no heartbeat reached the head within its timeout'],
    crashed: ['crashed', 'its node agent reported that its process died'],
    node_left: ['node left', 'its node left, and its workers with it'],
    node_timeout: ['node timed out', 'its node went silent past the node\'s timeout'],
    node_restarted: ['node restarted', 'its node was registered again by a new agent, whose ' +
                     'old workers died with the old one'],
  };

  // A worker's state, and for a gone one why and when: "gone: timed out 3m 10s ago".
  // One that went before the head kept why (gone_reason "unknown") is "gone".
  function stateText(w) {
    const why = w.state === 'gone' && GONE_WHY[w.gone_reason];
    if (!why) return w.state;
    return 'gone: ' + why[0] + (w.gone_at_ms ? ' ' + fmtAgo(w.gone_at_ms) : '');
  }

  function stateTitle(w) {
    const why = w.state === 'gone' && GONE_WHY[w.gone_reason];
    return why ? why[1] + (w.gone_at_ms ? ', at ' + fmtTime(w.gone_at_ms) : '') : '';
  }

  function renderWorkers(card, data) {
    const toggle = el('input', {type: 'checkbox', id: 'show-gone'});
    toggle.checked = state.showGone;
    toggle.addEventListener('change', () => { state.showGone = toggle.checked; muster.refresh(); });
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
      // A gone worker's row is greyed: its progress is the last it sent ("running task
      // 12"), which read as live beside the active workers' rows.
      body.append(el('tr', {class: w.state === 'gone' ? 'gone' : '', dataset: {worker: w.name}},
        el('td', {class: 'name'}, el('a', {href: workerHref(data, w), text: w.name})),
        el('td', {class: 'name', dataset: {field: 'nickname'}, text: w.nickname}),
        el('td', {class: 'muted name'}, data.pipeline ? w.node || '—' : nodeLink(w.node)),
        el('td', {class: 'name', text: (w.queues || []).join(', ') || '—'}),
        el('td', {dataset: {field: 'task'}, text: tasks || '—'}),
        el('td', {class: 'progress', dataset: {field: 'progress'}, text: w.progress || '',
                  title: w.state === 'gone' ? 'the last progress it sent' : ''}),
        el('td', {text: fmtAgo(w.last_seen_ms)}),
        el('td', {class: 'state-' + w.state, dataset: {field: 'state'}, text: stateText(w),
                  title: stateTitle(w)}),
        el('td', {class: 'num', dataset: {field: 'completed'}, text: fmtInt(w.completed)})));
    }
    if (!shown.length)
      body.append(el('tr', {}, el('td', {class: 'empty', colspan: 9, text: 'No workers.'})));
    table.append(body);
    return table;
  }

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
    add('State', stateText(w));
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

  Object.assign(muster, {renderWorkers, workersTable, loadWorkerTasks, renderWorker});
})(window.muster);
