import { createHash } from 'node:crypto';
import { v7 as uuidv7 } from 'uuid';
import { z } from 'zod';
import { IllegalTransitionError, InvalidInputError, RatchetError, UnknownStageError } from '../errors.js';
import { sourcesOf, type RunState, type StageState, STAGE_STATES } from '../planner/states.js';
import type { Db, Queryable } from './db.js';
import { prioritySchema } from '../definitions/priority.js';
import { toJsonText } from './json.js';
import { parseInput } from './validate.js';
import {
  CANCEL_RUN_SQL,
  GET_RUN_BY_KEY_SQL,
  GET_RUN_SQL,
  GET_STAGES_SQL,
  GET_CHILDREN_SQL,
  GET_CHILD_RUN_SQL,
  GRAPH_STAGES_SQL,
  INSERT_RUN_SQL,
  INSERT_STAGES_SQL,
  LIST_EVENTS_SQL,
  TRANSITION_STAGE_SQL,
} from './runs.sql.js';
import { sweepEnded } from './deadline.js';
import { ROW_HOLDING_IDLE_LIMIT_MS } from './transaction-on.js';
import { transactionAgain } from './db-errors.js';

const positiveMs = z
  .number()
  .int()
  .positive()
  .max(2 ** 31 - 1);
const name = z
  .string()
  .min(1)
  .max(200)
  .regex(/^[^\u0000]*$/, 'must not contain \\u0000');

export const stageSpecSchema = z
  .object({
    name,
    tool: name,
    toolClass: name,
    leaseMs: positiveMs,
    timeoutMs: positiveMs,
    maxDurationMs: positiveMs,
    maxAttempts: z.number().int().min(1).max(1000),
    idempotencyKey: z.string().min(1).max(500).optional(),
    /** No more than concurrencyLimit stages with this key hold a live lease at once. */
    concurrencyKey: z
      .string()
      .min(1)
      .max(500)
      .regex(/^[^\u0000]*$/, 'must not contain \\u0000')
      .optional(),
    concurrencyLimit: z.number().int().min(1).max(100_000).optional(),
    input: z.unknown().optional(),
    /**
     * The run graph (issue 11): the seqs (1-based positions) this stage waits for and those that wait
     * for it. Given on every stage or none: without them the stages form a chain (each waits for the one before).
     */
    deps: z.array(z.number().int().min(1)).optional(),
    nextSeqs: z.array(z.number().int().min(1)).optional(),
    step: name.optional(),
    continueOnError: z.boolean().optional(),
    /** How a sink's value enters the run's result (with the run's sinksLeft). */
    sink: z.enum(['only', 'one_of']).nullable().optional(),
  })
  .strict()
  .refine((s) => (s.concurrencyKey === undefined) === (s.concurrencyLimit === undefined), {
    message: 'concurrencyKey and concurrencyLimit go together',
    path: ['concurrencyKey'],
  });
export type StageSpec = z.input<typeof stageSpecSchema>;

const createRunSchema = z
  .object({
    id: z.uuid().optional(),
    /** The W3C traceparent of the run's span (src/observability/tracing.ts), when one was recorded. */
    traceparent: z
      .string()
      .regex(/^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/)
      .optional(),
    workflow: name,
    definitionHash: z.string().min(1).max(200),
    input: z.unknown(),
    idempotencyKey: z
      .string()
      .min(1)
      .max(500)
      .regex(/^[^\u0000]*$/, 'must not contain \\u0000')
      .optional(),
    /** An absolute deadline; or `deadlineInMs`, a duration from the database's now. */
    deadline: z.date().optional(),
    /** The deadline as the submitter gave it (an ISO date-time, a duration, ms): part of the idempotency hash. */
    requestedDeadline: z.union([z.string().max(100), z.number()]).optional(),
    /** The workflow version the submitter asked for, if any: part of the idempotency hash. */
    requestedVersion: z.number().int().min(1).optional(),
    deadlineInMs: z
      .number()
      .int()
      .min(0)
      .max(2 ** 31 - 1)
      .optional(),
    /** Higher is claimed first within a tool class (PRIORITY_RANGE); default 0. */
    priority: prioritySchema.optional(),
    stages: z.array(stageSpecSchema).min(1).max(10_000),
    /** Sinks the run waits for before it succeeds (a static workflow's graph); absent: the run ends explicitly (agents). */
    sinksLeft: z.number().int().min(1).optional(),
  })
  .strict()
  .refine((r) => r.stages.every((s) => s.deps === undefined) || r.stages.every((s) => s.deps !== undefined && s.nextSeqs !== undefined), {
    message: 'give deps and nextSeqs on every stage or on none',
    path: ['stages'],
  })
  .refine((r) => r.deadline === undefined || r.deadlineInMs === undefined, {
    message: 'give deadline or deadlineInMs, not both',
    path: ['deadlineInMs'],
  });
