import type { ToolClass } from '../definitions/types.js';
import type { RunRow, StageRow } from '../store/index.js';
import { WORKER_SEEN_WITHIN_MS, type EvidenceOf, type Explanation, type Verdict } from './explanation.js';

/** What STAGE_EVIDENCE_SQL read about the current stage's class, by the database clock. */
export interface StageEvidence {
  now: Date;
  concurrencyKey: string | null;
  concurrencyLimit: number | null;
  workersRecent: number;
  /** The run's definition hash (copied on the stage), its version if this process knows it, and the recent workers that loaded it. */
  definitionHash: string;
  version: number | null;
  workersWithDefinition: number;
  workerLastSeen: Date | null;
  classLastHeartbeat: Date | null;
  liveLeases: number;
  keyLiveLeases: number;
  rateClaims: number;
  rateOldest: Date | null;
  backlogAhead: number;
}

const iso = (d: Date | null): string | null => (d ? d.toISOString() : null);
const secs = (ms: number): string => `${(ms / 1000).toFixed(1)} s`;
const errorText = (e: unknown): string => {
  const { code, message } = (e ?? {}) as { code?: unknown; message?: unknown };
  if (typeof message === 'string') return typeof code === 'string' ? `${code}: ${message}` : message;
  return typeof code === 'string' ? code : 'no error recorded';
};

/** What every verdict about one stage of a run says first: the run, the stage, the deadline, the clock it was read by. */
export function explanationBase(run: RunRow, stage: StageRow, now: Date) {
  return {
    runId: run.id,
    runState: run.state,
    stage: {
      id: stage.id,
      seq: stage.seq,
      name: stage.name,
      tool: stage.tool,
      toolClass: stage.toolClass,
      state: stage.state,
      attempt: stage.attempt,
      maxAttempts: stage.maxAttempts,
    },
    deadline: iso(run.deadline),
    deadlinePassed: run.deadline !== null && run.deadline.getTime() <= now.getTime(),
    checkedAt: now.toISOString(),
  };
}

/**
 * The verdict about a run that is not finished, from its current stage (the running one, else
 * the queued one) and the evidence about that stage's class. Pure: the same facts give the
 * same answer. Order for a queued stage: not due yet (a retry delay); a limit that holds it
 * (class concurrency, its concurrency key, the class rate); nobody serving the class; nobody
 * serving it who has loaded the run's definition (a worker without it leaves the stage alone);
 * stages ahead of it; else first in line.
 */
