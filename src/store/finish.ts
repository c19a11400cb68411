import { z } from 'zod';
import { InvalidInputError } from '../errors.js';
import { canTransition } from '../planner/states.js';
import type { Queryable, Row } from './db.js';
import { FINISH_LIGHT_SQL } from './finish-light.sql.js';
import { FINISH_SQL } from './finish.sql.js';
import { cancelFailedLeftovers } from './leftovers.js';
import { checkJson } from './json.js';
import { monotonicNow, toClaimed, type ClaimedStage } from './lease.js';
import { delayMsSchema, parseInput } from './validate.js';

const json = z.unknown();
const finishRow = z
  .object({
    stageId: z.string().regex(/^\d{1,19}$/),
    fence: z.string().regex(/^\d{1,19}$/),
    outcome: z.enum(['succeeded', 'failed', 'queued', 'cancelled', 'skipped', 'waiting']),
    result: json.optional(),
    error: json.optional(),
    retryDelayMs: delayMsSchema.optional(),
    /** A failure for good kept as a value (`{ ok: false, error }` for later steps): it counts as done for the join. */
    asValue: z.boolean().optional(),
    /** With outcome `waiting`: how many finishes (a map's items) it waits for; its counter. */
    waitFor: z.number().int().min(1).optional(),
    /**
     * The next stage (the linear successor), queued with its input; or, with `error`, failed because its input could not
     * be computed (only with the run failed: a retry of the run starts from it).
     */
    next: z
      .object({ seq: z.number().int().min(1), input: json, error: json.optional() })
      .strict()
      .optional(),
    /** The fast path: claim the next stage for this owner in the same statement (a keyed one is queued instead). */
    claimNext: z.boolean().optional(),
    /** Queue the next stage with the input it already holds (an agent's planned tool call). */
    nextKeepInput: z.boolean().optional(),
    /** Stages decided now (an agent's answer, a map's items), inserted with this finish, each with its place in the run graph. */
    plan: z
      .array(
        z
          .object({
            seq: z.number().int().min(1),
            name: z.string().min(1).max(200),
            tool: z.string().min(1).max(200),
            toolClass: z.string().min(1).max(200),
            state: z.enum(['queued', 'pending']),
            leaseMs: z.number().int().positive(),
            timeoutMs: z.number().int().positive(),
            maxDurationMs: z.number().int().positive(),
            maxAttempts: z.number().int().min(1),
            input: json,
            concurrencyKey: z.string().optional(),
            concurrencyLimit: z.number().int().min(1).optional(),
            step: z.string().min(1).max(200).optional(),
            idempotencyKey: z.string().min(1).max(500).optional(),
            deps: z.array(z.number().int().min(1)).optional(),
            nextSeqs: z.array(z.number().int().min(1)).optional(),
            depsLeft: z.number().int().min(0).optional(),
            itemIndex: z.number().int().min(0).optional(),
            groupSeq: z.number().int().min(1).optional(),
            continueOnError: z.boolean().optional(),
            sink: z.enum(['only', 'one_of']).nullable().optional(),
          })
          .strict(),
      )
      .min(1)
      .max(1_000_000)
      .optional(),
    run: z
      .object({ state: z.enum(['succeeded', 'failed', 'cancelled']), result: json.optional(), error: json.optional() })
      .strict()
      .optional(),
    /**
     * With outcome `waiting`: a child run started by this stage (keyed by it: a second start inserts
     * nothing), with its planned stages (stageRows in runs.ts); its end queues this stage again.
     */
    child: z
      .object({
        id: z.uuid(),
        workflow: z.string().min(1).max(200),
        definitionHash: z.string().min(1).max(200),
        input: json,
        sinksLeft: z.number().int().min(1).nullable(),
        /** The child workflow's own deadline, from the child's start (null or absent: none; its parent's end cancels it anyway). */
        deadlineMs: delayMsSchema.nullable().optional(),
        stages: z.array(z.record(z.string(), json)).min(1).max(10_000),
      })
      .strict()
      .optional(),
    /** The key the tool derived for its effect (`tool.idempotencyKey(input)`), kept on the stage. */
    effectKey: z
      .string()
      .min(1)
      .max(500)
      .regex(/^[^\u0000]*$/, 'must not contain \\u0000')
      .optional(),
    /** Extra event data (ids, hashes, durations; never payloads). */
    data: z.record(z.string(), json).optional(),
  })
  .strict();