export type CreateRunInput = z.input<typeof createRunSchema>;

export class IdempotencyConflictError extends RatchetError {
  constructor(
    readonly idempotencyKey: string,
    readonly runId: string,
  ) {
    super('invalid_input', `idempotency key ${idempotencyKey} was used for run ${runId} with another request`, {
      idempotencyKey,
      runId,
      reason: 'idempotency_conflict',
    });
  }
}

export interface CreatedRun {
  id: string;
  state: RunState;
  created: boolean;
  stageIds: string[];
  /** The stages queued at once (those that wait for nothing), to wake a worker of each class. */
  queued: { stageId: string; toolClass: string }[];
}

/**
 * Hash of what was submitted under an idempotency key, so another request under it is told
 * apart: the workflow, the input and, when given, the deadline as the submitter gave it (not
 * the instant it resolved to, so a repeated "10m" is the same request), and the version when one
 * was asked for. Without a deadline or version the hash is what it was before they counted, so
 * runs made then still match.
 */
export function requestHash(
  workflow: string,
  input: unknown,
  requestedDeadline?: string | number,
  requestedVersion?: number,
  priority?: number,
): string {
  const h = createHash('sha256').update(workflow).update('\u0000').update(toJsonText(input));
  if (requestedDeadline !== undefined) h.update('\u0000deadline\u0000').update(JSON.stringify(requestedDeadline));
  if (requestedVersion !== undefined) h.update('\u0000version\u0000').update(String(requestedVersion));
  if (priority !== undefined && priority !== 0) h.update('\u0000priority\u0000').update(String(priority));
  return h.digest('hex');
}

/**
 * A run's planned stages as rows (seq = position): with the run graph's deps and nextSeqs as
 * given, or, without them, a chain (each waits for the one before). Stages that wait for nothing
 * are queued; a chain's first stage gets the run's input unless it has its own.
 */
export function stageRows(specs: z.output<typeof stageSpecSchema>[], runInput: unknown, path = 'createRun') {
  const graph = specs[0]!.deps !== undefined;
  const n = specs.length;
  const stages = specs.map((s, i) => ({
    seq: i + 1,
    name: s.name,
    step: s.step ?? null,
    tool: s.tool,
    toolClass: s.toolClass,
    state: (graph ? s.deps!.length === 0 : i === 0) ? 'queued' : 'pending',
    deps: graph ? s.deps! : i === 0 ? [] : [i],
    nextSeqs: graph ? s.nextSeqs! : i === n - 1 ? [] : [i + 2],
    depsLeft: graph ? s.deps!.length : i === 0 ? 0 : 1,
    continueOnError: s.continueOnError ?? false,
    sink: s.sink ?? null,
    leaseMs: s.leaseMs,
    timeoutMs: s.timeoutMs,
    maxDurationMs: s.maxDurationMs,
    maxAttempts: s.maxAttempts,
    idempotencyKey: s.idempotencyKey,
    concurrencyKey: s.concurrencyKey ?? null,
    concurrencyLimit: s.concurrencyLimit ?? null,
    input: graph ? (s.input ?? null) : i === 0 ? (s.input === undefined ? runInput : s.input) : (s.input ?? null),
  }));
  for (const [i, s] of stages.entries()) {
    for (const [j, d] of [...s.deps, ...s.nextSeqs].entries())
      if (d > n || d === s.seq)
        throw new InvalidInputError(`stage ${s.seq} names stage ${d}, which this run does not have`, `${path}.stages[${i}].deps[${j}]`);
  }
  return stages;
}

/**
 * Persists a run and all its planned stages in one transaction (the planner's output):
 * the first stage queued with its input, the rest pending. Validates everything first, so
 * bad input writes nothing. A repeated submit idempotency key returns the existing run
 * (same body) or throws IdempotencyConflictError (another body).
 */
