// The dashboard's sessions and iterations: the open sessions with their results, and
// each iteration's current epoch and ranks. Loaded after common.js.
'use strict';

(function (muster) {
  const {el, fmtInt, fmtDuration, fmtAgo, fmtRate, fmtPercent, bar, api, ApiError} = muster;
  const MAX_RANKS_SHOWN = 64;  // per iteration; the rest are summed up

  // ---- sessions ----

  function renderSessions(card, data) {
    const sessions = data.replies['/v1/sessions'].sessions;
    const table = el('table', {id: 'sessions-table'},
      el('thead', {}, el('tr', {}, el('th', {text: 'Session'}), el('th', {text: 'Queue'}),
        ...['Done', 'Failed', 'Total'].map(t => el('th', {class: 'num', text: t})),
        el('th', {text: 'Progress'}), el('th', {class: 'num', text: '%'}),
        el('th', {text: 'Age'}), el('th', {text: 'Client last called'}),
        el('th', {text: 'Sealed', title: 'sealed: its producer said no more tasks will come'}),
        el('th', {text: 'Cleanup on exit'}))));
    const body = el('tbody');
    for (const s of sessions) {
      const c = s.counts;
      body.append(el('tr', {dataset: {session: s.id}},
        el('td', {}, el('code', {text: s.id})),
        el('td', {class: 'name', dataset: {field: 'queue'}, text: s.queue}),
        el('td', {class: 'num', dataset: {field: 'done'}, text: fmtInt(c.done)}),
        el('td', {class: 'num', dataset: {field: 'failed'}, text: fmtInt(c.failed)}),
        el('td', {class: 'num', dataset: {field: 'total'}, text: fmtInt(c.total)}),
        el('td', {}, bar([[c.total ? c.done / c.total : 0, ''], [c.total ? c.failed / c.total : 0, 'failed']],
                         c.done + ' done, ' + c.failed + ' failed, ' + c.pending + ' pending')),
        el('td', {class: 'num', dataset: {field: 'percent'}, text: fmtPercent(c.done + c.failed, c.total)}),
        el('td', {dataset: {field: 'age'}, text: fmtDuration((Date.now() - s.created_ms) / 1000)}),
        el('td', {text: fmtAgo(s.last_seen_ms)}),
        el('td', {dataset: {field: 'sealed'}, text: s.sealed ? 'sealed' : '',
                  title: s.sealed ? 'takes no more tasks: its results end with these' : 'takes tasks until closed'}),
        el('td', {dataset: {field: 'cleanup'}, text: s.cleanup_on_exit ? 'yes' : 'no',
                  title: s.cleanup_on_exit ? 'closed after ' + fmtDuration(s.timeout_ms / 1000) +
                         ' without a call from its client' : 'stays open until closed'})));
    }
    if (!sessions.length)
      body.append(el('tr', {}, el('td', {class: 'empty', colspan: 11, text: 'No open sessions.'})));
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
        el('td', {class: 'name'}, el('strong', {text: it.name}), it.cluster_sync ? null : el('span', {class: 'muted', text: ' (on a node)'})),
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

  Object.assign(muster, {renderSessions, loadIterations, renderIterations});
})(window.muster);