export type FinishRow = z.input<typeof finishRow>;

/*
 * A cheap pre-check of the shapes the engine builds on every stage (a success, a retry, a failure,
 * with or without `next`, `run`, `data`, `effectKey`): plain property tests instead of a zod parse
 * (5% of worker CPU, PERF-NOTES §1). It only ever ACCEPTS: a row it does not recognise entirely
 * (a plan, a child run, an unknown key, any value out of range) goes to the zod schema above,
 * which stays the one definition of the row and gives every error. So a public caller's bad row
 * gets zod's answer as before, and what this accepts zod accepts (test/store/finish-row-check.test.ts).
 */
const DECIMAL_ID = /^\d{1,19}$/;
const OUTCOMES = new Set(['succeeded', 'failed', 'queued', 'cancelled', 'skipped', 'waiting']);
// Never 'expired': a run past its deadline is expired by the expiry alone (deadline.ts), with its reasons and its waits' outcome.
const RUN_STATES = new Set(['succeeded', 'failed', 'cancelled']);
const MAX_INT31 = 2 ** 31 - 1;
const isPlain = (v: unknown): v is Record<string, unknown> => {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return false;
  const proto = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
};
const optBool = (v: unknown) => v === undefined || typeof v === 'boolean';
const optInt = (v: unknown, min: number, max = Number.MAX_SAFE_INTEGER) =>
  v === undefined || (Number.isSafeInteger(v) && (v as number) >= min && (v as number) <= max);

function plainFinishRowOk(r: unknown): r is z.output<typeof finishRow> {
  if (!isPlain(r)) return false;
  for (const key in r) {
    if (!Object.hasOwn(r, key)) return false;
    const v = r[key];
    switch (key) {
      case 'stageId':
      case 'fence':
        if (typeof v !== 'string' || !DECIMAL_ID.test(v)) return false;
        break;
      case 'outcome':
        if (typeof v !== 'string' || !OUTCOMES.has(v)) return false;
        break;
      case 'result':
      case 'error':
        break;
      case 'retryDelayMs':
        if (!optInt(v, 0, MAX_INT31)) return false;
        break;
      case 'waitFor':
        if (!optInt(v, 1)) return false;
        break;
      case 'asValue':
      case 'claimNext':
      case 'nextKeepInput':
        if (!optBool(v)) return false;
        break;
      case 'next':
        if (v === undefined) break;
        if (!isPlain(v) || !('input' in v) || !Number.isSafeInteger(v.seq) || (v.seq as number) < 1) return false;
        for (const k in v) if (k !== 'seq' && k !== 'input' && k !== 'error') return false;
        break;
      case 'run':
        if (v === undefined) break;
        if (!isPlain(v) || typeof v.state !== 'string' || !RUN_STATES.has(v.state)) return false;
        for (const k in v) if (k !== 'state' && k !== 'result' && k !== 'error') return false;
        break;
      case 'effectKey':
        if (v !== undefined && (typeof v !== 'string' || v.length < 1 || v.length > 500 || v.includes('\u0000'))) return false;
        break;
      case 'data':
        if (v !== undefined && !isPlain(v)) return false;
        break;
      default:
        return false; // plan, child (zod checks them), or a key the row does not have
    }
  }
  return typeof r.stageId === 'string' && typeof r.fence === 'string' && typeof r.outcome === 'string';
}

