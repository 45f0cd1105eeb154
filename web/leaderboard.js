// The dashboard's leaderboard: nicknames by completed tasks, in one order on every
// page. Loaded after common.js.
'use strict';

(function (muster) {
  const {el, compareNames, fmtInt} = muster;

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
        ...['Completed', 'Failed', 'Flagged'].map(t => el('th', {class: 'num', text: t})),
        el('th', {class: 'num', text: 'Workers', title: 'workers that had this nickname, gone ones too'}))));
    const body = el('tbody');
    // Competition ranking: nicknames with as many completed tasks share a rank, and the
    // next one's counts those before it (1, 2, 2, 4).
    let rank = 0;
    leaderboard(data).forEach((e, i, all) => {
      if (i === 0 || all[i - 1].completed !== e.completed) rank = i + 1;
      const row = el('tr', {dataset: {nickname: e.nickname}},
        el('td', {class: 'num', dataset: {field: 'rank'}, text: rank}),
        el('td', {class: 'name'}, el('strong', {text: e.nickname})));
      for (const key of ['completed', 'failed', 'flagged', 'workers'])
        row.append(el('td', {class: 'num', dataset: {field: key}, text: fmtInt(e[key])}));
      body.append(row);
    });
    if (!body.children.length)
      body.append(el('tr', {}, el('td', {class: 'empty', colspan: 6, text: 'Nobody has finished a task yet.'})));
    table.append(body);
    card.append(table);
  }

  Object.assign(muster, {renderLeaderboard});
})(window.muster);