export async function createRun(db: Db, input: CreateRunInput): Promise<CreatedRun> {
  const run = parseInput(createRunSchema, input, 'createRun');
  const inputText = toJsonText(run.input, 'createRun.input');
  const stages = stageRows(run.stages, run.input);
  stages.forEach((s, i) => toJsonText(s.input, `createRun.stages[${i}].input`));
  const hash = requestHash(run.workflow, run.input, run.requestedDeadline, run.requestedVersion, run.priority);
  const id = run.id ?? uuidv7();
  for (const s of stages) s.idempotencyKey ??= `${id}:${s.seq}:${s.tool}`;

  return db.transaction(async (tx) => {
    const inserted = await tx.query(INSERT_RUN_SQL, [
      id,
      run.workflow,
      run.definitionHash,
      inputText,
      run.deadline ?? null,
      run.idempotencyKey ?? null,
      hash,
      run.deadlineInMs ?? null,
      run.priority ?? 0,
      run.traceparent ?? null,
      run.sinksLeft ?? null,
    ]);
    if (inserted.length === 0) {
      const [existing] = await tx.query(GET_RUN_BY_KEY_SQL, [run.idempotencyKey]);
      if (!existing) throw new InvalidInputError('run id already exists', 'createRun.id');
      if (existing.request_hash !== hash) throw new IdempotencyConflictError(run.idempotencyKey!, existing.id as string);
      return { id: existing.id as string, state: existing.state as RunState, created: false, stageIds: [], queued: [] };
    }
    const rows = await tx.query(INSERT_STAGES_SQL, [id, JSON.stringify(stages)]);
    return {
      id,
      state: 'queued',
      created: true,
      stageIds: rows.map((r) => r.id as string),
      queued: rows.filter((r) => r.state === 'queued').map((r) => ({ stageId: r.id as string, toolClass: r.tool_class as string })),
    };
  });
}

export interface StageRow {
  id: string;
  seq: number;
  name: string;
  tool: string;
  toolClass: string;
  state: StageState;
  ownerId: string | null;
  fence: string | null;
  attempt: number;
  maxAttempts: number;
  leaseUntil: Date | null;
  heartbeatAt: Date | null;
  claimedAt: Date | null;
  availableAt: Date;
  idempotencyKey: string;
  /** The key the tool derived for its effect (what a receiver saw), or null when it sent the stage's own. */
  effectKey: string | null;
  input: unknown;
  result: unknown;
  error: unknown;
  createdAt: Date;
  updatedAt: Date;
  finishedAt: Date | null;
  /** The run graph: the seqs this stage waits for; a map item's index and its map stage's seq. */
  deps?: number[];
  itemIndex?: number | null;
  groupSeq?: number | null;
}
export interface ChildRunSummary {
  id: string;
  workflow: string;
  state: RunState;
  /** The parent's stage that started it. */
  parentStageId: string | null;
  createdAt: Date;
  finishedAt: Date | null;
}
export interface RunRow {
  id: string;
  workflow: string;
  definitionHash: string;
  input: unknown;
  state: RunState;
  deadline: Date | null;
  idempotencyKey: string | null;
  result: unknown;
  error: unknown;
  createdAt: Date;
  updatedAt: Date;
  finishedAt: Date | null;
  dbNow: Date;
  stages: StageRow[];
  /** Higher is claimed first within a tool class (README "Priorities"). */
  priority: number;
  /** The run span's W3C traceparent, or null (then the trace id is derived from the run id). */
  traceparent?: string | null;
  /** A child run's parent run and the parent's stage that started it (null for a run submitted on its own). */
  parentRunId?: string | null;
  parentStageId?: string | null;
  /** The runs this run's stages started. */
  children?: ChildRunSummary[];
}

export const isUuid = (s: string) => /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(s);

/** An events row as read (ids and fences as text) to the EventRow every reader hands on. */
export function eventOfRow(e: Record<string, unknown>): EventRow {
  return {
    id: e.id as string,
    runId: e.run_id as string,
    stageId: (e.stage_id as string | null) ?? null,
    type: e.type as string,
    fence: (e.fence as string | null) ?? null,
    attempt: (e.attempt as number | null) ?? null,
    at: e.at as Date,
    data: e.data ?? null,
  };
}