export interface FinishVerdict {
  stageId: string;
  accepted: boolean;
  /** Accepted by an earlier try of this same row whose answer was lost (nothing was written again). */
  replayed: boolean;
  /** The first stage this finish made ready, if any (see `woken`). */
  nextStageId: string | null;
  nextToolClass: string | null;
  /** Every stage this finish made ready (a join reached, a fan-out, a plan inserted): wake a worker of each class. */
  woken: { stageId: string; toolClass: string; definitionHash: string }[];
  currentState: string | null;
  currentFence: string | null;
  /** On the fast path (or a replay of it): the next stage, claimed by this owner, to run now. */
  nextClaimed: ClaimedStage | null;
}

const DATE_FIELDS = ['first_claimed_at', 'run_deadline'] as const;

/** For the test that checks the pre-check against the schema. */
export const finishRowCheck = { plain: plainFinishRowOk, schema: finishRow };

/**
 * A row's JSON value, or null: checked here (an error names this row alone), serialised once, with
 * its batch (finishEncoded), not twice.
 */
function jsonOrNull(v: unknown, path: string, field: string): unknown {
  if (v === undefined || v === null) return null;
  checkJson(v, path, field);
  return v;
}

/** Serialises one finish row; throws InvalidInputError for that row alone. */
export function encodeFinishRow(input: FinishRow, path = 'finish'): Record<string, unknown> {
  const row = plainFinishRowOk(input) ? input : parseInput(finishRow, input, path);
  if (!canTransition('stage', 'running', row.outcome))
    throw new InvalidInputError(`outcome ${row.outcome} is not a legal end of a running stage`, `${path}.outcome`);
  if (row.outcome === 'queued' && row.retryDelayMs === undefined)
    throw new InvalidInputError('a retry needs retryDelayMs', `${path}.retryDelayMs`);
  if (row.next?.error !== undefined && row.run?.state !== 'failed') {
    throw new InvalidInputError('a next stage fails only with its run (run.state failed)', `${path}.next.error`);
  }
  if ((row.outcome === 'waiting') !== (row.waitFor !== undefined))
    throw new InvalidInputError('outcome waiting goes with waitFor (and only it)', `${path}.waitFor`);
  if (row.child && row.outcome !== 'waiting') throw new InvalidInputError('a child run is started by a waiting stage', `${path}.child`);
  if (row.asValue && row.outcome !== 'failed') throw new InvalidInputError('asValue is for a failure', `${path}.asValue`);
  if (row.asValue && row.run) throw new InvalidInputError('a failure kept as a value does not end the run', `${path}.run`);
  if (row.run && row.next && row.next.error === undefined) {
    throw new InvalidInputError('a finish cannot both queue a next stage and end the run', `${path}.run`);
  }
  // Only the keys with a value: jsonb_to_recordset reads a missing key as NULL, as it reads a JSON
  // null, and the statement takes a NULL asValue or claimNext as false (coalesce). A success with
  // its next stage is 7 keys of JSON instead of 19, for the batch's JSON.stringify here and the
  // statement's jsonb parse.
  const out: Record<string, unknown> = { id: row.stageId, fence: row.fence, outcome: row.outcome };
  const result = jsonOrNull(row.result, path, '.result');
  if (result !== null) out.result = result;
  const error = jsonOrNull(row.error, path, '.error');
  if (error !== null) out.error = error;
  if (row.retryDelayMs !== undefined) out.retryDelayMs = row.retryDelayMs;
  if (row.asValue) out.asValue = true;
  if (row.waitFor !== undefined) out.waitFor = row.waitFor;
  const next = row.next;
  if (next) {
    out.nextSeq = next.seq;
    if (next.error === undefined) {
      if (!row.nextKeepInput) {
        const nextInput = jsonOrNull(next.input, path, '.next.input');
        if (nextInput !== null) out.nextInput = nextInput;
      }
      if (row.claimNext) out.claimNext = true;
    } else {
      const nextError = jsonOrNull(next.error, path, '.next.error');
      if (nextError !== null) out.nextError = nextError;
    }
  }
  if (row.plan) out.plan = row.plan.map((p, i) => ({ ...p, input: jsonOrNull(p.input, path, `.plan[${i}].input`) }));
  const run = row.run;
  if (run) {
    out.runState = run.state;
    const runResult = jsonOrNull(run.result, path, '.run.result');
    if (runResult !== null) out.runResult = runResult;
    const runError = jsonOrNull(run.error, path, '.run.error');
    if (runError !== null) out.runError = runError;
  }
  if (row.child) out.child = { ...row.child, input: jsonOrNull(row.child.input, path, '.child.input') };
  if (row.effectKey !== undefined) out.effectKey = row.effectKey;
  const data = jsonOrNull(row.data, path, '.data');
  if (data !== null) out.data = data;
  return out;
}

