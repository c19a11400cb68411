import { CHILD_RUN_TOOL_NAME } from '../definitions/builtin.js';
import type { EventRow, StageRow } from '../store/runs.js';

/**
 * A run's timeline from its events (pure): one lane per stage (parallel stages each in their
 * own lane, a map's items nested under their map stage), a bar per attempt coloured by how it
 * ended, marks for what happened on the way (reclaim, lease lost, retry, ownership unknown, a
 * rejected result, a skip), and waits drawn as waits: a retry delay, a sleep, a signal, a
 * person's approval, a map's items, a child run.
 */
export type AttemptOutcome =
  | 'running'
  | 'succeeded'
  | 'failed'
  | 'retried'
  | 'lease_lost'
  | 'released'
  | 'cancelled'
  /** The attempt handed its lease back to wait (a sleep, a signal, an approval, a map's items, a child run). */
  | 'waited'
  | 'skipped'
  | 'unknown';

export interface AttemptBar {
  attempt: number;
  fence: string | null;
  owner: string | null;
  start: number;
  end: number;
  outcome: AttemptOutcome;
  /** Claimed by taking over an expired lease. */
  reclaimed: boolean;
  /** Claimed in the same statement that finished the stage before it. */
  fastPath: boolean;
}

export interface Mark {
  at: number;
  kind: 'reclaim' | 'lease_lost' | 'retry' | 'ownership_unknown' | 'result_rejected' | 'request' | 'skip' | 'decision';
  label: string;
}
/** What a stage waited for, without a lease: a retry's delay, or a wait of issue 10 / the run graph. */
export type WaitKind = 'retry' | 'sleep' | 'signal' | 'approval' | 'items' | 'child';
export interface Wait {
  kind: WaitKind;
  start: number;
  end: number;
  /** Still waiting (the bar runs to now). */
  open: boolean;
  label: string;
}

/** A stage's row of ratchet.waits (the latest wait of the stage: kind, since, timeout, how it ended). */
export interface WaitRow {
  stageId: string;
  kind: 'sleep' | 'signal' | 'approval';
  signalName: string | null;
  since: Date;
  until: Date | null;
  endedAt: Date | null;
  outcome: string | null;
}
/** A child run a stage started. */
export interface ChildRef {
  id: string;
  workflow: string;
  state: string;
  parentStageId: string | null;
}

export interface Lane {
  stageId: string;
  seq: number;
  name: string;
  tool: string;
  toolClass: string;
  state: string;
  /** The seqs this stage waits for (the run graph), [] for a first stage. */
  deps: number[];
  /** A map item: its index, and the map stage's seq (its lane follows the map's). */
  itemIndex: number | null;
  groupSeq: number | null;
  /** The child run this stage started, if any. */
  child: ChildRef | null;
  attempts: AttemptBar[];
  marks: Mark[];
  waits: Wait[];
}

/** Map items beyond this many per map are summed up in one line (a map may have 10,000). */
export const ITEMS_SHOWN = 40;

export interface Timeline {
  start: number;
  end: number;
  lanes: Lane[];
  /** Per map stage seq: items not drawn (beyond ITEMS_SHOWN), counted by state. */
  hiddenItems: Map<number, { count: number; byState: Record<string, number> }>;
}

const t = (d: Date) => d.getTime();
const str = (v: unknown): string | null => (typeof v === 'string' ? v : null);

const WAIT_WORDS: Record<WaitKind, string> = {
  retry: 'waiting to retry',
  sleep: 'sleeping',
  signal: 'waiting for a signal',
  approval: 'awaiting approval',
  items: "waiting for the map's items",
  child: 'waiting for its child run',
};

