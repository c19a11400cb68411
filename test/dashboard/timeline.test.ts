import { describe, expect, it } from 'vitest';
import { approvalActions, runPanel } from '../../src/dashboard/pages.js';
import { buildTimeline, ITEMS_SHOWN } from '../../src/dashboard/timeline.js';
import type { EventRow, RunRow, StageRow } from '../../src/store/runs.js';

/**
 * The timeline (pure): parallel stages in their own lanes, map items nested under their map
 * (at most ITEMS_SHOWN drawn), waits drawn by kind (approval, signal, sleep, map items, child
 * run, retry) from the events, a child-run stage linking to the child's page; and the approve /
 * reject forms of a stage awaiting approval.
 */
const T0 = Date.parse('2026-12-01T00:00:00Z');
const at = (s: number) => new Date(T0 + s * 1000);

function stage(seq: number, over: Partial<StageRow> = {}): StageRow {
  return {
    id: String(100 + seq),
    seq,
    name: `s${seq}`,
    tool: `t${seq}`,
    toolClass: 'c',
    state: 'succeeded',
    ownerId: null,
    fence: null,
    attempt: 1,
    maxAttempts: 3,
    leaseUntil: null,
    heartbeatAt: null,
    claimedAt: null,
    availableAt: at(0),
    idempotencyKey: `k${seq}`,
    effectKey: null,
    input: { secret: 'never-shown-7731' },
    result: null,
    error: null,
    createdAt: at(0),
    updatedAt: at(0),
    finishedAt: null,
    deps: seq === 1 ? [] : [seq - 1],
    itemIndex: null,
    groupSeq: null,
    ...over,
  };
}
let eid = 0;
const ev = (stageId: string, type: string, s: number, data: Record<string, unknown> = {}, attempt: number | null = null): EventRow => ({
  id: String(++eid),
  runId: 'r',
  stageId,
  type,
  fence: attempt === null ? null : String(attempt),
  attempt,
  at: at(s),
  data,
});