/** A run with its stages, or null for an unknown id (evidence, not failure). */
export async function getRun(q: Queryable, id: string): Promise<RunRow | null> {
  if (!isUuid(id)) return null;
  const [r] = await q.query(GET_RUN_SQL, [id], 'ratchet_get_run');
  if (!r) return null;
  const stages = await q.query(GET_STAGES_SQL, [id], 'ratchet_get_stages');
  const children = await q.query(GET_CHILDREN_SQL, [id], 'ratchet_get_children');
  return {
    parentRunId: (r.parent_run_id as string | null) ?? null,
    parentStageId: (r.parent_stage_id as string | null) ?? null,
    children: children.map((c) => ({
      id: c.id as string,
      workflow: c.workflow as string,
      state: c.state as RunState,
      parentStageId: (c.parent_stage_id as string | null) ?? null,
      createdAt: c.created_at as Date,
      finishedAt: (c.finished_at as Date | null) ?? null,
    })),
    id: r.id as string,
    workflow: r.workflow as string,
    definitionHash: r.definition_hash as string,
    input: r.input,
    state: r.state as RunState,
    deadline: (r.deadline as Date | null) ?? null,
    priority: (r.priority as number | undefined) ?? 0,
    traceparent: (r.traceparent as string | null | undefined) ?? null,
    idempotencyKey: (r.idempotency_key as string | null) ?? null,
    result: r.result ?? null,
    error: r.error ?? null,
    createdAt: r.created_at as Date,
    updatedAt: r.updated_at as Date,
    finishedAt: (r.finished_at as Date | null) ?? null,
    dbNow: r.db_now as Date,
    stages: stages.map((s) => ({
      id: s.id as string,
      seq: s.seq as number,
      name: s.name as string,
      tool: s.tool as string,
      toolClass: s.tool_class as string,
      state: s.state as StageState,
      ownerId: (s.owner_id as string | null) ?? null,
      fence: (s.fence as string | null) ?? null,
      attempt: s.attempt as number,
      maxAttempts: s.max_attempts as number,
      leaseUntil: (s.lease_until as Date | null) ?? null,
      heartbeatAt: (s.heartbeat_at as Date | null) ?? null,
      claimedAt: (s.claimed_at as Date | null) ?? null,
      availableAt: s.available_at as Date,
      idempotencyKey: s.idempotency_key as string,
      effectKey: (s.effect_key as string | null) ?? null,
      input: s.input ?? null,
      result: s.result ?? null,
      error: s.error ?? null,
      createdAt: s.created_at as Date,
      updatedAt: s.updated_at as Date,
      finishedAt: (s.finished_at as Date | null) ?? null,
      deps: (s.deps as number[] | null) ?? [],
      itemIndex: (s.item_index as number | null) ?? null,
      groupSeq: (s.group_seq as number | null) ?? null,
    })),
  };
}

/** The child run stage `stageId` started, if any (what a child-run stage decides from at its claim). */
export async function childRun(
  q: Queryable,
  stageId: string,
): Promise<{ id: string; state: string; result: unknown; error: unknown } | null> {
  const [r] = await q.query(GET_CHILD_RUN_SQL, [stageId], 'ratchet_child_run');
  return r ? { id: r.id as string, state: r.state as string, result: r.result ?? null, error: r.error ?? null } : null;
}

export interface EventRow {
  id: string;
  runId: string;
  stageId: string | null;
  type: string;
  fence: string | null;
  attempt: number | null;
  at: Date;
  data: unknown;
}

export async function listEvents(q: Queryable, runId: string, opts: { after?: string; limit?: number } = {}): Promise<EventRow[]> {
  if (!isUuid(runId)) return [];
  const rows = await q.query(LIST_EVENTS_SQL, [runId, opts.after ?? '0', Math.min(opts.limit ?? 1000, 10_000)], 'ratchet_list_events');
  return rows.map(eventOfRow);
}

/**
 * Moves a stage to `to` if the state table allows it from its current state; otherwise
 * throws IllegalTransitionError (or UnknownStageError). Never a silent no-op.
 */
