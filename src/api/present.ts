import type { CancelResult, EventRow, RetryResult, RunRow, RunSummaryRow } from '../store/index.js';
import type { CancelResponse, RetryResponse, RunJson, RunSummaryJson } from './schemas.js';

/** Engine rows -> the API's JSON shapes (src/api/schemas.ts): one mapping for the server and the CLI. */
const iso = (d: Date | null): string | null => (d ? d.toISOString() : null);

export function runToJson(r: RunRow): RunJson {
  return {
    id: r.id,
    workflow: r.workflow,
    state: r.state,
    result: r.result,
    error: r.error,
    deadline: iso(r.deadline),
    priority: r.priority,
    createdAt: r.createdAt.toISOString(),
    updatedAt: r.updatedAt.toISOString(),
    finishedAt: iso(r.finishedAt),
    stages: r.stages.map((s) => ({
      id: s.id,
      seq: s.seq,
      name: s.name,
      tool: s.tool,
      toolClass: s.toolClass,
      state: s.state,
      attempt: s.attempt,
      maxAttempts: s.maxAttempts,
      fence: s.fence,
      leaseUntil: iso(s.leaseUntil),
      heartbeatAt: iso(s.heartbeatAt),
      availableAt: s.availableAt.toISOString(),
      lastError: s.error,
      idempotencyKey: s.idempotencyKey,
      effectKey: s.effectKey,
      deps: s.deps ?? [],
      ...(s.groupSeq != null ? { itemIndex: s.itemIndex ?? null, groupSeq: s.groupSeq } : {}),
    })),
    parentRunId: r.parentRunId ?? null,
    children: (r.children ?? []).map((c) => ({
      id: c.id,
      workflow: c.workflow,
      state: c.state,
      parentStageId: c.parentStageId,
      createdAt: c.createdAt.toISOString(),
      finishedAt: iso(c.finishedAt),
    })),
  };
}

export function runSummaryToJson(r: RunSummaryRow): RunSummaryJson {
  return {
    id: r.id,
    workflow: r.workflow,
    state: r.state,
    error: r.error,
    deadline: iso(r.deadline),
    createdAt: r.createdAt.toISOString(),
    updatedAt: r.updatedAt.toISOString(),
    finishedAt: iso(r.finishedAt),
  };
}

export function eventToJson(e: EventRow) {
  return {
    id: e.id,
    runId: e.runId,
    stageId: e.stageId,
    type: e.type,
    fence: e.fence,
    attempt: e.attempt,
    at: e.at.toISOString(),
    data: e.data,
  };
}

export const CANCEL_NOTE_IN_FLIGHT =
  'the stages that were running are told at their next heartbeat (their signal aborts with reason cancelled) ' +
  'and nothing after them is claimed; a request such a stage already sent cannot be recalled: check the receiving system ' +
  "(the stage's Idempotency-Key and fence identify it)";

export function cancelToJson(id: string, r: CancelResult): CancelResponse {
  const note = !r.cancelled
    ? 'the run was already cancelled: nothing changed'
    : r.runningStageIds.length > 0
      ? `cancelled; ${CANCEL_NOTE_IN_FLIGHT}`
      : 'cancelled before any of its stages was running: nothing was in flight';
  return { id, state: 'cancelled', cancelled: r.cancelled, previousState: r.previousState, runningStageIds: r.runningStageIds, note };
}

export function retryToJson(id: string, r: RetryResult & { stage: NonNullable<RetryResult['stage']> }): RetryResponse {
  return {
    id,
    state: 'running',
    previousState: r.previousState,
    stage: r.stage,
    retriedStageIds: r.retriedStageIds,
    note:
      `the same run goes on from stage ${r.stage.seq} (${r.stage.name})` +
      (r.retriedStageIds.length > 1 ? ` and ${r.retriedStageIds.length - 1} more failed stage(s)` : '') +
      ' with a fresh attempt budget; its earlier attempts stay in its events (a run_retried event marks the retry)',
  };
}
