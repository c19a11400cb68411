import { createHash } from 'node:crypto';
import type { Explanation } from '../observability/explanation.js';
import { RUN_STATES, TERMINAL_RUN_STATES, type RunState } from '../planner/states.js';
import type { EventRow, RunRow } from '../store/runs.js';
import type { RunSummaryRow } from '../store/list-runs.js';
import type { PendingApproval } from '../store/approvals.js';
import type { RunUsage } from '../store/usage.js';
import { errorLine, fmtMs, fmtTime, html, type Html } from './html.js';
import { buildTimeline, type Lane, type Timeline, type WaitRow } from './timeline.js';

export function loginPage(message: string | null): Html {
  return html`<section class="login"><h1>Sign in</h1>
<p>Enter an API token (the one given to <code>ratchet serve --token</code> or RATCHET_TOKEN). It is kept in an HttpOnly cookie for this browser.</p>
${message ? html`<p class="error" role="alert">${message}</p>` : ''}
<form method="post" action="/login"><label>Token <input type="password" name="token" autocomplete="current-password" required autofocus></label>
<button type="submit">Sign in</button></form></section>`;
}

export interface ListView {
  runs: RunSummaryRow[];
  /** The next page's cursor: of the runs, or (awaiting-approval view) of the approvals. */
  nextCursor: string | null;
  state: string;
  workflow: string;
  workflows: string[];
  /** Stages waiting for a person's decision (approval gates, issue 10), oldest first. */
  awaitingApproval: PendingApproval[];
  /** More await a decision than `awaitingApproval` holds. */
  moreAwaiting: boolean;
}

/** The list filter's pseudo-state: runs with a stage awaiting approval (ratchet list --state awaiting_approval). */
export const AWAITING_APPROVAL = 'awaiting_approval';

const qs = (params: Record<string, string | undefined>) => {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v) q.set(k, v);
  const s = q.toString();
  return s ? `?${s}` : '';
};

const approvalRows = (rows: PendingApproval[]) =>
  html`<table class="approvals-list"><thead><tr><th>Run</th><th>Workflow</th><th>Stage</th><th>Tool</th><th>Since</th><th>Timeout</th></tr></thead><tbody>
${rows.map(
  (
    a,
  ) => html`<tr data-run-id="${a.runId}" data-stage-id="${a.stageId}"><td><a href="/runs/${a.runId}">${a.runId}</a></td><td>${a.workflow}</td>
<td>${a.seq}. ${a.name}</td><td><code>${a.tool}</code></td><td>${fmtTime(a.since)}</td><td>${fmtTime(a.timeoutAt)}</td></tr>`,
)}</tbody></table>`;

export function listPage(v: ListView): Html {
  const awaiting = v.state === AWAITING_APPROVAL;
  const filters = html`<form class="filters" method="get" action="/">
<label>State <select name="state"><option value="">any</option>${RUN_STATES.map((s) => html`<option value="${s}"${v.state === s ? html` selected` : ''}>${s}</option>`)}
<option value="${AWAITING_APPROVAL}"${awaiting ? html` selected` : ''}>awaiting approval (a stage)</option></select></label>
<label>Workflow <input name="workflow" list="workflows" value="${v.workflow}" placeholder="any"></label>
<datalist id="workflows">${v.workflows.map((w) => html`<option value="${w}">`)}</datalist>
<button type="submit">Filter</button> <a href="/">clear</a></form>`;
  if (awaiting) {
    return html`<h1>Runs awaiting approval</h1>${filters}
${v.awaitingApproval.length === 0 ? html`<p class="muted" id="no-approvals">Nothing awaits a decision.</p>` : approvalRows(v.awaitingApproval)}
${v.moreAwaiting && v.nextCursor ? html`<nav class="pager"><a rel="next" href="/${qs({ state: v.state, workflow: v.workflow, cursor: v.nextCursor })}">More awaiting approval →</a></nav>` : ''}`;
  }
  return html`<h1>Runs</h1>${filters}
<section class="approvals"><h2>Awaiting approval</h2>${
    v.awaitingApproval.length === 0
      ? html`<p class="muted">Nothing awaits a decision.</p>`
      : html`${approvalRows(v.awaitingApproval)}${v.moreAwaiting ? html`<p><a href="/${qs({ state: AWAITING_APPROVAL, workflow: v.workflow })}">all that await approval →</a></p>` : ''}`
  }</section>
<table class="runs"><thead><tr><th>Run</th><th>Workflow</th><th>State</th><th>Created</th><th>Finished</th><th>Error</th></tr></thead><tbody>
${
  v.runs.length === 0
    ? html`<tr><td colspan="6" class="muted">No runs.</td></tr>`
    : v.runs.map(
        (r) => html`<tr data-run-id="${r.id}">
<td><a href="/runs/${r.id}">${r.id}</a></td><td>${r.workflow}</td><td><span class="state s-${r.state}">${r.state}</span></td>
<td>${fmtTime(r.createdAt)}</td><td>${fmtTime(r.finishedAt)}</td><td class="err">${errorLine(r.error)}</td></tr>`,
      )
}
</tbody></table>
<nav class="pager">${v.nextCursor ? html`<a rel="next" href="/${qs({ state: v.state, workflow: v.workflow, cursor: v.nextCursor })}">Older runs →</a>` : html`<span class="muted">No older runs.</span>`}</nav>`;
}

