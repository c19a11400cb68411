import type { RunRow, StageRow } from '../store/index.js';
import type { WaitKind } from '../planner/waits.js';
import { explanationBase } from './classify.js';
import type { Explanation } from './explanation.js';

/**
 * What explain reads about a stage that waits without a lease (issue 10), from ratchet.waits:
 * its kind, since when, and until when (a sleep's end; a signal's or an approval's timeout).
 */
export interface WaitEvidence {
  kind: WaitKind;
  since: Date;
  /** The sleep's end, or the timeout; null: an approval without approvalTimeout. */
  until: Date | null;
  /** The signal's name (kind signal). */
  signal?: string;
  /** The step has onTimeout (kind signal). */
  onTimeout?: boolean;
  /** The signal's timeout as declared (kind signal). */
  timeoutMs?: number | null;
}

const iso = (d: Date | null): string | null => (d ? d.toISOString() : null);
const secs = (ms: number): string => `${(ms / 1000).toFixed(1)} s`;

/**
 * The verdict about a run whose telling stage waits for a signal (`waiting_for_signal`), a
 * person (`awaiting_approval`) or a time (`sleeping_until`), with since and timeout as evidence.
 * Pure: the same facts and `now` (the database clock) give the same answer. A wait past its time
 * says by how much (`overdueMs`): the sweeper of any running worker ends it; a large overdue
 * means none runs.
 */
export function classifyWait(run: RunRow, stage: StageRow, ev: WaitEvidence, now: Date): Explanation {
  const t = now.getTime();
  const base = explanationBase(run, stage, now);
  const name = `stage ${stage.seq} (${stage.name})`;
  const waitingForMs = Math.max(0, t - ev.since.getTime());
  const overdueMs = ev.until !== null && ev.until.getTime() <= t ? t - ev.until.getTime() : null;
  const overdue = overdueMs === null ? '' : `; its time passed ${secs(overdueMs)} ago (the sweeper of a running worker ends it)`;
  const deadline = base.deadlinePassed ? '; its run deadline has passed (the run expires when a worker next looks at it)' : '';

  if (ev.kind === 'signal') {
    const signal = ev.signal ?? stage.name;
    return {
      verdict: 'waiting_for_signal',
      ...base,
      summary:
        `${name} waits for signal "${signal}" since ${ev.since.toISOString()} (${secs(waitingForMs)}), holding no lease` +
        (ev.until
          ? `; it times out at ${ev.until.toISOString()} (${ev.onTimeout ? 'then its onTimeout gives the output' : 'then it fails with signal_timeout'})`
          : '') +
        `${overdue}${deadline}. Send it: POST /v1/runs/${run.id}/signals/${signal} or ratchet signal ${run.id} ${signal} --data '<json>'`,
      evidence: {
        signal,
        since: ev.since.toISOString(),
        timeoutAt: iso(ev.until),
        timeoutMs: ev.timeoutMs ?? (ev.until ? ev.until.getTime() - ev.since.getTime() : null),
        waitingForMs,
        overdueMs,
        onTimeout: ev.onTimeout ? 'on_timeout' : 'fail',
      },
    };
  }
  if (ev.kind === 'approval') {
    const approveWith = `ratchet approve ${run.id} --stage ${stage.id}`;
    return {
      verdict: 'awaiting_approval',
      ...base,
      summary:
        `${name} (${stage.tool}) waits for a person's approval since ${ev.since.toISOString()} (${secs(waitingForMs)}), holding no lease; ` +
        (ev.until ? `no decision by ${ev.until.toISOString()} refuses it (approval_timeout)` : 'it waits until someone decides') +
        `${overdue}${deadline}. Decide: ${approveWith} (or ratchet reject ${run.id} --stage ${stage.id} --reason '...')`,
      evidence: {
        tool: stage.tool,
        since: ev.since.toISOString(),
        timeoutAt: iso(ev.until),
        waitingForMs,
        overdueMs,
        approveWith,
      },
    };
  }
  const until = ev.until ?? ev.since;
  const remainingMs = Math.max(0, until.getTime() - t);
  return {
    verdict: 'sleeping_until',
    ...base,
    summary: `${name} sleeps until ${until.toISOString()} (${secs(remainingMs)} left), holding no lease${overdue}${deadline}`,
    evidence: { until: until.toISOString(), since: ev.since.toISOString(), remainingMs, overdueMs },
  };
}