/** The rows in stage id order, as the batch has always been sent: each id parsed once, not twice per comparison. */
function byStageId(rows: Record<string, unknown>[]): Record<string, unknown>[] {
  const keyed = rows.map((r) => ({ id: BigInt(r.id as string), r }));
  keyed.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  return keyed.map((k) => k.r);
}

/**
 * Finishes attempts of one owner in one statement, each row fenced on its own, each with its
 * dispatcher decision. Rows must already be encoded (encodeFinishRow) so one bad row cannot
 * sink a batch. A rejected row leaves a `result_rejected` event and changes nothing.
 */
export async function finishEncoded(q: Queryable, owner: string, rows: Record<string, unknown>[]): Promise<FinishVerdict[]> {
  if (rows.length === 0) return [];
  const sorted = rows.length === 1 ? rows : byStageId(rows);
  if (!lightFinishEnabled || !sorted.every(lightRow)) return finishFull(q, owner, sorted);
  // Every row looks plain: the light statement takes those the database proves plain; the rest,
  // left untouched by it, go through the full statement, which decides them as it always did.
  const sentAt = monotonicNow();
  const light = await q.query(FINISH_LIGHT_SQL, [owner, JSON.stringify(sorted), sorted.map((r) => r.id as string)], 'ratchet_finish_light');
  const taken = new Set<string>();
  const verdicts: FinishVerdict[] = [];
  for (const r of light) {
    if (!r.taken) continue;
    taken.add(r.id as string);
    // What FINISH_SQL answers for an accepted success (the light statement takes nothing else); the row is this answer's own.
    r.accepted = true;
    r.replayed = false;
    r.current_state = 'succeeded';
    verdicts.push(verdictOf(r, sentAt));
  }
  if (taken.size === sorted.length) return verdicts;
  let rest: FinishVerdict[];
  try {
    rest = await finishFull(
      q,
      owner,
      sorted.filter((r) => !taken.has(r.id as string)),
    );
  } catch (err) {
    // The light statement committed its rows: their verdicts (a handed next stage included) stand; only the rest is unknown.
    throw verdicts.length > 0 ? new FinishPartlyCommitted(verdicts, err) : err;
  }
  // In stage id order, as one statement answers.
  const byId = new Map([...verdicts, ...rest].map((v) => [v.stageId, v]));
  return sorted.map((r) => byId.get(r.id as string)).filter((v): v is FinishVerdict => v !== undefined);
}

/**
 * A batch split between the light and the full statement whose full statement failed after the
 * light one committed: `committed` are the light rows' verdicts (final, each may hand a next
 * stage to this worker), every other row's outcome is unknown (`cause`). finishEncoded throws it
 * so that a caller answers the committed rows and only the rest get the error.
 */
export class FinishPartlyCommitted extends Error {
  /** The cause's code (a SQLSTATE, ECONNRESET...), so that classifyDbError reads this error as it reads its cause. */
  readonly code: unknown;
  constructor(
    readonly committed: FinishVerdict[],
    override readonly cause: unknown,
  ) {
    super(`finish: ${committed.length} rows committed, the rest unknown: ${cause instanceof Error ? cause.message : String(cause)}`);
    this.code = (cause as { code?: unknown } | null)?.code;
  }
}

/**
 * Whether a row may go to the light statement (FINISH_LIGHT_SQL, finish-light.sql.ts): a success
 * with nothing but its result, its next stage (input, fast-path claim) or an explicit successful run
 * end without a next stage, its effect key and event data. The statement proves the rest (fence,
 * sink, run, no other row of its run) and leaves whatever it cannot prove to the full one.
 */
