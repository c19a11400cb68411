import pg from 'pg';
import { expect } from 'vitest';
import type { Queryable } from '../../src/store/db.js';
import { until } from '../api/helpers.js';

/**
 * A deadlock, made on purpose. A request that locks a run, then one of its stages (a cancel, a decision, a signal, a
 * run retry) meets what locks them the other way round (a finish or a claim that settles the run locks its stage,
 * then the run). Here the other side is a session of the test: it holds the stage's row, waits until the request
 * waits for that row, then updates the run. The request began waiting first, so its deadlock check (deadlock_timeout
 * after that) comes first and aborts it; it wrote nothing, so it must be asked again, and once the session commits it
 * goes through. On a machine so loaded that the session's update began waiting only after the request's one check,
 * the session is the one aborted instead: that round proves nothing (`conclusiveDeadlock` tries again, 3 rounds).
 *
 * Returns the request's outcome when PostgreSQL aborted the request, null when it aborted the session.
 */
export async function deadlockRound<T>(o: {
  /** The database the session connects to. */
  url: string;
  /** A connection outside the session, to read pg_stat_activity (inside the session's transaction it stays as at its first read). */
  probe: Queryable;
  runId: string;
  stageId: string;
  /** A fragment of the request's statement that waits for the stage's row. */
  blocked: string;
  request: () => Promise<T>;
}): Promise<{ ok: true; value: T } | { ok: false; err: unknown } | null> {
  const session = new pg.Client({ connectionString: o.url });
  await session.connect();
  let outcome: Promise<{ ok: true; value: T } | { ok: false; err: unknown }> | null = null;
  const deadlocks = async () =>
    ((await o.probe.query(`SELECT deadlocks::int AS n FROM pg_stat_database WHERE datname = current_database()`)) as { n: number }[])[0]!.n;
  const before = await deadlocks();
  try {
    await session.query('BEGIN');
    await session.query('SELECT id FROM ratchet.stages WHERE id = $1 FOR UPDATE', [o.stageId]);
    outcome = o.request().then(
      (value) => ({ ok: true as const, value }),
      (err: unknown) => ({ ok: false as const, err }),
    );
    const waiting = async () =>
      (
        (await o.probe.query(
          `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
             AND wait_event_type = 'Lock' AND position('ratchet.stages' in query) > 0 AND position($1 in query) > 0`,
          [o.blocked],
        )) as { n: number }[]
      )[0]!.n;
    await until('the request to wait for the stage row', async () => (await waiting()) > 0, 10_000);
    // Now the session asks for the run's row: a cycle.
    try {
      await session.query(`UPDATE ratchet.runs SET updated_at = now() WHERE id = $1`, [o.runId]);
    } catch (err) {
      if ((err as { code?: string }).code !== '40P01') throw err;
      await session.query('ROLLBACK'); // the session was the one aborted: the request goes on
      await outcome;
      return null;
    }
    await session.query('COMMIT');
    // A round that proves something: PostgreSQL did detect a deadlock (the counter is flushed a little later).
    await until('PostgreSQL to count the deadlock', async () => (await deadlocks()) > before, 10_000);
    return await outcome;
  } finally {
    await session.end();
    await outcome;
  }
}

/** Rounds until one in which PostgreSQL aborted the request (its checks in `round`), at most 3. */
export async function conclusiveDeadlock(round: () => Promise<boolean>): Promise<void> {
  let ok = false;
  for (let i = 0; i < 3 && !ok; i++) ok = await round();
  expect(ok, 'in 3 rounds the request was never the one PostgreSQL aborted').toBe(true);
}
