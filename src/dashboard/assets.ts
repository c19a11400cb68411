/** The dashboard's script and style, served from /assets/ (no build step; CSP allows 'self' only). */
export const DASHBOARD_JS = String.raw`(() => {
  'use strict';
  const TERMINAL = ['run_succeeded', 'run_failed', 'run_cancelled', 'run_expired'];
  const FACTS = ['owner', 'previousOwner', 'previousFence', 'reason', 'code', 'error', 'lastError', 'delayMs', 'availableAt', 'leaseUntil',
    'fastPath', 'requestId', 'stages', 'outcome', 'currentFence', 'currentState', 'durationMs', 'resultHash', 'resultBytes', 'effectKey'];
  const csrf = (document.querySelector('meta[name="csrf-token"]') || {}).content || '';
  const root = document.getElementById('run');
  let refresh = () => location.reload();
  /** After a button's request was accepted (its form's data-action): a retry makes the run page follow the run again. */
  let accepted = (_action) => {};

  // Buttons: posted with fetch (CSRF token in a header); the live stream shows what follows.
  document.addEventListener('submit', async (ev) => {
    const form = ev.target;
    if (!(form instanceof HTMLFormElement) || !form.classList.contains('action')) return;
    ev.preventDefault();
    const button = form.querySelector('button');
    if (button) button.disabled = true;
    try {
      // The form's fields (a rejection's reason) go as a form body; the CSRF token in a header.
      const res = await fetch(form.action, {
        method: 'POST',
        credentials: 'same-origin',
        headers: { 'x-csrf-token': csrf, accept: 'application/json', 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams(new FormData(form)),
      });
      const body = await res.json().catch(() => null);
      notice(res.ok ? (body && body.note) || 'done' : (body && body.error && body.error.message) || 'HTTP ' + res.status, !res.ok);
      if (res.ok) accepted(form.dataset.action);
    } catch (err) {
      notice(String(err), true);
    }
    refresh();
  });

  function notice(text, bad) {
    let n = document.getElementById('notice');
    if (!n) {
      n = document.createElement('p');
      n.id = 'notice';
      n.setAttribute('role', 'status');
      document.querySelector('main').prepend(n);
    }
    n.className = bad ? 'error' : 'ok';
    n.textContent = text;
  }

  if (!root) return;
  const id = root.dataset.runId;
  const tbody = document.getElementById('events');
  const live = document.getElementById('live');
  const TERMINAL_STATES = ['succeeded', 'failed', 'cancelled', 'expired'];
  let rows = tbody.querySelectorAll('tr[data-event-id]').length;
  let stages = JSON.parse(root.dataset.stages || '{}');
  let timer = null;
  refresh = () => {
    clearTimeout(timer);
    timer = setTimeout(async () => {
      const res = await fetch('/runs/' + id + '/panel', { credentials: 'same-origin' });
      if (!res.ok) return;
      const panel = document.getElementById('panel');
      // A reason being typed survives the refresh (and keeps the focus): the forms are replaced, not the person's words.
      const typed = Array.from(panel.querySelectorAll('form[data-stage-id] input[name=reason]'), (i) => [i.form.dataset.stageId, i.value, i === document.activeElement]);
      panel.outerHTML = await res.text();
      const fresh = document.getElementById('panel');
      for (const [stageId, value, focused] of typed) {
        const input = fresh.querySelector('form[data-stage-id="' + stageId + '"] input[name=reason]');
        if (!input) continue;
        input.value = value;
        if (focused) input.focus();
      }
      if (fresh.dataset.stages) stages = JSON.parse(fresh.dataset.stages);
    }, 120);
  };
  const runState = () => (document.getElementById('panel') || { dataset: {} }).dataset.state || '';

  function cell(tr, text, cls) {
    const td = document.createElement('td');
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
  }
  function show(k, v) {
    if ((k === 'error' || k === 'lastError') && v && typeof v === 'object') return (v.code ? v.code + ': ' : '') + (v.message || '');
    return typeof v === 'string' ? v : JSON.stringify(v);
  }
  function append(e) {
    const tr = document.createElement('tr');
    tr.dataset.eventId = e.id;
    tr.className = 'fresh';
    const data = e.data && typeof e.data === 'object' ? e.data : {};
    const facts = Object.keys(data).filter((k) => FACTS.includes(k)).map((k) => k + '=' + show(k, data[k])).join(' ').slice(0, 300);
    [e.id, e.at.replace('T', ' ').replace(/\.\d+Z$/, 'Z'), e.type, e.stageId ? String(stages[e.stageId] || e.stageId) : '', e.attempt === null ? '' : String(e.attempt), e.fence || '']
      .forEach((t) => cell(tr, t));
    cell(tr, facts, 'facts');
    tbody.appendChild(tr);
    // Rows kept in the events table (data-keep): older ones are dropped as new ones come, counted in its first row.
    const keep = Number(tbody.dataset.keep) || 4000;
    if (++rows > keep) drop(rows - keep);
  }
  /** Drops the oldest n rows, counted in the table's first row: the page never leaves out events silently. */
  function drop(n) {
    let note = document.getElementById('events-earlier');
    if (!note) {
      note = document.createElement('tr');
      note.id = 'events-earlier';
      note.className = 'earlier';
      const td = document.createElement('td');
      td.colSpan = 7;
      td.className = 'muted';
      const count = document.createElement('span');
      count.className = 'count';
      count.textContent = '0';
      td.append(count, ' earlier events not shown (ratchet events ' + id + ' lists them all)');
      note.appendChild(td);
      tbody.prepend(note);
    }
    for (let i = 0; i < n; i++) note.nextElementSibling && note.nextElementSibling.remove();
    rows -= n;
    const count = note.querySelector('.count');
    count.textContent = String(Number(count.textContent) + n);
  }

  if (TERMINAL_STATES.includes(runState())) live.textContent = 'finished';
  // The page's events end at the server's stream position data-after (the last one shown, read in
  // stream order): the stream goes on from there, every later event once (the server's word), so
  // nothing is skipped as "seen". Each message moves the position on.
  let lastId = root.dataset.after || '';
  let ended = TERMINAL_STATES.includes(runState());
  let retrying = false; // a retry accepted, its run_retried not seen yet
  let es = null;
  /**
   * Once the stream has ended (the run's end, or the server refusing), the page asks again now and
   * then whether the run went on: a retry through the API or the CLI. Asking is opening the stream
   * after the last event (204 while nothing happened: one short request), every 2 s at first,
   * doubling up to a minute, with jitter; a hidden tab does not ask until it is shown again.
   */
  const CHECK_FIRST_MS = 2000;
  const CHECK_MAX_MS = 60000;
  let checkMs = CHECK_FIRST_MS;
  let checkTimer = null;
  let due = false;
  const onMessage = (m) => {
    if (m.lastEventId) lastId = m.lastEventId;
    const e = JSON.parse(m.data);
    append(e);
    refresh();
    // A terminal event followed by run_retried is not the end: the server ends the stream only
    // after the last terminal event; the page closes then (onerror).
    if (TERMINAL.includes(e.type)) {
      ended = true;
      live.textContent = 'finished';
      live.className = 'live';
    } else if (e.type === 'run_retried') {
      ended = false;
      retrying = false;
      live.textContent = 'live';
      live.className = 'live on';
    }
  };
  // Streamed model tokens (event type "token", no id): the dashboard shows model answers by size
  // only, like every payload, so it counts what arrived per model stage attempt, live.
  const onToken = (m) => {
    const t = JSON.parse(m.data);
    let box = document.getElementById('tokens');
    if (!box) {
      box = document.createElement('p');
      box.id = 'tokens';
      box.className = 'tokens';
      document.getElementById('run').insertBefore(box, document.getElementById('panel'));
    }
    const key = t.stageId + ':' + t.fence;
    if (box.dataset.attempt !== key) {
      box.dataset.attempt = key;
      box.dataset.chars = '0';
      box.dataset.pieces = '0';
      // Pieces are not held back behind other transactions as events are: a new attempt's first
      // redraws the panel (its run row is current) while its events may still be on the way.
      refresh();
    }
    box.dataset.chars = String(Number(box.dataset.chars) + t.text.length);
    box.dataset.pieces = String(Number(box.dataset.pieces) + 1);
    box.textContent = 'model answering (stage ' + (stages[t.stageId] || t.stageId) + ', attempt ' + t.attempt + '): ' + box.dataset.chars + ' characters streamed in ' + box.dataset.pieces + ' piece(s)';
  };
  const connect = () => {
    clearTimeout(checkTimer);
    checkTimer = null;
    due = false;
    const s = new EventSource('/runs/' + id + '/stream' + (lastId ? '?after=' + encodeURIComponent(lastId) : ''));
    es = s;
    s.onopen = () => {
      checkMs = CHECK_FIRST_MS;
      live.textContent = 'live';
      live.className = 'live on';
    };
    s.onmessage = onMessage;
    s.addEventListener('token', onToken);
    s.onerror = () => {
      if (s !== es) return;
      // The run ended (the server ends the stream after its last terminal event), or the server
      // refused (204: nothing after the last event and the run over; or an error status).
      if (ended || s.readyState === EventSource.CLOSED) {
        s.close();
        if (retrying) {
          // A retry accepted while the stream was ending on the old end: follow the run on.
          retrying = false;
          ended = false;
          connect();
          return;
        }
        later();
        return;
      }
      live.textContent = 'reconnecting…'; // EventSource reconnects by itself, with Last-Event-ID
      live.className = 'live';
    };
  };
  const later = () => {
    live.textContent = ended || TERMINAL_STATES.includes(runState()) ? 'finished' : 'reconnecting…';
    live.className = 'live';
    clearTimeout(checkTimer);
    // Only a failed run can be retried: a run that ended otherwise has nothing more to come.
    if (TERMINAL_STATES.includes(runState()) && runState() !== 'failed') return;
    const ms = checkMs * (0.8 + Math.random() * 0.4);
    checkMs = Math.min(checkMs * 2, CHECK_MAX_MS);
    checkTimer = setTimeout(() => {
      checkTimer = null;
      if (document.hidden) due = true;
      else connect();
    }, ms);
  };
  document.addEventListener('visibilitychange', () => {
    if (!document.hidden && due) connect();
  });
  connect();
  // The retry button accepted: the stream goes on from the last event it had (now, or when the
  // stream still open ends on the old terminal event). Other buttons: the stream brings their end.
  accepted = (action) => {
    if (action !== 'retry') return;
    if (es && es.readyState !== EventSource.CLOSED) {
      retrying = true;
      return;
    }
    ended = false;
    checkMs = CHECK_FIRST_MS;
    connect();
  };
})();
`;

