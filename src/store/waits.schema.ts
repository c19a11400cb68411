import { sql } from 'drizzle-orm';
import { bigint, check, index, jsonb, text, timestamp, uniqueIndex, uuid } from 'drizzle-orm/pg-core';
import { ratchet, runs, stages } from './schema.js';

/**
 * Waits (issue 10): kept apart from ./schema.ts so the two files change independently;
 * drizzle.config.ts lists both. Times are the database clock's (ratchet.db_now()).
 *
 * A stage that waits without a lease (`waiting` for a sleep or a signal, `awaiting_approval`
 * for a person) has one row here: what it waits for, since when, until when, and how the wait
 * ended (who decided, when, why). The stages table keeps only the state; everything a wait
 * needs beyond it lives here, so a million sleeping stages cost the claim's indexes nothing.
 */
const ts = (name: string) => timestamp(name, { withTimezone: true, mode: 'date' });

export const waits = ratchet.table(
  'waits',
  {
    stageId: bigint('stage_id', { mode: 'bigint' })
      .primaryKey()
      .references(() => stages.id, { onDelete: 'cascade' }),
    runId: uuid('run_id')
      .notNull()
      .references(() => runs.id, { onDelete: 'cascade' }),
    /** 'sleep' | 'signal' | 'approval' (src/planner/waits.ts WAIT_KINDS). */
    kind: text('kind').notNull(),
    /** The signal's name (kind 'signal'). */
    signalName: text('signal_name'),
    /** When the wait started. */
    since: ts('since').notNull(),
    /** A sleep's end, or the timeout of a signal or an approval; null: an approval without approvalTimeout. */
    waitUntil: ts('wait_until'),
    /** Set once, by the one writer that ends the wait (a conditional update on `ended_at is null`). */
    endedAt: ts('ended_at'),
    outcome: text('outcome'),
    /** Who decided (an approval): the token's identity, never the token. */
    decidedBy: text('decided_by'),
    /** The name the caller gave for the person (`by`), as sent: what they say, beside what the token proves. */
    actor: text('actor'),
    reason: text('reason'),
    /** sha256 of an approver's edited input (the input itself is the stage's). */
    inputHash: text('input_hash'),
    /** The signal that ended the wait (kind 'signal'). */
    signalId: text('signal_id'),
  },
  (t) => [
    // The sweeper's question, "which waits' time has come?", read in index order by the database clock.
    index('waits_due_idx').on(t.waitUntil).where(sql`ended_at is null and wait_until is not null`),
    index('waits_run_idx').on(t.runId),
    // Open waits by kind: the metric of waiting stages (src/observability/wait-metrics.ts) counts them at each scrape.
    index('waits_open_kind_idx').on(t.kind).where(sql`ended_at is null`),
    // "What waits for a person?" (ratchet list --state awaiting_approval), oldest first.
    index('waits_open_approval_idx').on(t.since).where(sql`kind = 'approval' and ended_at is null`),
    // A signal goes to the run's one open wait of its name (one signal step per name: checked at definition).
    uniqueIndex('waits_open_signal_uq').on(t.runId, t.signalName).where(sql`kind = 'signal' and ended_at is null`),
    check('waits_kind_ck', sql`${t.kind} in ('sleep','signal','approval')`),
    check('waits_signal_name_ck', sql`(${t.kind} = 'signal') = (${t.signalName} is not null)`),
    check(
      'waits_outcome_ck',
      sql`${t.outcome} is null or ${t.outcome} in ('woken','signalled','timed_out','approved','rejected','cancelled','expired')`,
    ),
    check('waits_ended_ck', sql`(${t.endedAt} is null) = (${t.outcome} is null)`),
  ],
);

/**
 * Every signal sent to a run, delivered at once to its waiting stage or kept until the wait
 * starts (consumed then, oldest first). (run_id, signal_id) is unique: one Signal-Id is
 * delivered once; sent again with the same name and payload it is answered as before.
 */
export const signals = ratchet.table(
  'signals',
  {
    id: bigint('id', { mode: 'bigint' }).primaryKey().generatedAlwaysAsIdentity(),
    runId: uuid('run_id')
      .notNull()
      .references(() => runs.id, { onDelete: 'cascade' }),
    name: text('name').notNull(),
    /** The Signal-Id header (or one made by the server when none was sent). */
    signalId: text('signal_id').notNull(),
    /** The payload as the step's schema parsed it (JSON null allowed). */
    payload: jsonb('payload').notNull(),
    payloadHash: text('payload_hash').notNull(),
    sentBy: text('sent_by'),
    receivedAt: ts('received_at').notNull().default(sql`now()`),
    /** When a waiting stage took it (at once, or when its wait started); null: kept. */
    consumedAt: ts('consumed_at'),
    consumedBy: bigint('consumed_by', { mode: 'bigint' }),
  },
  (t) => [
    uniqueIndex('signals_run_signal_id_uq').on(t.runId, t.signalId),
    // Kept signals of a run by name, oldest first: what a wait takes when it starts.
    index('signals_kept_idx').on(t.runId, t.name, t.id).where(sql`consumed_at is null`),
  ],
);