/** A payload is never shown: its size and a short hash tell two apart. */
export function payloadSummary(v: unknown): string {
  if (v === null || v === undefined) return '-';
  const text = JSON.stringify(v);
  return `${Buffer.byteLength(text)} bytes, sha256 ${createHash('sha256').update(text).digest('hex').slice(0, 12)}`;
}

const pct = (tl: Timeline, at: number) => ((at - tl.start) / (tl.end - tl.start)) * 100;

function laneLabel(lane: Lane, seqName: Map<number, string>): Html {
  const item = lane.itemIndex !== null;
  const after =
    !item && lane.deps.length > 0 && !(lane.deps.length === 1 && lane.deps[0] === lane.seq - 1)
      ? html` <span class="after" title="waits for ${lane.deps.map((d) => seqName.get(d) ?? d).join(', ')}">after ${lane.deps.join(', ')}</span>`
      : '';
  const child = lane.child
    ? html` <a class="child" href="/runs/${lane.child.id}" title="the child run this stage started">child run ${lane.child.id.slice(0, 8)}…${lane.child.state ? html` <span class="state s-${lane.child.state}">${lane.child.state}</span>` : ''}</a>`
    : '';
  return html`<div class="lane-label${item ? ' item' : ''}" title="${lane.tool} (${lane.toolClass})">${item ? html`↳ item ${lane.itemIndex}` : html`${lane.seq}. ${lane.name}`} <span class="state s-${lane.state}">${lane.state}</span>${after}${child}</div>`;
}

function timelineView(tl: Timeline): Html {
  const span = tl.end - tl.start;
  const seqName = new Map(tl.lanes.map((l) => [l.seq, l.name]));
  const hidden = (seq: number) => {
    const h = tl.hiddenItems.get(seq);
    if (!h) return '';
    const states = Object.entries(h.byState)
      .map(([k, n]) => `${n} ${k}`)
      .join(', ');
    return html`<div class="lane more" data-group-seq="${seq}"><div class="lane-label item">↳ ${h.count} more items</div><div class="lane-track more-items">${states}</div></div>`;
  };
  return html`<div class="timeline" role="img" aria-label="timeline of stages and attempts">
<div class="axis"><span>${fmtTime(new Date(tl.start))}</span><span>${fmtMs(span)}</span></div>
${tl.lanes.map((lane, i) => {
  const next = tl.lanes[i + 1];
  const lastOfGroup = lane.groupSeq !== null && lane.itemIndex !== null && (next?.groupSeq !== lane.groupSeq || next.itemIndex === null);
  return html`<div class="lane${lane.itemIndex !== null ? ' item' : ''}" data-stage-seq="${lane.seq}" data-stage-id="${lane.stageId}" data-state="${lane.state}">${laneLabel(lane, seqName)}
<div class="lane-track">
${lane.waits.map((w) => html`<div class="wait w-${w.kind}${w.open ? ' open' : ''}" data-wait-kind="${w.kind}" style="left:${pct(tl, w.start).toFixed(3)}%;width:${Math.max(0.3, pct(tl, w.end) - pct(tl, w.start)).toFixed(3)}%" title="${w.label} · ${fmtMs(w.end - w.start)}"><span>${w.label}</span></div>`)}
${lane.attempts.map(
  (a) => html`<div class="bar o-${a.outcome}${a.reclaimed ? ' reclaimed' : ''}" data-attempt="${a.attempt}" data-outcome="${a.outcome}"
 style="left:${pct(tl, a.start).toFixed(3)}%;width:${Math.max(0.5, pct(tl, a.end) - pct(tl, a.start)).toFixed(3)}%"
 title="attempt ${a.attempt} · fence ${a.fence ?? '-'} · ${a.owner ?? 'owner unknown'} · ${a.outcome} · ${fmtMs(a.end - a.start)}${a.reclaimed ? ' · reclaimed an expired lease' : ''}${a.fastPath ? ' · fast path' : ''}">
<span>#${a.attempt}${a.reclaimed ? ' ↺' : ''}</span></div>`,
)}
${lane.marks.map((m) => html`<div class="mark m-${m.kind}" style="left:${pct(tl, m.at).toFixed(3)}%" title="${m.label}"></div>`)}
</div></div>${lastOfGroup && lane.groupSeq !== null ? hidden(lane.groupSeq) : ''}`;
})}
<div class="legend"><span class="bar o-running">running</span><span class="bar o-succeeded">succeeded</span><span class="bar o-failed">failed</span><span class="bar o-retried">retried</span>
<span class="bar o-lease_lost">lease lost</span><span class="bar o-cancelled">cancelled</span><span class="bar o-waited">handed back to wait</span>
<span class="wait-key w-retry">retry delay</span><span class="wait-key w-approval">awaiting approval</span><span class="wait-key w-signal">signal</span><span class="wait-key w-sleep">sleep</span><span class="wait-key w-items">map items</span><span class="wait-key w-child">child run</span>
<span class="mark-key m-reclaim">reclaim</span><span class="mark-key m-retry">retry</span><span class="mark-key m-decision">decision</span></div>
</div>`;
}