describe('timeline', () => {
  it('an approval: the claim that asked is handed back, the wait is open until the decision, then a second attempt', () => {
    const s1 = stage(1, { state: 'awaiting_approval' });
    const open = buildTimeline([s1], [ev('101', 'job_claimed', 1, {}, 1), ev('101', 'approval_requested', 2)], at(0), at(10), null, {
      waits: [{ stageId: '101', kind: 'approval', signalName: null, since: at(2), until: at(3602), endedAt: null, outcome: null }],
    });
    const lane = open.lanes[0]!;
    expect(lane.attempts).toMatchObject([{ attempt: 1, outcome: 'waited' }]);
    expect(lane.waits).toEqual([
      { kind: 'approval', start: T0 + 2000, end: T0 + 10_000, open: true, label: `awaiting approval until ${at(3602).toISOString()}` },
    ]);

    const decided = buildTimeline(
      [{ ...s1, state: 'succeeded' }],
      [
        ev('101', 'job_claimed', 1, {}, 1),
        ev('101', 'approval_requested', 2),
        ev('101', 'approval_granted', 5, { decidedBy: 'token:abc', actor: 'Ana', reason: 'ok' }),
        ev('101', 'job_claimed', 6, {}, 2),
        ev('101', 'stage_succeeded', 7, {}, 2),
      ],
      at(0),
      at(10),
      at(8),
    );
    const l = decided.lanes[0]!;
    expect(l.waits).toMatchObject([
      { kind: 'approval', start: T0 + 2000, end: T0 + 5000, open: false, label: 'awaiting approval · approved' },
    ]);
    expect(l.attempts.map((a) => a.outcome)).toEqual(['waited', 'succeeded']);
    expect(l.marks).toMatchObject([{ kind: 'decision', label: 'approval granted by Ana: ok' }]);
  });

  it('sleep and signal waits, a retry delay, a skip; a cancelled run ends an open wait', () => {
    const stages = [stage(1), stage(2, { state: 'cancelled' }), stage(3, { state: 'skipped' }), stage(4), stage(5)];
    const tl = buildTimeline(
      stages,
      [
        ev('101', 'job_claimed', 0, {}, 1),
        ev('101', 'wait_started', 1, { kind: 'sleep' }),
        ev('101', 'wait_ended', 3, { kind: 'sleep', outcome: 'woken' }),
        ev('101', 'job_claimed', 3, {}, 2),
        ev('101', 'stage_succeeded', 4, {}, 2),
        ev('102', 'job_claimed', 4, {}, 1),
        ev('102', 'wait_started', 5, { kind: 'signal', signal: 'paid' }),
        ev('102', 'stage_cancelled', 8),
        ev('103', 'job_claimed', 4, {}, 1),
        ev('103', 'stage_skipped', 4.1, {}),
        ev('104', 'job_claimed', 4, {}, 1),
        ev('104', 'retry_scheduled', 5, { delayMs: 1000 }, 1),
        ev('104', 'job_claimed', 6, {}, 2),
        ev('104', 'stage_succeeded', 7, {}, 2),
        ev('105', 'job_claimed', 4, {}, 1),
        ev('105', 'stage_duration_exceeded', 6, { nextState: 'queued', delayMs: 2000 }, 1),
        ev('105', 'job_claimed', 8, {}, 2),
        ev('105', 'stage_duration_exceeded', 9, { nextState: 'failed', decision: 'max_elapsed' }, 2),
      ],
      at(0),
      at(10),
      at(9),
    );
    const [l1, l2, l3, l4, l5] = tl.lanes;
    expect(l1!.waits).toMatchObject([{ kind: 'sleep', start: T0 + 1000, end: T0 + 3000, open: false }]);
    expect(l2!.waits).toMatchObject([{ kind: 'signal', label: 'waiting for a signal "paid"', end: T0 + 8000, open: false }]);
    expect(l3!.attempts.map((a) => a.outcome)).toEqual(['skipped']);
    expect(l3!.marks.map((m) => m.kind)).toEqual(['skip']);
    expect(l4!.waits).toMatchObject([{ kind: 'retry', label: 'waiting to retry (1000 ms)', start: T0 + 5000, end: T0 + 6000 }]);
    expect(l4!.attempts.map((a) => a.outcome)).toEqual(['retried', 'succeeded']);
    // past maxDuration: retried after the policy's delay, then failed for good
    expect(l5!.waits).toMatchObject([{ kind: 'retry', label: 'waiting to retry (2000 ms)', start: T0 + 6000, end: T0 + 8000 }]);
    expect(l5!.attempts.map((a) => a.outcome)).toEqual(['retried', 'failed']);
    expect(l5!.marks).toMatchObject([{ kind: 'retry', label: 'past maxDuration: retry after 2000 ms' }]);
  });

  it('a map: its items in lanes under it, by index, the ones beyond ITEMS_SHOWN counted by state; a child run waited for and linked', () => {
    const n = ITEMS_SHOWN + 5;
    const items = Array.from({ length: n }, (_, i) =>
      stage(1_000_000 + i, { id: String(5000 + i), itemIndex: n - 1 - i, groupSeq: 2, state: i < 3 ? 'running' : 'succeeded' }),
    );
    const stages = [
      stage(1),
      stage(2, { state: 'waiting', tool: 'summarise' }),
      stage(3, { state: 'waiting', tool: '$workflow' }),
      ...items,
    ];
    const tl = buildTimeline(
      stages,
      [
        ev('102', 'job_claimed', 1, {}, 1),
        ev('102', 'stage_waiting', 2, {}, 1),
        ev('103', 'job_claimed', 1, {}, 1),
        ev('103', 'stage_waiting', 2, {}, 1),
        ev('103', 'child_run_started', 2, { childRunId: '0190a8b2-7c3d-7e4f-8a5b-6c7d8e9f0a1b' }, 1),
      ],
      at(0),
      at(10),
      null,
      { children: [{ id: '0190a8b2-7c3d-7e4f-8a5b-6c7d8e9f0a1b', workflow: 'publish', state: 'running', parentStageId: '103' }] },
    );
    expect(tl.lanes.slice(0, 2).map((l) => l.seq)).toEqual([1, 2]);
    expect(tl.lanes.slice(2, 2 + ITEMS_SHOWN).map((l) => l.itemIndex)).toEqual(Array.from({ length: ITEMS_SHOWN }, (_, i) => i));
    expect(tl.lanes[2 + ITEMS_SHOWN]!.seq).toBe(3);
    expect(tl.lanes).toHaveLength(3 + ITEMS_SHOWN);
    // The 5 not drawn are the highest indexes: items 0..4 of the list (3 of them running).
    expect(tl.hiddenItems.get(2)).toEqual({ count: 5, byState: { running: 3, succeeded: 2 } });
    expect(tl.lanes[1]!.waits).toMatchObject([{ kind: 'items', open: true }]);
    const child = tl.lanes[2 + ITEMS_SHOWN]!;
    expect(child.waits).toMatchObject([{ kind: 'child', open: true }]);
    expect(child.child?.id).toBe('0190a8b2-7c3d-7e4f-8a5b-6c7d8e9f0a1b');
  });
});

