// The dashboard's shared data: the blobs of the scopes it looks at (the API has no
// list of scopes). Loaded after common.js.
'use strict';

(function (muster) {
  const {params, el, compareNames, fmtInt, fmtCount, fmtTime, fmtIn, fmtBytes, apiOr404, ApiError} = muster;
  const MAX_SESSION_SCOPES = 50; // sessions whose shared data is listed

  // One scope's blobs: the head's reply, {missing: CODE} for a 404, or {invalid:
  // MESSAGE} for a name the head refuses. Only a scope typed into ?shared= can be
  // one, and a typo there must not stop every section from refreshing.
  async function scopeBlobs(scope) {
    try {
      return await apiOr404('/v1/shared/' + encodeURIComponent(scope));
    } catch (e) {
      if (e instanceof ApiError && e.code === 'name_invalid') return {invalid: e.reason};
      throw e;
    }
  }

  // The scopes whose blobs are listed (the API has no list of scopes): the open
  // sessions (each is a scope), scopes named by the tasks being worked on, and those
  // given in the URL (?shared=models,tables).
  async function loadShared(data) {
    const scopes = new Set((params.get('shared') || '').split(',').map(s => s.trim()).filter(Boolean));
    for (const tasks of Object.values(data.holding))
      for (const t of tasks)
        for (const req of t.requires || []) if (req && req.scope) scopes.add(req.scope);
    for (const s of data.replies['/v1/sessions'].sessions.slice(0, MAX_SESSION_SCOPES)) scopes.add(s.id);
    // Scopes (and so the table's rows) by name in code point order, with the one
    // comparator the page uses for every name, not the default sort's UTF-16 units.
    const sorted = [...scopes].sort(compareNames);
    data.shared = {served: null, scopes: [], blobs: [], invalid: []};
    const replies = await Promise.all(sorted.map(scopeBlobs));
    replies.forEach((reply, i) => {
      if (reply.invalid) {
        data.shared.invalid.push(reply.invalid);
        return;
      }
      data.shared.scopes.push(sorted[i]);
      if (reply.missing === 'not_found') {
        // The route itself is missing (not shared_not_found): an older head.
        if (data.shared.served === null) data.shared.served = false;
        return;
      }
      data.shared.served = true;
      if (reply.missing) return; // a scope without blobs, or a session just closed
      for (const blob of reply.blobs || []) data.shared.blobs.push(Object.assign({scope: sorted[i]}, blob));
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
      text: fmtCount(sh.blobs.length, 'blob') + ', ' + fmtBytes(bytes) +
            ' at their newest levels, in ' + fmtCount(sh.scopes.length, 'scope') + ' looked at'})));
    if (sh.invalid.length)
      card.append(el('p', {class: 'error', id: 'shared-invalid',
        text: 'Not looked at (check ?shared= in the URL): ' + sh.invalid.join('; ')}));
    const table = el('table', {id: 'shared-table'},
      el('thead', {}, el('tr', {}, el('th', {text: 'Scope'}), el('th', {text: 'Name'}),
        el('th', {class: 'num', text: 'Level'}), el('th', {text: 'Levels kept'}),
        el('th', {class: 'num', text: 'Size'}), el('th', {text: 'Checksum'}), el('th', {text: 'Expires'}))));
    const body = el('tbody');
    for (const b of sh.blobs) {
      body.append(el('tr', {dataset: {scope: b.scope, blob: b.name}},
        el('td', {class: 'name'}, el('code', {text: b.scope})),
        el('td', {class: 'name'}, el('strong', {text: b.name})),
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

  Object.assign(muster, {loadShared, renderShared});
})(window.muster);
