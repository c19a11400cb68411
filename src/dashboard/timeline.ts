import type { EventRow, StageRow } from '../store/runs.js';

/**
 * A run's timeline from its events (pure): one lane per stage, a bar per attempt coloured by
 * how it ended, marks for what happened on the way (reclaim, lease lost, retry, ownership
 * unknown, a rejected result), and waits (a retry delay) between attempts.
 */
export type AttemptOutcome = 'running' | 'succeeded' | 'failed' | 'retried' | 'lease_lost' | 'released' | 'cancelled' | 'unknown';

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
  kind: 'reclaim' | 'lease_lost' | 'retry' | 'ownership_unknown' | 'result_rejected' | 'request';
  label: string;
}
export interface Wait {
  start: number;
  end: number;
  label: string;
}

export interface Lane {
  stageId: string;
  seq: number;
  name: string;
  tool: string;
  toolClass: string;
  state: string;
  attempts: AttemptBar[];
  marks: Mark[];
  waits: Wait[];
}

export interface Timeline {
  start: number;
  end: number;
  lanes: Lane[];
}

const t = (d: Date) => d.getTime();
const str = (v: unknown): string | null => (typeof v === 'string' ? v : null);

export function buildTimeline(stages: StageRow[], events: EventRow[], runStart: Date, now: Date, runEnd: Date | null): Timeline {
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
  const pendingWait = new Map<string, { start: number; label: string }>();
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
        const w = pendingWait.get(lane.stageId);
        if (w) {
          lane.waits.push({ start: w.start, end: at, label: w.label });
          pendingWait.delete(lane.stageId);
        }
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
      case 'stage_duration_exceeded':
        close(lane, at, 'failed');
        break;
      case 'stage_cancelled':
        close(lane, at, 'cancelled');
        break;
      case 'lease_released':
        close(lane, at, 'released');
        break;
      case 'retry_scheduled': {
        close(lane, at, 'retried');
        const delay = typeof data.delayMs === 'number' ? data.delayMs : null;
        lane.marks.push({ at, kind: 'retry', label: `retry scheduled${delay !== null ? ` after ${delay} ms` : ''}` });
        pendingWait.set(lane.stageId, { start: at, label: `waiting to retry${delay !== null ? ` (${delay} ms)` : ''}` });
        break;
      }
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
    if (w) lane.waits.push({ start: w.start, end, label: w.label });
  }
  return { start: t(runStart), end: Math.max(end, t(runStart) + 1), lanes: [...lanes.values()].sort((a, b) => a.seq - b.seq) };
}