export async function transitionStage(q: Queryable, stageId: string, to: StageState): Promise<void> {
  if (!/^\d{1,19}$/.test(stageId)) throw new UnknownStageError(stageId);
  if (!STAGE_STATES.includes(to)) throw new InvalidInputError(`unknown stage state ${String(to)}`, 'transitionStage.to');
  const [r] = await q.query(TRANSITION_STAGE_SQL, [stageId, to, sourcesOf('stage', to)]);
  if (!r || r.previous_state === null || r.previous_state === undefined) throw new UnknownStageError(stageId);
  if (r.moved === 0) throw new IllegalTransitionError('stage', r.previous_state as string, to, stageId);
}

export interface CancelResult {
  /** false when the run was already terminal: the run is left as it was (a cancelled or expired run's leftovers are swept, cancelRun). */
  cancelled: boolean;
  previousState: RunState;
  /** Stages that were running: a request they already sent cannot be recalled. */
  runningStageIds: string[];
  /** The kinds of the open waits (issue 10) the cancel closed (`cancelled`), for the waits-ended metric. */
  waitsClosed?: string[];
}

/**
 * Cancels a run and its unfinished stages; null for an unknown id. The cancel locks the run, then its stages; a
 * claim or a finish that fails the run locks a stage, then the run: when the two meet, PostgreSQL aborts one of them
 * (a deadlock), and a cancel it aborted wrote nothing, so it is asked again: the whole transaction (transactionAgain).
 * Hence `Db`, never a transaction's client: a conflict aborts the transaction.
 */
export async function cancelRun(q: Db, runId: string): Promise<CancelResult | null> {
  if (!isUuid(runId)) return null;
  // One transaction (asked again on a deadlock, cut short when its client stalls while it holds the run's rows): the
  // cancel; the leftovers statement, which sees (a statement of its own, read committed) a plan a finish inserted
  // meanwhile into the run or a child run cancelled with it; and the child runs a finish started meanwhile
  // (cancelDescendants). When one fails, the cancel is rolled back with it: the caller sees the error and asks again,
  // and that cancel ends the run with its children and leftovers and reports what it closed.
  return transactionAgain(
    q,
    async (tx) => {
      const [r] = await tx.query(CANCEL_RUN_SQL, [runId, sourcesOf('run', 'cancelled'), sourcesOf('stage', 'cancelled')]);
      if (!r || r.previous_state === null || r.previous_state === undefined) return null;
      const runningStageIds = (r.running_stage_ids as string[] | undefined) ?? [];
      const waitsClosed = (r.waits_closed as string[] | undefined) ?? [];
      // A run already ended is swept again, its run row left as it was: its own leftovers and its children's (a run
      // cancelled before cancels were one transaction, or expired by a sweeper of that time, may still hold some).
      const ended = r.cancelled === 1 ? 'cancelled' : r.previous_state;
      if (ended === 'cancelled' || ended === 'expired') {
        const d = await sweepEnded(tx, r.cancelled === 1 ? ((r.run_ids as string[] | undefined) ?? [runId]) : [runId], ended);
        runningStageIds.push(...d.runningStageIds);
        waitsClosed.push(...d.waitsClosed);
      }
      return { cancelled: r.cancelled === 1, previousState: r.previous_state as RunState, runningStageIds, waitsClosed };
    },
    { idleLimitMs: ROW_HOLDING_IDLE_LIMIT_MS },
  );
}

/** A stage of a run as the planner decides from it (src/planner/decide.ts PersistedStage) and an agent rebuilds its conversation from. */
export interface GraphStageRow {
  seq: number;
  name: string;
  tool: string;
  state: string;
  result: unknown;
  error: unknown;
  itemIndex: number | null;
  groupSeq: number | null;
}

/** Run `runId`'s stages in seq order, with results and errors (what the planner needs at a claim). */
export async function graphStages(q: Queryable, runId: string): Promise<GraphStageRow[]> {
  const rows = await q.query(GRAPH_STAGES_SQL, [runId], 'ratchet_graph_stages');
  return rows.map((r) => ({
    seq: r.seq as number,
    name: r.name as string,
    tool: r.tool as string,
    state: r.state as string,
    result: r.result ?? null,
    error: r.error ?? null,
    itemIndex: (r.item_index as number | null) ?? null,
    groupSeq: (r.group_seq as number | null) ?? null,
  }));
}