function explainView(x: Explanation | null): Html {
  if (!x) return html``;
  return html`<section class="explain"><h2>Explain</h2><p><strong class="verdict">${x.verdict}</strong>: ${x.summary}</p>
<dl>${Object.entries(x.evidence as Record<string, unknown>).map(([k, v]) => html`<dt>${k}</dt><dd>${k === 'error' ? errorLine(v) : typeof v === 'string' ? v : JSON.stringify(v)}</dd>`)}</dl>
<p class="muted">checked at ${fmtTime(x.checkedAt)}</p></section>`;
}

/** Buttons by state: cancel while it runs, retry when it failed, approve / reject per stage awaiting approval. */
function actions(run: RunRow, csrf: string): Html {
  const button = (action: string, label: string, cls = '') =>
    html`<form method="post" action="/runs/${run.id}/${action}" class="action" data-action="${action}"><input type="hidden" name="csrf" value="${csrf}"><button type="submit" class="${cls}">${label}</button></form>`;
  const canCancel = run.state === 'queued' || run.state === 'running';
  return html`<div class="actions">${canCancel ? button('cancel', 'Cancel run', 'danger') : ''}${run.state === 'failed' ? button('retry', 'Retry from the failed stages') : ''}</div>`;
}

/**
 * Approve / reject, per stage awaiting approval (issue 10): the same decision as
 * `POST /v1/runs/:id/stages/:stageId/approve|reject`, a rejection with its optional reason.
 * What the call would do is not shown (inputs are never shown): its size and hash, the tool, since when.
 */
export function approvalActions(run: RunRow, csrf: string, waits: WaitRow[] = []): Html {
  const gated = run.stages.filter((s) => s.state === 'awaiting_approval');
  if (gated.length === 0) return html``;
  const waitOf = new Map(waits.map((w) => [w.stageId, w]));
  return html`<section class="approval" aria-label="awaiting approval">${gated.map((s) => {
    const w = waitOf.get(s.id);
    const base = `/runs/${run.id}/stages/${s.id}`;
    return html`<div class="gate" data-stage-id="${s.id}"><p><strong>Stage ${s.seq}. ${s.name}</strong> wants to call <code>${s.tool}</code>
(input ${payloadSummary(s.input)}) and awaits a person's decision${w ? html` since ${fmtTime(w.since)}${w.until ? html`, timeout ${fmtTime(w.until)}` : ''}` : ''}.</p>
<div class="gate-buttons"><form method="post" action="${base}/approve" class="action" data-action="approve" data-stage-id="${s.id}"><input type="hidden" name="csrf" value="${csrf}"><button type="submit" class="approve">Approve</button></form>
<form method="post" action="${base}/reject" class="action" data-action="reject" data-stage-id="${s.id}"><input type="hidden" name="csrf" value="${csrf}"><input name="reason" maxlength="500" placeholder="reason (optional)" aria-label="reason for rejecting"><button type="submit" class="danger">Reject</button></form></div></div>`;
  })}</section>`;
}