describe('run panel', () => {
  const run = (stages: StageRow[]): RunRow => ({
    id: '0190a8b2-0000-7e4f-8a5b-6c7d8e9f0a1b',
    workflow: 'w',
    definitionHash: 'h',
    input: {},
    state: 'running',
    deadline: null,
    idempotencyKey: null,
    result: null,
    error: null,
    createdAt: at(0),
    updatedAt: at(1),
    finishedAt: null,
    dbNow: at(5),
    stages,
    priority: 0,
    children: [
      {
        id: '0190a8b2-1111-7e4f-8a5b-6c7d8e9f0a1b',
        workflow: 'child',
        state: 'running',
        parentStageId: '102',
        createdAt: at(1),
        finishedAt: null,
      },
    ],
  });

  it('approve / reject forms per stage awaiting approval, CSRF token in each, never the input; the child run linked; fork and join lanes', () => {
    const r = run([
      stage(1, { state: 'awaiting_approval' }),
      stage(2, { state: 'waiting', tool: '$workflow', deps: [] }),
      stage(3, { state: 'pending', deps: [1, 2] }),
    ]);
    const html = runPanel(r, [], null, 'csrf-123').text;
    expect(html).toContain(`action="/runs/${r.id}/stages/101/approve"`);
    expect(html).toContain(`action="/runs/${r.id}/stages/101/reject"`);
    expect(html.match(/name="csrf" value="csrf-123"/g)?.length).toBe(3); // cancel, approve, reject
    expect(html).toContain('name="reason"');
    expect(html).not.toContain('never-shown-7731');
    expect(html).toContain('href="/runs/0190a8b2-1111-7e4f-8a5b-6c7d8e9f0a1b"');
    expect(html).toMatch(/3\. s3 .*after 1, 2/);
    expect(approvalActions(run([stage(1, { state: 'running' })]), 'x').text).toBe('');
  });

  it('a map of 2,000 items: the timeline and the stages table draw ITEMS_SHOWN of them and count the rest', () => {
    const items = Array.from({ length: 2000 }, (_, i) => stage(1_000_000 + i, { id: String(9000 + i), itemIndex: i, groupSeq: 1 }));
    const html = runPanel(run([stage(1, { state: 'waiting' }), ...items]), [], null, 'c').text;
    expect(html.match(/<div class="lane item"/g)?.length).toBe(ITEMS_SHOWN);
    expect(html.match(/<tr data-stage-seq="\d+" class="item">/g)?.length).toBe(ITEMS_SHOWN);
    expect(html).toContain(`${2000 - ITEMS_SHOWN} more items not listed`);
    expect(html).toContain(`${2000 - ITEMS_SHOWN} more items</div>`);
    expect(html.length).toBeLessThan(200_000);
  });
});
