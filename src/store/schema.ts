import { sql } from 'drizzle-orm';
import {
  type AnyPgColumn,
  bigint,
  boolean,
  check,
  customType,
  index,
  integer,
  jsonb,
  pgSchema,
  text,
  timestamp,
  uniqueIndex,
  uuid,
} from 'drizzle-orm/pg-core';

/**
 * The persisted model. Everything lives in the `ratchet` schema so Ratchet can share a
 * database with an application. Hot statements are raw SQL in ./claim.sql.ts, ./extend.sql.ts, ./finish.sql.ts and friends;
 * this file is the single source of the tables, indexes and the fencing sequence.
 */
export const ratchet = pgSchema('ratchet');

/** Fencing tokens: one sequence, so every claim's token is greater than any earlier one. */
export const fenceSeq = ratchet.sequence('fence_seq', { startWith: 1, increment: 1, cache: 1 });

const ts = (name: string) => timestamp(name, { withTimezone: true, mode: 'date' });

/** A 64-bit transaction id (PostgreSQL 13+), read as a decimal string. */
const xid8 = customType<{ data: string; driverData: string }>({ dataType: () => 'xid8' });

export const runs = ratchet.table(
  'runs',
  {
    id: uuid('id').primaryKey(),
    workflow: text('workflow').notNull(),
    definitionHash: text('definition_hash').notNull(),
    input: jsonb('input').notNull(),
    state: text('state').notNull(),
    deadline: ts('deadline'),
    idempotencyKey: text('idempotency_key'),
    /** Hash of the submitted body, so the same key with another body is told apart. */
    requestHash: text('request_hash'),
    result: jsonb('result'),
    error: jsonb('error'),
    createdAt: ts('created_at').notNull().default(sql`now()`),
    updatedAt: ts('updated_at').notNull().default(sql`now()`),
    finishedAt: ts('finished_at'),
    /** Higher is claimed first within a tool class (claim.sql.ts); copied to every stage of the run. */
    priority: integer('priority').notNull().default(0),
    /**
     * W3C traceparent of the run's `ratchet.run` span, written at submit when a tracer recorded
     * one; every attempt span of the run is its child (src/observability/tracing.ts). Null: the
     * trace id is derived from the run id.
     */
    traceparent: text('traceparent'),
    /** The run graph (issue 11): a child run's parent run and the parent's stage that started it (one child per stage). */
    parentRunId: uuid('parent_run_id').references((): AnyPgColumn => runs.id, { onDelete: 'set null' }),
    parentStageId: bigint('parent_stage_id', { mode: 'bigint' }),
    /** Sinks (stages nothing waits for) not yet ended: the finish that brings it to 0 ends the run. Null: the run ends explicitly (agents). */
    sinksLeft: integer('sinks_left'),
  },
  (t) => [
    uniqueIndex('runs_parent_stage_uq').on(t.parentStageId).where(sql`parent_stage_id is not null`),
    index('runs_parent_idx').on(t.parentRunId).where(sql`parent_run_id is not null`),
    uniqueIndex('runs_idempotency_key_uq').on(t.idempotencyKey),
    index('runs_state_created_idx').on(t.state, t.createdAt),
    // Runs past their deadline, found by the sweeper (deadline.sql.ts) without reading finished runs.
    index('runs_active_deadline_idx').on(t.deadline).where(sql`deadline is not null and state in ('queued','running')`),
    index('runs_workflow_created_idx').on(t.workflow, t.createdAt),
    // Listing runs newest first without a filter: keyset pagination on (created_at, id).
    index('runs_created_id_idx').on(t.createdAt, t.id),
    check('runs_state_ck', sql`${t.state} in ('queued','running','succeeded','failed','cancelled','expired')`),
  ],
);