export function classifyActive(run: RunRow, stage: StageRow, ev: StageEvidence, cls: ToolClass | undefined): Explanation {
  const now = ev.now.getTime();
  const name = `stage ${stage.seq} (${stage.name})`;
  const base = explanationBase(run, stage, ev.now);
  const make = <V extends Verdict>(verdict: V, summary: string, evidence: EvidenceOf<V>): Explanation =>
    ({
      verdict,
      ...base,
      summary:
        run.deadline !== null && base.deadlinePassed
          ? `${summary}; its deadline has passed (the run expires when a worker next looks at it)`
          : summary,
      evidence,
    }) as Explanation;
  const heartbeatAgeMs = stage.heartbeatAt ? now - stage.heartbeatAt.getTime() : null;
  const served = {
    workersServingClass: ev.workersRecent,
    lastWorkerSeenAt: iso(ev.workerLastSeen),
    lastClassHeartbeatAt: iso(ev.classLastHeartbeat),
  };
  const servedText = `${ev.workersRecent} worker(s) of class ${stage.toolClass} seen in the last ${secs(WORKER_SEEN_WITHIN_MS)}`;

  if (stage.state === 'running' && stage.leaseUntil) {
    const remaining = stage.leaseUntil.getTime() - now;
    if (remaining >= 0) {
      return make(
        'running_healthy',
        `${name} is running: attempt ${stage.attempt} of ${stage.maxAttempts} held by ${stage.ownerId ?? 'unknown'}, ` +
          `lease ${secs(remaining)} left, last heartbeat ${heartbeatAgeMs === null ? 'never' : `${secs(heartbeatAgeMs)} ago`}`,
        {
          owner: stage.ownerId,
          fence: stage.fence,
          leaseUntil: stage.leaseUntil.toISOString(),
          leaseRemainingMs: remaining,
          heartbeatAt: iso(stage.heartbeatAt),
          heartbeatAgeMs,
          heartbeatIntervalMs: cls?.heartbeatMs ?? null,
          claimedAt: iso(stage.claimedAt),
          runningForMs: stage.claimedAt ? now - stage.claimedAt.getTime() : null,
        },
      );
    }
    return make(
      'stuck',
      `${name} is stuck: the lease of ${stage.ownerId ?? 'unknown'} expired ${secs(-remaining)} ago and no worker has reclaimed it; ${servedText}`,
      {
        owner: stage.ownerId,
        fence: stage.fence,
        leaseUntil: stage.leaseUntil.toISOString(),
        expiredForMs: -remaining,
        heartbeatAt: iso(stage.heartbeatAt),
        heartbeatAgeMs,
        ...served,
      },
    );
  }

  // queued
  const dueIn = stage.availableAt.getTime() - now;
  if (dueIn > 0) {
    return make(
      'queued_retry_delayed',
      `${name} waits for its retry until ${stage.availableAt.toISOString()} (in ${secs(dueIn)}), ` +
        `after ${stage.attempt} of ${stage.maxAttempts} attempt(s); last error ${errorText(stage.error)}`,
      {
        availableAt: stage.availableAt.toISOString(),
        dueInMs: dueIn,
        attemptsUsed: stage.attempt,
        lastError: stage.error,
      },
    );
  }
  if (cls?.concurrency != null && ev.liveLeases >= cls.concurrency) {
    return make(
      'queued_concurrency_limit',
      `${name} waits: class ${stage.toolClass} is at its concurrency limit (${ev.liveLeases} of ${cls.concurrency} leases live)`,
      {
        toolClass: stage.toolClass,
        liveLeases: ev.liveLeases,
        limit: cls.concurrency,
      },
    );
  }
  if (ev.concurrencyKey !== null && ev.concurrencyLimit !== null && ev.keyLiveLeases >= ev.concurrencyLimit) {
    return make(
      'queued_key_limit',
      `${name} waits: concurrency key "${ev.concurrencyKey}" is at its limit (${ev.keyLiveLeases} of ${ev.concurrencyLimit} live)`,
      {
        concurrencyKey: ev.concurrencyKey,
        liveLeases: ev.keyLiveLeases,
        limit: ev.concurrencyLimit,
      },
    );
  }
  if (cls?.rateLimit && ev.rateClaims >= cls.rateLimit.max) {
    const next = ev.rateOldest ? new Date(ev.rateOldest.getTime() + cls.rateLimit.perMs) : null;
    return make(
      'queued_rate_limited',
      `${name} waits: class ${stage.toolClass} reached its rate limit (${ev.rateClaims} of ${cls.rateLimit.max} starts ` +
        `in the last ${secs(cls.rateLimit.perMs)}); the next slot opens at ${next?.toISOString() ?? 'once the window moves'}`,
      {
        toolClass: stage.toolClass,
        claimsInWindow: ev.rateClaims,
        max: cls.rateLimit.max,
        windowMs: cls.rateLimit.perMs,
        nextSlotAt: iso(next),
      },
    );
  }
  const queuedForMs = Math.max(0, now - stage.availableAt.getTime());
  const heartbeatRecently = ev.classLastHeartbeat !== null && now - ev.classLastHeartbeat.getTime() <= WORKER_SEEN_WITHIN_MS;
  if (ev.workersRecent === 0 && !heartbeatRecently) {
    return make(
      'queued_no_worker',
      `${name} waits: no worker has served class ${stage.toolClass} in the last ${secs(WORKER_SEEN_WITHIN_MS)} ` +
        `(last seen ${ev.workerLastSeen?.toISOString() ?? 'never'}); start one that serves it`,
      {
        toolClass: stage.toolClass,
        seenWithinMs: WORKER_SEEN_WITHIN_MS,
        queuedForMs,
        ...served,
      },
    );
  }
  if (ev.workersRecent > 0 && ev.workersWithDefinition === 0) {
    const version = ev.version === null ? '' : ` (version ${ev.version})`;
    return make(
      'queued_no_worker_for_version',
      `${name} waits: ${servedText}, but none has loaded the definition this run started ` +
        `with, ${run.workflow}${version} ${ev.definitionHash}; a worker leaves a stage of a definition it lacks (no attempt spent): ` +
        'start one that loads it',
      {
        toolClass: stage.toolClass,
        workflow: run.workflow,
        definitionHash: ev.definitionHash,
        version: ev.version,
        workersWithDefinition: 0,
        seenWithinMs: WORKER_SEEN_WITHIN_MS,
        queuedForMs,
        ...served,
      },
    );
  }
  if (ev.backlogAhead > 0) {
    return make(
      'queued_backlog',
      `${name} waits behind ${ev.backlogAhead} due stage(s) of class ${stage.toolClass} ` +
        `(${ev.liveLeases} lease(s) live; ${servedText})`,
      {
        toolClass: stage.toolClass,
        ahead: ev.backlogAhead,
        liveLeases: ev.liveLeases,
        queuedForMs,
        ...served,
      },
    );
  }
  return make(
    'queued_ready',
    `${name} is due and first in line for class ${stage.toolClass}, queued for ${secs(queuedForMs)}: ` +
      `a worker takes it when it has a free slot (${ev.liveLeases} lease(s) live; ${servedText})`,
    {
      toolClass: stage.toolClass,
      liveLeases: ev.liveLeases,
      queuedForMs,
      ...served,
    },
  );
}