function lightRow(r: Record<string, unknown>): boolean {
  if (r.outcome !== 'succeeded') return false;
  for (const k in r) if (!LIGHT_KEYS.has(k)) return false;
  return r.runState === undefined || (r.runState === 'succeeded' && r.nextSeq === undefined);
}
const LIGHT_KEYS = new Set([
  'id',
  'fence',
  'outcome',
  'result',
  'error',
  'nextSeq',
  'nextInput',
  'claimNext',
  'runState',
  'runResult',
  'runError',
  'effectKey',
  'data',
]);

/** RATCHET_FINISH_LIGHT=0 sends every batch through the full statement (for A/B measurements and tests). */
let lightFinishEnabled = process.env.RATCHET_FINISH_LIGHT !== '0';
/** For tests: the light statement on or off (returns the previous setting). */
export function setLightFinish(on: boolean): boolean {
  const was = lightFinishEnabled;
  lightFinishEnabled = on;
  return was;
}

/** Every row through FINISH_SQL (finish.sql.ts), in stage id order. */
async function finishFull(q: Queryable, owner: string, sorted: Record<string, unknown>[]): Promise<FinishVerdict[]> {
  const sentAt = monotonicNow();
  const out = await q.query(FINISH_SQL, [owner, JSON.stringify(sorted), sorted.map((r) => r.id as string)], 'ratchet_finish');
  // A group failure: what a concurrent finish inserted into the failed run meanwhile is cancelled by a statement of its own.
  const failing = sorted.filter((r) => r.runState === 'failed' && out.some((o) => o.id === r.id && o.accepted && !o.replayed));
  if (failing.length > 0)
    await cancelFailedLeftovers(
      q,
      failing.map((r) => r.id as string),
    );
  return out.map((r) => verdictOf(r, sentAt));
}

/** A finish statement's answer row as the verdict its caller gets (both statements answer in these columns). */
function verdictOf(r: Row, sentAt: number): FinishVerdict {
  const woken = (r.woken as FinishVerdict['woken'] | null) ?? [];
  return {
    stageId: r.id as string,
    accepted: r.accepted as boolean,
    replayed: r.replayed as boolean,
    nextStageId: woken[0]?.stageId ?? null,
    nextToolClass: woken[0]?.toolClass ?? null,
    woken,
    currentState: (r.current_state as string | null) ?? null,
    currentFence: (r.current_fence as string | null) ?? null,
    nextClaimed: r.next_claimed ? toClaimed(handedStage(r.next_claimed as Row, r.db_now as Date), sentAt) : null,
  };
}

/**
 * The claim row of a next stage handed over by the finish (FINISH_SQL's `handed`): the columns the
 * statement leaves out are the same for every such stage (a first claim by this owner now), so they
 * are filled in here; to_jsonb() turned the timestamps into strings, back to Dates. The row is this
 * answer's own (parsed from its jsonb for this call): completed in place, not copied (a spread of
 * the parsed row plus these keys cost ~15 µs per stage, PERF-NOTES §7).
 */
function handedStage(row: Row, dbNow: Date): Row {
  row.state = 'running';
  row.prev_state = 'queued';
  row.prev_fence = null;
  row.db_now = dbNow;
  row.claimed_at = new Date(dbNow.getTime()); // its own Date: no two fields share one
  row.lease_until = new Date(dbNow.getTime() + (row.lease_ms as number));
  for (const f of DATE_FIELDS) if (typeof row[f] === 'string') row[f] = new Date(row[f] as string);
  return row;
}

/** Validates and finishes; throws InvalidInputError (nothing written) when any row is bad. */
export async function finish(q: Queryable, owner: string, rows: FinishRow[]): Promise<FinishVerdict[]> {
  parseInput(z.string().min(1).max(200), owner, 'finish.owner');
  const encoded = rows.map((r, i) => encodeFinishRow(r, `finish[${i}]`));
  return finishEncoded(q, owner, encoded);
}