export const stages = ratchet.table(
  'stages',
  {
    id: bigint('id', { mode: 'bigint' }).primaryKey().generatedAlwaysAsIdentity(),
    runId: uuid('run_id')
      .notNull()
      .references(() => runs.id, { onDelete: 'cascade' }),
    /** The run's definition hash, copied so the claim can keep to the definitions a worker has loaded in index order. */
    definitionHash: text('definition_hash').notNull(),
    seq: integer('seq').notNull(),
    /** Step name (defaults to the tool's name); results are addressed by it. */
    name: text('name').notNull(),
    tool: text('tool').notNull(),
    toolClass: text('tool_class').notNull(),
    state: text('state').notNull(),
    ownerId: text('owner_id'),
    fence: bigint('fence', { mode: 'bigint' }),
    leaseMs: integer('lease_ms').notNull(),
    timeoutMs: integer('timeout_ms').notNull(),
    maxDurationMs: integer('max_duration_ms').notNull(),
    leaseUntil: ts('lease_until'),
    heartbeatAt: ts('heartbeat_at'),
    /** When the current attempt was claimed: maxDuration counts from here. */
    claimedAt: ts('claimed_at'),
    /** When the first attempt was claimed: a retry policy's maxElapsed counts from here. */
    firstClaimedAt: ts('first_claimed_at'),
    attempt: integer('attempt').notNull().default(0),
    maxAttempts: integer('max_attempts').notNull(),
    availableAt: ts('available_at').notNull().default(sql`now()`),
    /** The stage's own key, unique: by default derived from run id, seq and tool. */
    idempotencyKey: text('idempotency_key').notNull(),
    /** The key the tool derived for its effect (`tool.idempotencyKey(input)`), as sent by the latest attempt; null when it used the stage's own. */
    effectKey: text('effect_key'),
    input: jsonb('input'),
    /** A workflow's concurrency key (a user, a tenant, an account) and its limit: no more stages of one key run at once. */
    concurrencyKey: text('concurrency_key'),
    concurrencyLimit: integer('concurrency_limit'),
    result: jsonb('result'),
    /** The last error, kept across attempts and at exhaustion. */
    error: jsonb('error'),
    createdAt: ts('created_at').notNull().default(sql`now()`),
    updatedAt: ts('updated_at').notNull().default(sql`now()`),
    finishedAt: ts('finished_at'),
    /** The run's priority (higher first), copied so the claim reads it in index order. */
    priority: integer('priority').notNull().default(0),
    /** The run graph (issue 11). The step this stage belongs to (a map item: its map step); null on old rows (= name). */
    step: text('step'),
    /** The seqs this stage waits for, and those that wait for it (a finish decrements their deps_left). */
    deps: integer('deps').array().notNull().default(sql`'{}'::integer[]`),
    nextSeqs: integer('next_seqs').array().notNull().default(sql`'{}'::integer[]`),
    /** The join counter: dependencies (or, for a waiting map stage, items) not yet ended; the finish that brings it to 0 queues the stage. */
    depsLeft: integer('deps_left').notNull().default(0),
    /** A map item's index and its map stage's seq. */
    itemIndex: integer('item_index'),
    groupSeq: integer('group_seq'),
    /** A failure for good counts as done for the join (a value `{ ok: false, error }`) instead of failing the run. */
    continueOnError: boolean('continue_on_error').notNull().default(false),
    /** How a sink's value enters the run's result: `only` (it is the result) or `one_of` (an object by step name). */
    sink: text('sink'),
  },
  (t) => [
    uniqueIndex('stages_idempotency_key_uq').on(t.idempotencyKey),
    uniqueIndex('stages_run_seq_uq').on(t.runId, t.seq),
    // The claim's index-ordered branches (see claim.sql.ts), one range per loaded definition:
    // due stages without a concurrency key, expired leases, and keyed stages walked key by key.
    index('stages_queued_claim_idx')
      .on(t.toolClass, t.definitionHash, t.availableAt, t.id)
      .where(sql`state = 'queued' and concurrency_key is null`),
    // The same due stages by priority first (higher first), then age: the claim's usual order; the
    // index above serves its share of claims that take the oldest first (no stage starves).
    index('stages_queued_priority_idx')
      .on(t.toolClass, t.definitionHash, t.priority.desc(), t.availableAt, t.id)
      .where(sql`state = 'queued' and concurrency_key is null`),
    index('stages_running_lease_idx').on(t.toolClass, t.definitionHash, t.leaseUntil, t.id).where(sql`state = 'running'`),
    index('stages_queued_key_idx')
      .on(t.toolClass, t.concurrencyKey, t.definitionHash, t.availableAt, t.id)
      .where(sql`state = 'queued' and concurrency_key is not null`),
    index('stages_queued_key_priority_idx')
      .on(t.toolClass, t.concurrencyKey, t.definitionHash, t.priority.desc(), t.availableAt, t.id)
      .where(sql`state = 'queued' and concurrency_key is not null`),
    // Live leases per concurrency key (the limited claim counts them).
    index('stages_running_key_idx').on(t.concurrencyKey).where(sql`state = 'running' and concurrency_key is not null`),
    check(
      'stages_state_ck',
      sql`${t.state} in ('pending','queued','running','succeeded','failed','cancelled','skipped','waiting','awaiting_approval')`,
    ),
    check('stages_sink_ck', sql`${t.sink} is null or ${t.sink} in ('only','one_of')`),
    check('stages_deps_left_ck', sql`${t.depsLeft} >= 0`),
    check('stages_durations_ck', sql`${t.leaseMs} > 0 and ${t.timeoutMs} > 0 and ${t.maxDurationMs} > 0 and ${t.maxAttempts} > 0`),
  ],
);

