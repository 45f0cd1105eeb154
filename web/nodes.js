// The dashboard's nodes: the nodes table with their GPUs and workers, and one node's
// page. Loaded after common.js and workers.js (a node's page has a workers table).
'use strict';

(function (muster) {
  const {state, el, compareNames, fmtInt, fmtDuration, fmtAgo, fmtTime, fmtBytes, fmtPercent,
         bar, workerHref, nodeLink, workersTable} = muster;

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
        el('td', {class: 'name'}, el('strong', {}, nodeLink(n.name))),
        el('td', {class: 'muted name', dataset: {field: 'address'}, text: n.address || '—'}),
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

  Object.assign(muster, {renderNodes, renderNode});
})(window.muster);