export function buildTimeline(
  stages: StageRow[],
  events: EventRow[],
  runStart: Date,
  now: Date,
  runEnd: Date | null,
  extra: { waits?: WaitRow[]; children?: ChildRef[] } = {},
): Timeline {
  const childOf = new Map((extra.children ?? []).flatMap((c) => (c.parentStageId ? [[c.parentStageId, c] as const] : [])));
  const waitRowOf = new Map((extra.waits ?? []).map((w) => [w.stageId, w]));
  const lanes = new Map<string, Lane>(
    stages.map((s) => [
      s.id,
      {
        stageId: s.id,
        seq: s.seq,
        name: s.name,
        tool: s.tool,
        toolClass: s.toolClass,
        state: s.state,
        deps: s.deps ?? [],
        itemIndex: s.itemIndex ?? null,
        groupSeq: s.groupSeq ?? null,
        child: childOf.get(s.id) ?? null,
        attempts: [],
        marks: [],
        waits: [],
      },
    ]),
  );
  const end = t(runEnd ?? now);
  const open = (lane: Lane) => lane.attempts.find((a) => a.outcome === 'running');
  const close = (lane: Lane, at: number, outcome: AttemptOutcome) => {
    const a = open(lane);
    if (a) {
      a.end = at;
      a.outcome = outcome;
    }
  };
  const pendingWait = new Map<string, { kind: WaitKind; start: number; label: string }>();
  const endWait = (lane: Lane, at: number) => {
    const w = pendingWait.get(lane.stageId);
    if (w) {
      lane.waits.push({ ...w, end: at, open: false });
      pendingWait.delete(lane.stageId);
    }
  };
  const beginWait = (lane: Lane, at: number, kind: WaitKind, detail = '') => {
    endWait(lane, at);
    pendingWait.set(lane.stageId, { kind, start: at, label: `${WAIT_WORDS[kind]}${detail}` });
  };
  /** An attempt that ends with a retry after `delay` ms: a mark, then a wait until the next claim. */
  const retryAfter = (lane: Lane, at: number, delay: number | null, what: string) => {
    close(lane, at, 'retried');
    lane.marks.push({ at, kind: 'retry', label: `${what}${delay !== null ? ` after ${delay} ms` : ''}` });
    beginWait(lane, at, 'retry', delay !== null ? ` (${delay} ms)` : '');
  };
  for (const e of events) {
    if (!e.stageId) continue;
    const lane = lanes.get(e.stageId);
    if (!lane) continue;
    const at = t(e.at);
    const data = (e.data ?? {}) as Record<string, unknown>;
    switch (e.type) {
      case 'job_claimed':
      case 'lease_reclaimed': {
        const reclaimed = e.type === 'lease_reclaimed';
        if (reclaimed) {
          close(lane, at, 'lease_lost');
          lane.marks.push({
            at,
            kind: 'reclaim',
            label: `attempt ${e.attempt} reclaimed the expired lease of ${str(data.previousOwner) ?? 'a lost owner'} (fence ${str(data.previousFence) ?? '-'})`,
          });
        } else {
          close(lane, at, 'unknown');
        }
        endWait(lane, at);
        lane.attempts.push({
          attempt: e.attempt ?? lane.attempts.length + 1,
          fence: e.fence,
          owner: str(data.owner),
          start: at,
          end,
          outcome: 'running',
          reclaimed,
          fastPath: data.fastPath === true,
        });
        break;
      }
      case 'stage_succeeded':
        close(lane, at, 'succeeded');
        break;
      case 'stage_failed':
      case 'attempts_exhausted':
        close(lane, at, 'failed');
        break;
      case 'stage_duration_exceeded':
        // past maxDuration: retried after its policy's delay (as retry_scheduled), or failed for good
        if (data.nextState === 'queued')
          retryAfter(lane, at, typeof data.delayMs === 'number' ? data.delayMs : null, 'past maxDuration: retry');
        else close(lane, at, 'failed');
        break;
      case 'stage_cancelled':
        close(lane, at, 'cancelled');
        endWait(lane, at);
        break;
      case 'stage_skipped':
        close(lane, at, 'skipped');
        lane.marks.push({ at, kind: 'skip', label: `skipped (${str(data.reason) ?? 'its condition or its dependencies'})` });
        break;
      case 'stage_waiting': {
        // The run graph's waits: a map stage for its items, a child-run stage for its child.
        close(lane, at, 'waited');
        beginWait(lane, at, lane.child !== null || lane.tool === CHILD_RUN_TOOL_NAME ? 'child' : 'items');
        break;
      }
      case 'child_run_started':
        if (lane.child === null && typeof data.childRunId === 'string')
          lane.child = { id: data.childRunId, workflow: '', state: '', parentStageId: lane.stageId };
        break;
      case 'wait_started': {
        close(lane, at, 'waited');
        const kind = data.kind === 'signal' ? 'signal' : 'sleep';
        beginWait(lane, at, kind, kind === 'signal' && typeof data.signal === 'string' ? ` "${data.signal}"` : '');
        break;
      }
      case 'approval_requested':
        close(lane, at, 'waited');
        beginWait(lane, at, 'approval');
        break;
      case 'wait_ended':
      case 'signal_received':
        endWait(lane, at);
        break;
      case 'approval_granted':
      case 'approval_rejected':
      case 'approval_timed_out': {
        const w = pendingWait.get(lane.stageId);
        if (w) w.label += ` · ${e.type === 'approval_granted' ? 'approved' : e.type === 'approval_rejected' ? 'rejected' : 'timed out'}`;
        endWait(lane, at);
        const who = str(data.actor) ?? str(data.decidedBy);
        lane.marks.push({
          at,
          kind: 'decision',
          label: `${e.type.replace('_', ' ')}${who ? ` by ${who}` : ''}${str(data.reason) ? `: ${str(data.reason)}` : ''}`,
        });
        break;
      }
      case 'lease_released':
        close(lane, at, 'released');
        break;
      case 'retry_scheduled':
        retryAfter(lane, at, typeof data.delayMs === 'number' ? data.delayMs : null, 'retry scheduled');
        break;
      case 'heartbeat_lost':
        lane.marks.push({ at, kind: 'lease_lost', label: `attempt ${e.attempt ?? '?'} lost its lease (fence ${e.fence ?? '-'})` });
        break;
      case 'ownership_unknown':
        lane.marks.push({
          at,
          kind: 'ownership_unknown',
          label: `attempt ${e.attempt ?? '?'}: ownership unknown (the database did not answer)`,
        });
        break;
      case 'result_rejected':
        lane.marks.push({
          at,
          kind: 'result_rejected',
          label: `a finish of fence ${e.fence ?? '-'} was rejected (${str(data.reason) ?? 'stale'})`,
        });
        break;
      case 'tool_request_started':
        lane.marks.push({ at, kind: 'request', label: `attempt ${e.attempt ?? '?'} began an irreversible request` });
        break;
      default:
        break;
    }
  }
  // A run that ended with an attempt still open (cancelled, expired): the attempt ends with the run.
  for (const lane of lanes.values()) {
    const a = open(lane);
    if (a && runEnd) {
      a.end = t(runEnd);
      a.outcome = lane.state === 'cancelled' ? 'cancelled' : 'unknown';
    }
    const w = pendingWait.get(lane.stageId);
    if (w) {
      const row = waitRowOf.get(lane.stageId);
      const until = row && row.endedAt === null && row.until ? ` until ${row.until.toISOString()}` : '';
      lane.waits.push({ ...w, label: w.label + until, end, open: runEnd === null });
    }
  }
  return { start: t(runStart), end: Math.max(end, t(runStart) + 1), ...orderLanes([...lanes.values()]) };
}