/** Append-only history of every run: the durable twin of the logs. Never updated. */
export const events = ratchet.table(
  'events',
  {
    id: bigint('id', { mode: 'bigint' }).primaryKey().generatedAlwaysAsIdentity(),
    runId: uuid('run_id').notNull(),
    stageId: bigint('stage_id', { mode: 'bigint' }),
    type: text('type').notNull(),
    fence: bigint('fence', { mode: 'bigint' }),
    attempt: integer('attempt'),
    at: ts('at').notNull().default(sql`now()`),
    data: jsonb('data'),
    /**
     * The writing transaction's id. Live streams read a run's events in (tx, id) order, only up
     * to the oldest transaction still running (src/store/stream.sql.ts), so an event committed
     * late with a lower id is never skipped. Null on rows written before migration 0007.
     */
    tx: xid8('tx').default(sql`pg_current_xact_id()`),
  },
  (t) => [index('events_run_idx').on(t.runId, t.id)],
);

/** The movable clock: one row whose offset every connection and process reads through ratchet.db_now(). */
export const clock = ratchet.table(
  'clock',
  {
    id: integer('id').primaryKey().default(1),
    offsetMs: bigint('offset_ms', { mode: 'number' }).notNull().default(sql`0`),
  },
  (t) => [check('clock_single_row_ck', sql`${t.id} = 1`)],
);

/** Claims of rate-limited classes in their current window (see COUNT_RATE_SQL); pruned as it goes. */
export const rateClaims = ratchet.table(
  'rate_claims',
  {
    id: bigint('id', { mode: 'bigint' }).primaryKey().generatedAlwaysAsIdentity(),
    toolClass: text('tool_class').notNull(),
    at: ts('at').notNull(),
  },
  (t) => [index('rate_claims_class_at_idx').on(t.toolClass, t.at)],
);

/** Workers seen recently, the classes they serve and the definitions they have loaded (explain: "no worker serves this class / version"). */
export const workers = ratchet.table(
  'workers',
  {
    ownerId: text('owner_id').primaryKey(),
    classes: text('classes').array().notNull(),
    /** Hashes of the workflow definitions (every version) the worker has loaded. */
    definitions: text('definitions').array().notNull().default(sql`'{}'::text[]`),
    startedAt: ts('started_at').notNull(),
    lastSeenAt: ts('last_seen_at').notNull(),
  },
  (t) => [index('workers_last_seen_idx').on(t.lastSeenAt)],
);