/**
 * Events shown on a run page and drawn on its timeline: the newest of the run's stream (the page
 * says how many earlier ones it leaves out); its script adds the later ones live and keeps at most
 * EVENT_ROWS_KEPT rows, counting the ones it drops likewise.
 */
export const EVENTS_SHOWN = 2000;
export const EVENT_ROWS_KEPT = 2 * EVENTS_SHOWN;

/**
 * The part of the run page that live updates replace: state, buttons, timeline, stages, explain.
 * `partial`: `events` are the newest of the run's events, not all (the timeline says so).
 */
export function runPanel(
  run: RunRow,
  events: EventRow[],
  explanation: Explanation | null,
  csrf: string,
  usage?: RunUsage,
  waits: WaitRow[] = [],
  partial = false,
): Html {
  const terminal = TERMINAL_RUN_STATES.includes(run.state as RunState);
  const tl = buildTimeline(run.stages, events, run.createdAt, run.dbNow, terminal ? (run.finishedAt ?? run.updatedAt) : null, {
    waits,
    children: (run.children ?? []).map((c) => ({ id: c.id, workflow: c.workflow, state: c.state, parentStageId: c.parentStageId })),
  });
  const stageSeqs = JSON.stringify(Object.fromEntries(run.stages.map((st) => [st.id, st.seq])));
  // The stages table lists what the timeline draws, in its order (a map's items capped likewise).
  const stageById = new Map(run.stages.map((st) => [st.id, st]));
  const waitOf = new Map(waits.map((w) => [w.stageId, w]));
  const lastShownItem = new Map<number, string>();
  for (const l of tl.lanes) if (l.groupSeq !== null && l.itemIndex !== null) lastShownItem.set(l.groupSeq, l.stageId);
  return html`<div id="panel" data-state="${run.state}" data-stages="${stageSeqs}">
<div class="summary"><span class="state big s-${run.state}" id="run-state">${run.state}</span>
<dl class="facts"><dt>workflow</dt><dd>${run.workflow}</dd><dt>created</dt><dd>${fmtTime(run.createdAt)}</dd>
<dt>finished</dt><dd>${fmtTime(run.finishedAt)}</dd><dt>deadline</dt><dd>${fmtTime(run.deadline)}</dd>
<dt>input</dt><dd>${payloadSummary(run.input)}</dd>${run.state === 'succeeded' ? html`<dt>result</dt><dd>${payloadSummary(run.result)}</dd>` : ''}
${run.parentRunId ? html`<dt>parent run</dt><dd><a href="/runs/${run.parentRunId}">${run.parentRunId}</a></dd>` : ''}
${run.error ? html`<dt>error</dt><dd class="err">${errorLine(run.error)}</dd>` : ''}${usageFacts(usage)}</dl>${actions(run, csrf)}</div>
${approvalActions(run, csrf, waits)}
<h2>Timeline</h2>${partial ? html`<p class="muted" id="timeline-partial">Drawn from the newest ${events.length} events: attempts that began before ${fmtTime(events[0]?.at ?? null)} are not drawn.</p>` : ''}${timelineView(tl)}
<h2>Stages</h2><table class="stages"><thead><tr><th>#</th><th>Name</th><th>Tool (class)</th><th>State</th><th>Attempt</th><th>Fence</th><th>Held by</th><th>Since</th><th>Lease until</th><th>Heartbeat</th><th>Last error</th></tr></thead><tbody>
${tl.lanes.map((lane) => {
  const s = stageById.get(lane.stageId)!;
  const held = s.state === 'running';
  const w = s.state === 'waiting' || s.state === 'awaiting_approval' ? waitOf.get(s.id) : undefined;
  return html`<tr data-stage-seq="${s.seq}"${s.itemIndex !== null && s.itemIndex !== undefined ? html` class="item"` : ''}><td>${s.seq}</td><td>${s.itemIndex !== null && s.itemIndex !== undefined ? `↳ item ${s.itemIndex}` : s.name}</td><td>${s.tool} (${s.toolClass})</td><td><span class="state s-${s.state}">${s.state}</span></td>
<td>${s.attempt}/${s.maxAttempts}</td><td>${s.fence ?? '-'}</td><td>${held ? (s.ownerId ?? '-') : w ? `nobody (${w.kind})` : '-'}</td><td>${held ? fmtTime(s.claimedAt) : w ? fmtTime(w.since) : '-'}</td>
<td>${held ? fmtTime(s.leaseUntil) : '-'}</td><td>${held ? fmtTime(s.heartbeatAt) : '-'}</td><td class="err">${errorLine(s.error)}</td></tr>${
    lane.itemIndex !== null &&
    lane.groupSeq !== null &&
    tl.hiddenItems.has(lane.groupSeq) &&
    lastShownItem.get(lane.groupSeq) === lane.stageId
      ? html`<tr class="item more"><td></td><td colspan="10" class="muted">↳ ${tl.hiddenItems.get(lane.groupSeq)!.count} more items not listed</td></tr>`
      : ''
  }`;
})}
</tbody></table>
${explainView(explanation)}</div>`;
}