/**
 * Lanes in the graph's order: by seq, each map's items right under their map stage (by index),
 * at most ITEMS_SHOWN of them (the ones not shown are counted by state).
 */
function orderLanes(all: Lane[]): { lanes: Lane[]; hiddenItems: Timeline['hiddenItems'] } {
  const items = new Map<number, Lane[]>();
  const top: Lane[] = [];
  for (const l of all) {
    if (l.groupSeq !== null && l.itemIndex !== null) items.set(l.groupSeq, [...(items.get(l.groupSeq) ?? []), l]);
    else top.push(l);
  }
  top.sort((a, b) => a.seq - b.seq);
  const known = new Set(top.map((l) => l.seq));
  const hiddenItems: Timeline['hiddenItems'] = new Map();
  const lanes: Lane[] = [];
  const addItems = (group: number) => {
    const list = (items.get(group) ?? []).sort((a, b) => (a.itemIndex ?? 0) - (b.itemIndex ?? 0));
    lanes.push(...list.slice(0, ITEMS_SHOWN));
    if (list.length > ITEMS_SHOWN) {
      const byState: Record<string, number> = {};
      for (const l of list.slice(ITEMS_SHOWN)) byState[l.state] = (byState[l.state] ?? 0) + 1;
      hiddenItems.set(group, { count: list.length - ITEMS_SHOWN, byState });
    }
  };
  for (const l of top) {
    lanes.push(l);
    addItems(l.seq);
  }
  // Items whose map stage is not among the stages (never expected): at the end, in order.
  for (const g of [...items.keys()].filter((g) => !known.has(g)).sort((a, b) => a - b)) addItems(g);
  return { lanes, hiddenItems };
}