/** What a waiting stage waits for, read by explain: its child run (with the child's own verdict), or its map's items. */
export type WaitingEvidence =
  | { kind: 'child'; childRunId: string; workflow: string; childState: RunRow['state']; childVerdict: Verdict; childSummary: string }
  | { kind: 'items'; states: readonly string[]; maxParallel: number | null };

/**
 * The verdict about a run whose telling stage holds no lease while it waits (state `waiting`):
 * a child-run stage (`waiting_for_child`, with the child's own verdict, so "the parent waits
 * because its child has no worker" reads in one line) or a map stage (`waiting_for_items`,
 * counting its items by state).
 */
export function classifyWaiting(run: RunRow, stage: StageRow, ev: WaitingEvidence, now: Date): Explanation {
  const base = explanationBase(run, stage, now);
  const name = `stage ${stage.seq} (${stage.name})`;
  if (ev.kind === 'child') {
    return {
      verdict: 'waiting_for_child',
      ...base,
      summary: `${name} waits for its child run ${ev.childRunId} (${ev.workflow}), which is ${ev.childState}: ${ev.childSummary}`,
      evidence: {
        childRunId: ev.childRunId,
        workflow: ev.workflow,
        childState: ev.childState,
        childVerdict: ev.childVerdict,
        childSummary: ev.childSummary,
      },
    };
  }
  const count = (...states: string[]) => ev.states.filter((s) => states.includes(s)).length;
  const open = count('pending', 'queued', 'running');
  const bound = ev.maxParallel === null ? '' : ` (at most ${ev.maxParallel} at once)`;
  return {
    verdict: 'waiting_for_items',
    ...base,
    summary: `${name} waits for ${open} of its ${ev.states.length} map items${bound}: ${count('running')} running, ${count('succeeded')} succeeded, ${count('failed')} failed`,
    evidence: {
      items: ev.states.length,
      open,
      running: count('running'),
      succeeded: count('succeeded'),
      failed: count('failed'),
      maxParallel: ev.maxParallel,
    },
  };
}

/** The verdict about a finished run: its state, when, and its error. */
export function classifyTerminal(run: RunRow, now: Date): Explanation {
  const failed = run.stages.find((s) => s.state === 'failed') ?? null;
  const stage = failed
    ? {
        id: failed.id,
        seq: failed.seq,
        name: failed.name,
        tool: failed.tool,
        toolClass: failed.toolClass,
        state: failed.state,
        attempt: failed.attempt,
        maxAttempts: failed.maxAttempts,
      }
    : null;
  const when = run.finishedAt ? ` at ${run.finishedAt.toISOString()}` : '';
  const summary =
    run.state === 'succeeded'
      ? `the run succeeded${when}`
      : `the run ${run.state}${when}${failed ? ` in stage ${failed.seq} (${failed.name})` : ''}: ${errorText(run.error)}` +
        (run.state === 'failed'
          ? ' (a failed run can be retried from its failed stages)'
          : run.state === 'expired' || run.state === 'cancelled'
            ? ' (submit a new run to try again)'
            : '');
  return {
    verdict: 'terminal',
    runId: run.id,
    runState: run.state,
    summary,
    stage,
    deadline: iso(run.deadline),
    deadlinePassed: false,
    checkedAt: now.toISOString(),
    evidence: { state: run.state, finishedAt: iso(run.finishedAt), error: run.error, result: run.result !== null },
  };
}

export function classifyUnknown(id: string, now: Date): Explanation {
  return {
    verdict: 'unknown_run',
    runId: id,
    runState: null,
    summary: `no run with id ${id}: check the id (an unknown id is evidence, not a failure)`,
    stage: null,
    deadline: null,
    deadlinePassed: false,
    checkedAt: now.toISOString(),
    evidence: {},
  };
}

export function classifyNoActiveStage(run: RunRow, now: Date): Explanation {
  return {
    verdict: 'no_active_stage',
    runId: run.id,
    runState: run.state,
    summary: `the run is ${run.state} but none of its stages is queued or running (${run.stages.map((s) => `${s.seq}:${s.state}`).join(', ')})`,
    stage: null,
    deadline: iso(run.deadline),
    deadlinePassed: run.deadline !== null && run.deadline.getTime() <= now.getTime(),
    checkedAt: now.toISOString(),
    evidence: { stageStates: run.stages.map((s) => s.state) },
  };
}