export function eventRow(e: EventRow, seqOf: Map<string, number>): Html {
  const data = e.data as Record<string, unknown> | null;
  const facts = data
    ? Object.entries(data)
        .filter(([k]) => EVENT_FACTS.has(k))
        .map(([k, v]) => `${k}=${k === 'error' || k === 'lastError' ? errorLine(v) : typeof v === 'string' ? v : JSON.stringify(v)}`)
        .join(' ')
    : '';
  return html`<tr data-event-id="${e.id}"><td>${e.id}</td><td>${fmtTime(e.at)}</td><td>${e.type}</td><td>${e.stageId ? (seqOf.get(e.stageId) ?? e.stageId) : ''}</td><td>${e.attempt ?? ''}</td><td>${e.fence ?? ''}</td><td class="facts">${facts.slice(0, 300)}</td></tr>`;
}

/** Event data keys worth a column (ids, owners, reasons, codes, delays): never payloads. */
export const EVENT_FACTS = new Set([
  'owner',
  'previousOwner',
  'previousFence',
  'reason',
  'code',
  'error',
  'lastError',
  'delayMs',
  'availableAt',
  'leaseUntil',
  'fastPath',
  'requestId',
  'stages',
  'outcome',
  'currentFence',
  'currentState',
  'durationMs',
  'resultHash',
  'resultBytes',
  'effectKey',
]);

/** The run's model usage (tokens in / out, calls, cost when priced), or nothing for a run without model calls. */
export function usageFacts(u: RunUsage | undefined): Html {
  if (!u || u.modelCalls === 0) return html``;
  return html`<dt>model usage</dt><dd id="run-usage">${u.inputTokens} tokens in, ${u.outputTokens} out, ${u.modelCalls} call(s)${u.cost !== undefined ? html`, cost <span id="run-cost">${formatCost(u.cost)}</span>` : ''}</dd>`;
}

/** A cost with up to 6 decimals, no trailing zeros. */
export const formatCost = (n: number): string => String(Number(n.toFixed(6)));

/**
 * The run page. `events`: the newest of the run's stream, in stream order (readStreamTail), with
 * `earlier` events before them not shown (said in the table). `data-after` is the last one's id:
 * the script opens the stream after it, so it gets every later event once, none of these again.
 */
export function runPage(
  run: RunRow,
  events: EventRow[],
  explanation: Explanation | null,
  csrf: string,
  usage?: RunUsage,
  waits: WaitRow[] = [],
  earlier = 0,
): Html {
  const seqOf = new Map(run.stages.map((s) => [s.id, s.seq]));
  const after = events.at(-1)?.id ?? '';
  return html`<p><a href="/">← runs</a></p><h1>Run <code>${run.id}</code></h1>
<div id="run" data-run-id="${run.id}" data-after="${after}" data-stages="${JSON.stringify(Object.fromEntries(seqOf))}"><p class="live" id="live" aria-live="polite">${TERMINAL_RUN_STATES.includes(run.state) ? 'finished' : 'connecting…'}</p>
${runPanel(run, events, explanation, csrf, usage, waits, earlier > 0)}
<h2>Events</h2><table class="events"><thead><tr><th>id</th><th>at</th><th>type</th><th>stage</th><th>attempt</th><th>fence</th><th>facts</th></tr></thead>
<tbody id="events" data-keep="${EVENT_ROWS_KEPT}">${earlier > 0 ? earlierRow(run.id, earlier) : ''}${events.map((e) => eventRow(e, seqOf))}</tbody></table></div>`;
}

/** The first row of the events table when earlier events are left out: how many (the script keeps the count as it drops rows). */
export const earlierRow = (runId: string, n: number): Html =>
  html`<tr id="events-earlier" class="earlier"><td colspan="7" class="muted"><span class="count">${n}</span> earlier events not shown (<code>ratchet events ${runId}</code> lists them all)</td></tr>`;
