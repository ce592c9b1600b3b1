// lanemq dashboard: plain JavaScript, no framework, no build step.
//
// Every figure comes from the admin API (/api/v5/...) with `Authorization: Bearer <token>`;
// the token is typed in by the user and kept in sessionStorage (this tab only). A 401 from
// any call logs out with a message. Strings from the API reach the DOM only as text
// (textContent, text nodes, setAttribute): never as HTML.
'use strict';
(function () {
  const API = '/api/v5';
  const TOKEN_KEY = 'lanemq.dashboard.token';
  const OVERVIEW_MS = 2000; // /stats poll
  const TAB_MS = 5000; // refresh of the visible list tab
  const VIEWER_MS = 1000; // stream viewer poll once caught up
  const HISTORY = 150; // chart points (5 minutes at 2 s)
  const VIEWER_PAGE = 100;
  const VIEWER_ROWS = 500; // rows kept in the viewer table
  const CLIENTS_PAGE = 25;

  const $ = (id) => document.getElementById(id);
  let token = null;
  let tab = 'overview';
  let tabGeneration = 0; // one refresh loop per shown tab
  const timers = { overview: null, tab: null, viewer: null };

  // ---------------------------------------------------------------- helpers

  /** Builds an element; strings become text nodes, `text` sets textContent. */
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = String(v);
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children) {
      if (c === undefined || c === null) continue;
      e.append(c instanceof Node ? c : String(c));
    }
    return e;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
    return node;
  }

  function fmtNum(v) {
    if (typeof v !== 'number' || !isFinite(v)) return v === null || v === undefined ? '–' : String(v);
    if (Number.isInteger(v)) return v.toLocaleString('en-US');
    return v.toLocaleString('en-US', { maximumFractionDigits: Math.abs(v) < 10 ? 2 : 1 });
  }

  function fmtShort(v) {
    if (v === null || v === undefined) return '';
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(1) + 'G';
    if (a >= 1e6) return (v / 1e6).toFixed(1) + 'M';
    if (a >= 1e4) return (v / 1e3).toFixed(0) + 'k';
    return fmtNum(Math.round(v * 100) / 100);
  }

  function fmtBytes(v) {
    if (typeof v !== 'number') return '–';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    let x = v;
    while (x >= 1024 && i < units.length - 1) { x /= 1024; i++; }
    return (i === 0 ? String(x) : x.toFixed(1)) + ' ' + units[i];
  }

  function fmtDuration(s) {
    if (typeof s !== 'number') return '–';
    const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600);
    const m = Math.floor(s % 3600 / 60), sec = Math.floor(s % 60);
    if (d) return `${d}d ${h}h ${m}m`;
    if (h) return `${h}h ${m}m`;
    if (m) return `${m}m ${sec}s`;
    return `${sec}s`;
  }

  function pad(n, w) { return String(n).padStart(w || 2, '0'); }

  /** Local date and time of a millisecond timestamp, `YYYY-MM-DD HH:MM:SS.mmm`. */
  function fmtTime(ms, withMs) {
    if (typeof ms !== 'number' || !isFinite(ms) || ms <= 0) return '–';
    const d = new Date(ms);
    const s = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
    return withMs ? s + '.' + pad(d.getMilliseconds(), 3) : s;
  }

  const prettyKey = (k) => k.replace(/_/g, ' ');
  const enc = encodeURIComponent;

  function showError(id, err) {
    $(id).textContent = err ? (err.message || String(err)) : '';
  }

  // ---------------------------------------------------------------- API

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  /**
   * One API call. Resolves with the parsed JSON (null for 204); rejects with an ApiError that
   * carries the API's own message. A 401 logs out unless `quiet401` (the login attempt).
   */
  async function api(method, path, body, quiet401) {
    const headers = { Authorization: 'Bearer ' + (token || ''), Accept: 'application/json' };
    const init = { method, headers, cache: 'no-store' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let r;
    try {
      r = await fetch(API + path, init);
    } catch (e) {
      throw new ApiError(0, 'NETWORK', 'Cannot reach the broker (' + e.message + ').');
    }
    if (r.status === 401 && !quiet401) {
      logout('The broker refused the token (401): log in again.');
      throw new ApiError(401, 'BAD_TOKEN', 'token refused');
    }
    if (r.status === 204) return null;
    const text = await r.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
    if (!r.ok) {
      const msg = (data && data.message) || text || r.statusText;
      throw new ApiError(r.status, (data && data.code) || String(r.status), `${r.status}: ${msg}`);
    }
    return data;
  }

  // ---------------------------------------------------------------- login and tabs

  function stopTimers() {
    for (const k of Object.keys(timers)) {
      clearTimeout(timers[k]);
      timers[k] = null;
    }
    viewer.stop();
  }

  function logout(message) {
    stopTimers();
    token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    for (const p of document.querySelectorAll('.panel')) p.hidden = true;
    for (const tb of document.querySelectorAll('table.grid tbody')) clear(tb);
    $('tabs').hidden = true;
    $('logout').hidden = true;
    $('broker-version').textContent = '';
    tabGeneration++;
    overview.reset();
    $('login').hidden = false;
    $('login-error').textContent = message || '';
    $('token').value = '';
    $('token').focus();
  }

  async function login(candidate, silent) {
    token = candidate;
    let stats;
    try {
      stats = await api('GET', '/stats', undefined, true);
    } catch (e) {
      token = null;
      sessionStorage.removeItem(TOKEN_KEY);
      $('login-error').textContent = e.status === 401
        ? 'Wrong token: the broker answered 401 BAD_TOKEN.'
        : e.message;
      if (silent && e.status === 401) $('login-error').textContent = 'The saved token was refused: log in again.';
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, candidate);
    $('login').hidden = true;
    $('login-error').textContent = '';
    $('tabs').hidden = false;
    $('logout').hidden = false;
    overview.prev = null;
    showTab(tabFromHash());
    overview.update(stats);
    timers.overview = setTimeout(pollOverview, OVERVIEW_MS);
  }

  const TABS = ['overview', 'clients', 'streams', 'lanes'];
  function tabFromHash() {
    const h = location.hash.replace('#', '');
    return TABS.includes(h) ? h : 'overview';
  }

  function showTab(name) {
    tab = name;
    for (const t of TABS) {
      $('tab-' + t).setAttribute('aria-selected', String(t === name));
      $('tab-' + t).tabIndex = t === name ? 0 : -1;
      $('panel-' + t).hidden = t !== name;
    }
    if (location.hash !== '#' + name) history.replaceState(null, '', '#' + name);
    clearTimeout(timers.tab);
    timers.tab = null;
    const gen = ++tabGeneration;
    if (name === 'overview') {
      overview.ensureCharts();
      overview.resize();
    } else {
      refreshTab(gen);
    }
  }

  async function refreshTab(gen) {
    if (!token || gen !== tabGeneration) return;
    if (tab === 'clients') await clients.refresh();
    else if (tab === 'streams') await streams.refresh();
    else if (tab === 'lanes') await lanes.refresh();
    if (token && gen === tabGeneration) timers.tab = setTimeout(() => refreshTab(gen), TAB_MS);
  }

  // ---------------------------------------------------------------- overview

  const overview = {
    prev: null,
    charts: null,
    data: { t: [], clients: [], msgIn: [], msgOut: [], bytesIn: [], bytesOut: [], dropped: [], queueDrops: [] },

    /** Forgets the history (logout: the next login may be to another broker). */
    reset() {
      this.prev = null;
      for (const k of Object.keys(this.data)) this.data[k] = [];
      this.redraw();
    },

    ensureCharts() {
      if (this.charts || typeof uPlot !== 'function') return;
      const mk = (id, labels, colors) => {
        const box = $(id);
        const opts = {
          width: Math.max(300, box.clientWidth),
          height: 160,
          cursor: { drag: { x: false, y: false } },
          legend: { live: false },
          scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, (max || 0) * 1.15)] } },
          axes: [{}, { size: 56, values: (u, vals) => vals.map(fmtShort) }],
          series: [{}].concat(labels.map((label, i) => ({
            label,
            stroke: colors[i],
            fill: colors[i] + '1f',
            width: 2,
            value: (u, v) => (v === null || v === undefined ? '–' : fmtShort(v)),
          }))),
        };
        return new uPlot(opts, [[]].concat(labels.map(() => [])), box);
      };
      this.charts = {
        clients: mk('chart-clients', ['connected'], ['#2f80c9']),
        msgs: mk('chart-msgs', ['in', 'out'], ['#2f80c9', '#d9822b']),
        bytes: mk('chart-bytes', ['in', 'out'], ['#2f80c9', '#d9822b']),
        dropped: mk('chart-dropped', ['messages', 'queue drops'], ['#b3261e', '#7b5ea7']),
      };
      this.redraw();
    },

    resize() {
      if (!this.charts) return;
      const ids = { clients: 'chart-clients', msgs: 'chart-msgs', bytes: 'chart-bytes', dropped: 'chart-dropped' };
      for (const [k, id] of Object.entries(ids)) {
        const w = $(id).clientWidth;
        if (w > 0) this.charts[k].setSize({ width: w, height: 160 });
      }
    },

    redraw() {
      if (!this.charts) return;
      const d = this.data;
      this.charts.clients.setData([d.t, d.clients]);
      this.charts.msgs.setData([d.t, d.msgIn, d.msgOut]);
      this.charts.bytes.setData([d.t, d.bytesIn, d.bytesOut]);
      this.charts.dropped.setData([d.t, d.dropped, d.queueDrops]);
    },

    /** One /stats answer: rates from counter deltas, then cards, tables and charts. */
    update(s) {
      const now = Date.now() / 1000;
      const b = s.broker || {};
      const q = s.queues || {};
      const counters = {
        msgIn: b.messages_received, msgOut: b.messages_sent,
        bytesIn: b.bytes_received, bytesOut: b.bytes_sent,
        dropped: b.messages_dropped,
        queueDrops: (q.dropped_qos0 || 0) + (q.dropped_queue_full || 0),
      };
      const rates = {};
      for (const k of Object.keys(counters)) {
        rates[k] = null;
        if (this.prev && typeof counters[k] === 'number' && typeof this.prev.c[k] === 'number') {
          const dt = now - this.prev.t;
          const dv = counters[k] - this.prev.c[k];
          // A negative delta is a broker restart: no rate for this point.
          if (dt > 0 && dv >= 0) rates[k] = dv / dt;
        }
      }
      this.prev = { t: now, c: counters };
      const d = this.data;
      d.t.push(now);
      d.clients.push(typeof b.clients_connected === 'number' ? b.clients_connected : null);
      for (const k of Object.keys(counters)) d[k].push(rates[k]);
      if (d.t.length > HISTORY) for (const k of Object.keys(d)) d[k].shift();
      this.renderCards(s, rates);
      this.redraw();
      $('broker-version').textContent = `lanemq ${s.version || '?'} · up ${fmtDuration(s.uptime_s)}`;
      // A log that refuses writes (fail-stop after a storage error) stops every QoS 1/2
      // publish: say so above everything, with the reason, until the broker is restarted.
      const failed = s.log && s.log.failed;
      const banner = $('storage-banner');
      banner.hidden = !failed;
      banner.textContent = failed
        ? `Storage failure: the log refuses writes, so publishes fail. Fix the cause and restart lanemq. (${s.log.failure || 'no reason given'})`
        : '';
    },

    renderCards(s, rates) {
      const b = s.broker || {}, q = s.queues || {}, st = s.streams || {};
      const log = s.log && typeof s.log === 'object' ? s.log : null;
      const cards = [
        ['clients', 'Connected clients', fmtNum(b.clients_connected)],
        ['sessions', 'Sessions', fmtNum(b.sessions)],
        ['msg-in', 'Messages in / s', fmtShort(rates.msgIn)],
        ['msg-out', 'Messages out / s', fmtShort(rates.msgOut)],
        ['retained', 'Retained', fmtNum(b.retained)],
        ['queued', 'Queued bytes', fmtBytes(q.queued_bytes)],
        ['streams', 'Streams', fmtNum(st.streams)],
        ['indexed', 'Indexed offset', fmtNum(st.indexed_offset)],
      ];
      // The index lag needs the log's next offset, which only a newer /stats carries.
      const next = log && ['next_offset', 'end_offset', 'next'].map((k) => log[k]).find((v) => typeof v === 'number');
      if (typeof next === 'number' && typeof st.indexed_offset === 'number') {
        const lag = Math.max(0, next - st.indexed_offset);
        cards.push(['index-lag', 'Index lag (entries)', fmtNum(lag), lag > 10000 ? 'bad' : '']);
      }
      const failed = [['streams', st], ['log', log || {}]]
        .flatMap(([, o]) => Object.entries(o))
        .filter(([k, v]) => /fail/i.test(k) && typeof v === 'boolean');
      if (failed.length) {
        const bad = failed.some(([, v]) => v);
        cards.push(['index-state', 'Log / index', bad ? 'FAILED' : 'ok', bad ? 'bad' : 'good']);
      }
      cards.push(['auth-failures', 'Auth failures', fmtNum(b.auth_failures)]);
      cards.push(['uptime', 'Uptime', fmtDuration(s.uptime_s)]);
      cards.push(['version', 'Version', s.version || '–']);
      const box = clear($('cards'));
      for (const [id, label, value, cls] of cards) {
        box.append(el('div', { class: 'card ' + (cls || ''), id: 'card-' + id },
          el('div', { class: 'label', text: label }),
          el('div', { class: 'value', text: value })));
      }
      kvTable($('kv-streams'), st);
      kvTable($('kv-queues'), q, /bytes/);
      $('log-box').hidden = !log;
      if (log) kvTable($('kv-log'), log, /bytes/);
    },
  };

  /** Every scalar of `obj` (nested objects flattened as a.b) as a two-column table. */
  function kvTable(table, obj, bytesKey) {
    clear(table);
    const rows = [];
    const walk = (o, prefix) => {
      for (const [k, v] of Object.entries(o || {})) {
        const key = prefix ? prefix + '.' + k : k;
        if (v && typeof v === 'object' && !Array.isArray(v)) walk(v, key);
        else rows.push([key, v]);
      }
    };
    walk(obj, '');
    const body = el('tbody');
    for (const [k, v] of rows) {
      let shown;
      if (typeof v === 'number') shown = bytesKey && bytesKey.test(k) ? `${fmtBytes(v)} (${fmtNum(v)})` : fmtNum(v);
      else if (Array.isArray(v)) shown = v.map(String).join(', ');
      else shown = v === null ? '–' : String(v);
      body.append(el('tr', null, el('th', { scope: 'row', text: prettyKey(k) }), el('td', { text: shown })));
    }
    table.append(body);
  }

  async function pollOverview() {
    if (!token) return;
    try {
      overview.update(await api('GET', '/stats'));
    } catch (e) {
      if (e.status === 401) return;
      $('broker-version').textContent = e.message;
    }
    if (token) timers.overview = setTimeout(pollOverview, OVERVIEW_MS);
  }

  // ---------------------------------------------------------------- clients

  const clients = {
    page: 1,
    pages: 1,
    selected: null,

    query() {
      const p = new URLSearchParams({ page: String(this.page), limit: String(CLIENTS_PAGE) });
      const id = $('q-clientid').value.trim();
      const user = $('q-username').value.trim();
      const state = $('q-state').value;
      if (id) p.set('like_clientid', id);
      if (user) p.set('username', user);
      if (state) p.set('conn_state', state);
      return p.toString();
    },

    async refresh() {
      let res;
      try {
        res = await api('GET', '/clients?' + this.query());
        showError('clients-error', null);
      } catch (e) {
        if (e.status !== 401) showError('clients-error', e);
        return;
      }
      const meta = res.meta || {};
      this.pages = Math.max(1, Math.ceil((meta.count || 0) / CLIENTS_PAGE));
      if (this.page > this.pages) { this.page = this.pages; return this.refresh(); }
      $('clients-page').textContent = `page ${this.page} of ${this.pages} · ${fmtNum(meta.count || 0)} sessions`;
      $('clients-prev').disabled = this.page <= 1;
      $('clients-next').disabled = !meta.hasnext;
      const tbody = clear($('clients-table').tBodies[0]);
      const rows = res.data || [];
      if (!rows.length) tbody.append(el('tr', null, el('td', { colspan: 10, class: 'empty', text: 'No sessions match.' })));
      for (const c of rows) {
        const tr = el('tr', {
          class: 'selectable' + (c.clientid === this.selected ? ' selected' : ''),
          'data-clientid': c.clientid,
          tabindex: 0,
          onclick: () => this.select(c.clientid),
          onkeydown: (ev) => { if (ev.key === 'Enter') this.select(c.clientid); },
        },
        el('td', { class: 'mono', text: c.clientid }),
        el('td', { text: c.username === null || c.username === undefined ? '–' : c.username }),
        el('td', { text: c.ip_address || '–' }),
        el('td', null, el('span', { class: 'dot' + (c.connected ? ' on' : '') }), c.connected ? 'connected' : 'disconnected'),
        el('td', { text: fmtTime(c.connected_at) }),
        el('td', { class: 'num', text: fmtNum(c.subscriptions_cnt) }),
        el('td', { class: 'num', text: fmtNum(c.mqueue_len) }),
        el('td', { class: 'num', text: fmtNum(c.inflight_cnt) }),
        el('td', { class: 'num', text: fmtNum(c.mqueue_dropped) }),
        el('td', { class: 'actions' },
          el('button', {
            type: 'button', class: 'danger small', text: c.connected ? 'Kick' : 'Discard',
            'aria-label': (c.connected ? 'Kick ' : 'Discard the session of ') + c.clientid,
            onclick: (ev) => { ev.stopPropagation(); this.kick(c.clientid, c.connected); },
          })));
        tbody.append(tr);
      }
      if (this.selected) this.showSubscriptions();
    },

    async kick(id, connected) {
      const what = connected
        ? `Disconnect client "${id}" (DISCONNECT 0x98)? Its session stays if it has an expiry.`
        : `Discard the stored session of "${id}"?`;
      if (!window.confirm(what)) return;
      try {
        await api('DELETE', '/clients/' + enc(id));
        showError('clients-error', null);
      } catch (e) {
        if (e.status !== 401) showError('clients-error', e);
      }
      if (this.selected === id) this.select(null);
      await this.refresh();
    },

    select(id) {
      this.selected = id;
      for (const tr of $('clients-table').tBodies[0].rows) {
        tr.classList.toggle('selected', tr.getAttribute('data-clientid') === id);
      }
      $('client-detail').hidden = !id;
      if (id) this.showSubscriptions();
    },

    async showSubscriptions() {
      const id = this.selected;
      $('client-detail-title').textContent = `Subscriptions of ${id}`;
      const tbody = $('subs-table').tBodies[0];
      let subs;
      try {
        subs = await api('GET', '/clients/' + enc(id) + '/subscriptions');
      } catch (e) {
        if (e.status === 401) return;
        clear(tbody).append(el('tr', null, el('td', { colspan: 5, class: 'empty', text: e.message })));
        return;
      }
      if (id !== this.selected) return;
      clear(tbody);
      const list = Array.isArray(subs) ? subs : (subs && subs.data) || [];
      if (!list.length) tbody.append(el('tr', null, el('td', { colspan: 5, class: 'empty', text: 'No subscriptions.' })));
      for (const s of list) {
        tbody.append(el('tr', null,
          el('td', { class: 'mono', text: s.topic }),
          el('td', { class: 'num', text: fmtNum(s.qos) }),
          el('td', { text: s.nl ? 'yes' : 'no' }),
          el('td', { text: s.rap ? 'yes' : 'no' }),
          el('td', { class: 'num', text: fmtNum(s.rh) })));
      }
    },
  };

  // ---------------------------------------------------------------- streams

  const streams = {
    names: [],

    async refresh() {
      const all = [];
      try {
        let cursor = '';
        for (let i = 0; i < 20; i++) {
          const res = await api('GET', '/streams?limit=500' + (cursor ? '&cursor=' + enc(cursor) : ''));
          all.push(...(res.data || []));
          if (!res.meta || !res.meta.hasnext || !res.meta.cursor) break;
          cursor = res.meta.cursor;
        }
      } catch (e) {
        if (e.status !== 401) showError('streams-error', e);
        return;
      }
      const tbody = clear($('streams-table').tBodies[0]);
      if (!all.length) tbody.append(el('tr', null, el('td', { colspan: 9, class: 'empty', text: 'No streams yet: create one below.' })));
      for (const s of all) {
        const st = s.stats || {};
        const limits = s.limits || {};
        const retention = [s.data_retention_period, limits.max_message_count !== 'infinity' ? `${limits.max_message_count} msgs` : null,
          limits.max_message_bytes !== 'infinity' ? String(limits.max_message_bytes) : null].filter((x) => x !== null && x !== undefined).join(', ');
        tbody.append(el('tr', { 'data-stream': s.name },
          el('td', { class: 'mono', text: s.name }),
          el('td', { class: 'mono', text: s.topic_filter }),
          el('td', { text: s.is_lastvalue ? `yes (${s.key_expression})` : 'no' }),
          el('td', { text: retention || '–' }),
          el('td', { class: 'num', text: fmtNum(st.message_count) }),
          el('td', { class: 'num', text: fmtBytes(st.message_bytes) }),
          el('td', { class: 'num', text: fmtNum(st.subscribers) }),
          el('td', { text: typeof st.newest_timestamp_us === 'number' ? fmtTime(st.newest_timestamp_us / 1000) : '–' }),
          el('td', { class: 'actions' },
            el('button', {
              type: 'button', class: 'secondary small', text: 'View', 'aria-label': 'View stream ' + s.name,
              onclick: () => { $('v-stream').value = s.name; $('v-from').value = 'earliest'; syncFrom(); viewer.start(); },
            }),
            el('button', {
              type: 'button', class: 'danger small', text: 'Delete', 'aria-label': 'Delete stream ' + s.name,
              onclick: () => this.remove(s.name),
            }))));
      }
      this.names = all.map((s) => s.name);
      const sel = $('v-stream');
      const keep = sel.value;
      clear(sel);
      for (const n of this.names) sel.append(el('option', { value: n, text: n }));
      if (this.names.includes(keep)) sel.value = keep;
    },

    async create(ev) {
      ev.preventDefault();
      const body = { name: $('s-name').value.trim(), topic_filter: $('s-filter').value.trim() };
      const retention = $('s-retention').value.trim();
      const maxCount = $('s-maxcount').value.trim();
      const key = $('s-key').value.trim();
      if (retention) body.data_retention_period = retention;
      if (maxCount) body.limits = { max_message_count: Number(maxCount) };
      if ($('s-lastvalue').checked) body.is_lastvalue = true;
      if (key) body.key_expression = key;
      try {
        await api('POST', '/streams', body);
      } catch (e) {
        if (e.status !== 401) showError('streams-error', e);
        return;
      }
      showError('streams-error', null);
      $('viewer-status').textContent = `Stream ${body.name} created.`;
      $('stream-form').reset();
      await this.refresh();
      $('v-stream').value = body.name;
    },

    async remove(name) {
      if (!window.confirm(`Delete stream "${name}"? Its index goes; the messages stay in the log.`)) return;
      try {
        await api('DELETE', '/stream/' + enc(name));
        showError('streams-error', null);
      } catch (e) {
        if (e.status !== 401) showError('streams-error', e);
      }
      if (viewer.stream === name) viewer.stop(`Stream ${name} was deleted.`);
      await this.refresh();
    },
  };

  // ---------------------------------------------------------------- stream viewer

  const viewer = {
    running: false,
    stream: null,
    next: null,
    count: 0,
    generation: 0,
    listRefreshed: 0,

    startOffset() {
      const from = $('v-from').value;
      if (from === 'time') {
        const ms = new Date($('v-time').value).getTime();
        if (!isFinite(ms)) throw new Error('Pick a date and time.');
        return String(Math.max(0, ms) * 1000); // the API takes microseconds, as stream-offset does
      }
      if (from === 'offset') {
        const n = $('v-offset').value.trim();
        if (!/^\d+$/.test(n)) throw new Error('Give an offset (a whole number).');
        return '@' + n;
      }
      return from;
    },

    start(ev) {
      if (ev) ev.preventDefault();
      const name = $('v-stream').value;
      if (!name) { $('viewer-status').textContent = 'Create a stream first.'; return; }
      let offset;
      try { offset = this.startOffset(); } catch (e) { $('viewer-status').textContent = e.message; return; }
      this.stop();
      this.generation++;
      this.stream = name;
      this.next = offset;
      this.count = 0;
      this.running = true;
      clear($('viewer-table').tBodies[0]);
      $('v-stop').disabled = false;
      $('viewer-status').textContent = `Reading ${name} from ${offset}…`;
      this.poll(this.generation);
    },

    stop(message) {
      this.running = false;
      clearTimeout(timers.viewer);
      timers.viewer = null;
      $('v-stop').disabled = true;
      if (message) $('viewer-status').textContent = message;
    },

    async poll(gen) {
      if (!this.running || gen !== this.generation || !token) return;
      const path = `/stream/${enc(this.stream)}/messages?offset=${enc(this.next)}&limit=${VIEWER_PAGE}`;
      let res;
      try {
        res = await api('GET', path);
      } catch (e) {
        if (gen !== this.generation) return;
        if (e.status === 401) return;
        if (e.status === 404 && /no endpoint/.test(e.message)) {
          this.stop('This broker has no stream reader (GET /api/v5/stream/{name}/messages).');
        } else if (e.status === 404) {
          this.stop(`Stream ${this.stream} does not exist (any more).`);
        } else if (e.status >= 400 && e.status < 500) {
          this.stop(e.message);
        } else {
          $('viewer-status').textContent = e.message + ' (retrying)';
          timers.viewer = setTimeout(() => this.poll(gen), VIEWER_MS * 3);
        }
        return;
      }
      if (gen !== this.generation || !this.running) return;
      const data = (res && res.data) || [];
      this.append(data);
      if (res && res.next !== undefined && res.next !== null) this.next = String(res.next);
      this.count += data.length;
      // New messages change the stream's figures: refresh the list (at most every 2 s).
      if (data.length && tab === 'streams' && Date.now() - this.listRefreshed > 2000) {
        this.listRefreshed = Date.now();
        streams.refresh();
      }
      $('viewer-status').textContent =
        `${this.stream}: ${fmtNum(this.count)} message(s) · live, next ${this.next}`;
      // A full page means more is waiting: read on at once; otherwise poll once a second.
      timers.viewer = setTimeout(() => this.poll(gen), data.length >= VIEWER_PAGE ? 0 : VIEWER_MS);
    },

    append(messages) {
      const tbody = $('viewer-table').tBodies[0];
      for (const m of messages) {
        const ms = typeof m.ts === 'number' ? m.ts : typeof m.ts_us === 'number' ? m.ts_us / 1000 : null;
        const off = typeof m.offset === 'string' ? m.offset : '@' + m.offset;
        let payload = m.payload === null || m.payload === undefined ? '' : String(m.payload);
        if (payload.length > 2000) payload = payload.slice(0, 2000) + '…';
        const b64 = m.payload_encoding === 'base64';
        tbody.append(el('tr', null,
          el('td', { class: 'mono', text: off }),
          el('td', { text: fmtTime(ms, true) }),
          el('td', { class: 'mono', text: m.topic }),
          el('td', { class: 'num', text: fmtNum(m.qos) }),
          el('td', { class: 'mono', text: m.key === null || m.key === undefined ? '–' : m.key }),
          el('td', { class: 'payload', title: b64 ? 'base64 (not UTF-8)' : null, text: (b64 ? 'base64: ' : '') + payload })));
      }
      while (tbody.rows.length > VIEWER_ROWS) tbody.deleteRow(0);
    },
  };

  function syncFrom() {
    const from = $('v-from').value;
    $('v-time-label').hidden = from !== 'time';
    $('v-offset-label').hidden = from !== 'offset';
  }

  // ---------------------------------------------------------------- lanes

  const lanes = {
    parent: null,
    group: null,

    async refresh() {
      let parents, metrics;
      try {
        [parents, metrics] = await Promise.all([
          api('GET', '/lite/parents'),
          api('GET', '/lite/metrics').catch((e) => { if (e.status === 401) throw e; return null; }),
        ]);
        showError('lanes-error', null);
      } catch (e) {
        if (e.status !== 401) showError('lanes-error', e);
        return;
      }
      this.renderMetrics(metrics);
      const list = (parents && parents.data) || [];
      const tbody = clear($('parents-table').tBodies[0]);
      if (!list.length) tbody.append(el('tr', null, el('td', { colspan: 8, class: 'empty', text: 'No lite parents (see [[lite.parents]] in the configuration).' })));
      if (!list.some((p) => p.name === this.parent)) { this.parent = list.length ? list[0].name : null; this.group = null; }
      for (const p of list) {
        tbody.append(el('tr', {
          class: 'selectable' + (p.name === this.parent ? ' selected' : ''), tabindex: 0,
          onclick: () => { this.parent = p.name; this.group = null; this.refresh(); },
          onkeydown: (ev) => { if (ev.key === 'Enter') { this.parent = p.name; this.group = null; this.refresh(); } },
        },
        el('td', { class: 'mono', text: p.name }),
        el('td', { class: 'mono', text: p.pattern }),
        el('td', { text: p.mode }),
        el('td', { class: 'num', text: fmtNum(p.lanes) }),
        el('td', { class: 'num', text: fmtNum(p.ttl_s) }),
        el('td', { class: 'num', text: fmtNum(p.batch) }),
        el('td', { class: 'num', text: fmtNum(p.max_attempts) }),
        el('td', { class: 'num', text: fmtNum(p.ack_timeout_ms) })));
      }
      $('parent-detail').hidden = !this.parent;
      if (this.parent) await this.renderParent(this.parent);
    },

    renderMetrics(m) {
      const box = clear($('lite-cards'));
      if (!m || typeof m !== 'object') return;
      const order = ['parents', 'lanes', 'dead_lettered', 'committed', 'redelivered', 'retried', 'suspended',
        'ack_timeouts', 'publish_refused', 'lanes_created', 'lanes_expired', 'indexed'];
      const figures = {};
      for (const [k, v] of Object.entries(m)) {
        if (typeof v !== 'number') continue;
        figures[k.replace(/^lanemq_lite_/, '').replace(/_total$/, '')] = v;
      }
      const keys = order.filter((k) => k in figures).concat(Object.keys(figures).filter((k) => !order.includes(k)));
      for (const k of keys) {
        const label = k === 'dead_lettered' ? 'dead letters' : prettyKey(k);
        const bad = (k === 'dead_lettered' || k === 'ack_timeouts' || k === 'publish_refused') && figures[k] > 0;
        box.append(el('div', { class: 'card' + (bad ? ' bad' : ''), id: 'lite-' + k },
          el('div', { class: 'label', text: label }),
          el('div', { class: 'value', text: fmtNum(figures[k]) })));
      }
    },

    async renderParent(parent) {
      const p = enc(parent);
      let lanePage, groups;
      try {
        [lanePage, groups] = await Promise.all([
          api('GET', `/lite/parents/${p}/lanes?limit=1000`),
          api('GET', `/lite/parents/${p}/groups`),
        ]);
      } catch (e) {
        if (e.status !== 401) showError('lanes-error', e);
        return;
      }
      if (parent !== this.parent) return;
      // Busiest: the most messages held in the lane (next - first), then the latest publish.
      const ls = ((lanePage && lanePage.data) || []).map((l) => ({ ...l, held: (l.next_offset || 0) - (l.first_offset || 0) }));
      ls.sort((a, b) => b.held - a.held || (b.last_publish_us || 0) - (a.last_publish_us || 0));
      const more = lanePage && lanePage.meta && lanePage.meta.hasnext ? ' (of the first 1000 lanes)' : '';
      $('busiest-title').textContent = `Busiest lanes of ${parent}${more}`;
      const tb = clear($('lanes-table').tBodies[0]);
      if (!ls.length) tb.append(el('tr', null, el('td', { colspan: 5, class: 'empty', text: 'No lanes yet.' })));
      for (const l of ls.slice(0, 15)) {
        tb.append(el('tr', null,
          el('td', { class: 'mono', text: l.lane }),
          el('td', { class: 'num', text: fmtNum(l.held) }),
          el('td', { class: 'num', text: fmtNum(l.first_offset) }),
          el('td', { class: 'num', text: fmtNum(l.next_offset) }),
          el('td', { text: typeof l.last_publish_us === 'number' ? fmtTime(l.last_publish_us / 1000) : '–' })));
      }
      const gs = (groups && groups.data) || [];
      if (!gs.some((g) => g.group === this.group)) this.group = gs.length ? gs[0].group : null;
      const gb = clear($('groups-table').tBodies[0]);
      if (!gs.length) gb.append(el('tr', null, el('td', { colspan: 6, class: 'empty', text: 'No groups ($share/<group>/… subscriptions).' })));
      const shown = new Set(['group', 'online_members', 'active_lanes', 'inflight', 'stuck_members', 'members']);
      for (const g of gs) {
        const other = Object.entries(g).filter(([k, v]) => !shown.has(k) && (v === null || typeof v !== 'object'))
          .map(([k, v]) => `${prettyKey(k)}: ${v}`).join(', ');
        const members = Array.isArray(g.members) ? g.members.length : g.members;
        gb.append(el('tr', {
          class: 'selectable' + (g.group === this.group ? ' selected' : ''), tabindex: 0,
          onclick: () => { this.group = g.group; this.renderParent(parent); },
          onkeydown: (ev) => { if (ev.key === 'Enter') { this.group = g.group; this.renderParent(parent); } },
        },
        el('td', { class: 'mono', text: g.group }),
        el('td', { class: 'num', text: `${fmtNum(g.online_members)} / ${fmtNum(members)}` }),
        el('td', { class: 'num', text: fmtNum(g.active_lanes) }),
        el('td', { class: 'num', text: fmtNum(g.inflight) }),
        el('td', { text: Array.isArray(g.stuck_members) && g.stuck_members.length ? g.stuck_members.map(String).join(', ') : '–' }),
        el('td', { text: other || '–' })));
      }
      await this.renderLag(parent, this.group);
    },

    async renderLag(parent, group) {
      $('lag-title').hidden = !group;
      $('lag-table').hidden = !group;
      if (!group) return;
      let res;
      try {
        res = await api('GET', `/lite/parents/${enc(parent)}/groups/${enc(group)}/lag?limit=1000`);
      } catch (e) {
        if (e.status !== 401) showError('lanes-error', e);
        return;
      }
      if (group !== this.group || parent !== this.parent) return;
      const rows = ((res && res.data) || []).slice().sort((a, b) => (b.lag || 0) - (a.lag || 0));
      const total = rows.reduce((n, r) => n + (r.lag || 0), 0);
      $('lag-title').textContent = `Lag of group ${group}: ${fmtNum(total)} message(s) on ${fmtNum(rows.filter((r) => r.lag > 0).length)} lane(s)`;
      const tb = clear($('lag-table').tBodies[0]);
      if (!rows.length) tb.append(el('tr', null, el('td', { colspan: 7, class: 'empty', text: 'No lanes.' })));
      for (const r of rows.slice(0, 25)) {
        tb.append(el('tr', null,
          el('td', { class: 'mono', text: r.lane }),
          el('td', { class: 'num', text: fmtNum(r.lag) }),
          el('td', { class: 'num', text: fmtNum(r.committed) }),
          el('td', { class: 'num', text: fmtNum(r.next_offset) }),
          el('td', { class: 'num', text: fmtNum(r.inflight) }),
          el('td', { class: 'mono', text: r.holder === null || r.holder === undefined ? '–' : String(r.holder) }),
          el('td', { text: r.paused_for_ms === null || r.paused_for_ms === undefined ? '–' : fmtNum(r.paused_for_ms) })));
      }
    },
  };

  // ---------------------------------------------------------------- wiring

  function init() {
    $('login-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const t = $('token').value.trim();
      if (t) login(t, false);
    });
    $('logout').addEventListener('click', () => logout('Logged out.'));
    for (const t of TABS) $('tab-' + t).addEventListener('click', () => showTab(t));
    $('tabs').addEventListener('keydown', (ev) => {
      if (ev.key !== 'ArrowRight' && ev.key !== 'ArrowLeft') return;
      const i = TABS.indexOf(tab) + (ev.key === 'ArrowRight' ? 1 : TABS.length - 1);
      const next = TABS[i % TABS.length];
      showTab(next);
      $('tab-' + next).focus();
    });
    $('client-search').addEventListener('submit', (ev) => { ev.preventDefault(); clients.page = 1; clients.refresh(); });
    $('clients-prev').addEventListener('click', () => { if (clients.page > 1) { clients.page--; clients.refresh(); } });
    $('clients-next').addEventListener('click', () => { clients.page++; clients.refresh(); });
    $('stream-form').addEventListener('submit', (ev) => streams.create(ev));
    $('viewer-form').addEventListener('submit', (ev) => viewer.start(ev));
    $('v-stop').addEventListener('click', () => viewer.stop(`Stopped; next ${viewer.next}.`));
    $('v-from').addEventListener('change', syncFrom);
    window.addEventListener('resize', () => overview.resize());
    window.addEventListener('hashchange', () => { if (token) showTab(tabFromHash()); });
    syncFrom();
    const saved = sessionStorage.getItem(TOKEN_KEY);
    if (saved) login(saved, true);
    else $('token').focus();
  }

  init();
})();