export const DASHBOARD_CSS = `
*{box-sizing:border-box}body{margin:0;font:14px/1.4 system-ui,sans-serif;color:#1d2330;background:#f6f7f9}
header{display:flex;align-items:center;gap:1rem;padding:.6rem 1.2rem;background:#1d2330;color:#fff}header a{color:#fff;text-decoration:none;font-weight:600}
.spacer{flex:1}button.link{background:none;border:0;color:#cfd6e4;cursor:pointer}main{padding:1rem 1.4rem;max-width:1400px}
h1{font-size:1.3rem}.tokens{background:#fff;border:1px solid #d8dde6;padding:.4rem .6rem}h2{font-size:1.05rem;margin-top:1.4rem}code{font-size:.95em}
table{border-collapse:collapse;width:100%;background:#fff}th,td{padding:.3rem .5rem;border-bottom:1px solid #e3e6eb;text-align:left;vertical-align:top}
th{background:#eef0f4;font-weight:600}td.err{color:#a1262b}td.facts{font-family:ui-monospace,monospace;font-size:12px;color:#4a5263}
.muted{color:#778}.error{color:#a1262b}.ok{color:#176b2c}.filters{display:flex;gap:1rem;align-items:end;margin-bottom:1rem}
.state{display:inline-block;padding:0 .45rem;border-radius:.6rem;font-size:12px;background:#dde2ea}.state.big{font-size:15px;padding:.15rem .7rem}
.s-running{background:#cfe0ff}.s-succeeded{background:#cdebd3}.s-failed{background:#f7cfd1}.s-cancelled{background:#e2e2e2}.s-expired{background:#f3ddb8}.s-queued{background:#fff0c2}
.summary{display:flex;gap:2rem;align-items:flex-start;background:#fff;padding:.8rem;border:1px solid #e3e6eb}
.facts{display:grid;grid-template-columns:auto auto;gap:.1rem .8rem;margin:0}dt{color:#667}dd{margin:0}
.actions{display:flex;gap:.5rem;margin-left:auto}.actions button{padding:.35rem .8rem;cursor:pointer}.danger{background:#b3261e;color:#fff;border:0;border-radius:3px}
.timeline{background:#fff;border:1px solid #e3e6eb;padding:.6rem}.axis{display:flex;justify-content:space-between;color:#778;font-size:12px;margin-left:280px}
.lane{display:flex;align-items:center;height:30px}.lane-label{width:280px;overflow:hidden;white-space:nowrap;text-overflow:ellipsis;font-size:13px}
.lane-track{position:relative;flex:1;height:22px;background:#f1f3f6;border-radius:3px}
.bar{position:absolute;top:2px;height:18px;border-radius:3px;color:#fff;font-size:11px;overflow:hidden;white-space:nowrap;padding-left:3px;min-width:4px}
.o-running{background:#2f6fe0}.o-succeeded{background:#2e8b45}.o-failed{background:#c2372f}.o-retried{background:#e08a1e}
.o-lease_lost{background:repeating-linear-gradient(45deg,#7d5ba6,#7d5ba6 4px,#a48bc4 4px,#a48bc4 8px)}.o-cancelled{background:#8a8f99}.o-released,.o-unknown{background:#b0b6c2}
.bar.reclaimed{outline:2px solid #7d5ba6;outline-offset:-2px}
.wait{position:absolute;top:3px;height:16px;border:1px dashed #e08a1e;border-radius:3px;background:rgba(224,138,30,.08);font-size:10px;line-height:14px;color:#6b4a12;overflow:hidden;white-space:nowrap;padding-left:3px}
.wait.w-approval{border-color:#b3261e;background:repeating-linear-gradient(135deg,rgba(179,38,30,.10),rgba(179,38,30,.10) 5px,transparent 5px,transparent 10px);color:#7a1913}
.wait.w-signal{border-color:#2f6fe0;background:rgba(47,111,224,.08);color:#1d4a9c}.wait.w-sleep{border-color:#6b7280;background:rgba(107,114,128,.08);color:#374151}
.wait.w-items,.wait.w-child{border-color:#0f766e;background:rgba(15,118,110,.08);color:#0f4f4a}.wait.open{border-right:3px solid currentColor}
.o-waited{background:#5b8fa8}.o-skipped{background:#c9ced6;color:#333}.m-skip{background:#9aa1ad}.m-decision{background:#b3261e;width:3px}
.lane.item .lane-label{padding-left:1.2rem;color:#4a5263;font-size:12px}.lane.item{height:22px}.lane.item .lane-track{height:16px}.lane.item .bar{top:1px;height:14px}.lane.item .wait{top:1px;height:14px}
.lane-label .after{font-size:11px;color:#778}.lane-label a.child{font-size:11px}.lane-track.more-items{background:none;font-size:12px;color:#667}
.s-awaiting_approval{background:#f7cfd1}.s-waiting{background:#d9ecea}.s-skipped{background:#eceef1;color:#667}.s-pending{background:#eef0f4}
.approval{background:#fff4f3;border:1px solid #e8b4b1;padding:.4rem .8rem;margin-top:.8rem}.gate-buttons{display:flex;gap:.6rem;align-items:center}
.gate-buttons form{display:flex;gap:.4rem}.gate-buttons input{padding:.3rem;width:18rem}button.approve{background:#176b2c;color:#fff;border:0;border-radius:3px;padding:.35rem .9rem;cursor:pointer}
.mark{position:absolute;top:-3px;width:2px;height:28px;background:#333}.m-reclaim{background:#7d5ba6}.m-retry{background:#e08a1e}.m-lease_lost{background:#c2372f}
.m-ownership_unknown{background:#d4a017}.m-result_rejected{background:#000}.m-request{background:#2f6fe0;width:1px}
.legend{display:flex;gap:.6rem;margin-top:.5rem;font-size:11px;flex-wrap:wrap}.legend .bar{position:static;display:inline-block;padding:0 .4rem}
.wait-key{position:static;display:inline-block;border:1px dashed #e08a1e;padding:0 .4rem;border-radius:3px}.wait-key.w-approval{border-color:#b3261e}.wait-key.w-signal{border-color:#2f6fe0}.wait-key.w-sleep{border-color:#6b7280}.wait-key.w-items,.wait-key.w-child{border-color:#0f766e}
.mark-key.m-decision{border-color:#b3261e;background:none}.mark-key{border-left:3px solid;padding-left:.3rem}.mark-key.m-reclaim{border-color:#7d5ba6;background:none}.mark-key.m-retry{border-color:#e08a1e;background:none}
.explain{background:#fff;border:1px solid #e3e6eb;padding:.6rem}.explain dl{display:grid;grid-template-columns:max-content auto;gap:.1rem 1rem}
.live{font-size:12px;color:#778}.live.on{color:#176b2c}.live.on::before{content:"● "}tr.fresh{animation:fresh 1.5s}@keyframes fresh{from{background:#fff7c2}to{background:#fff}}
.login{max-width:420px;background:#fff;padding:1rem 1.4rem;border:1px solid #e3e6eb}.login input{width:100%;margin:.4rem 0 .8rem;padding:.4rem}
.pager{margin:1rem 0}.approvals{background:#fff;border:1px solid #e3e6eb;padding:.2rem .8rem;margin-bottom:1rem}
`;
