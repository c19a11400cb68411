import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { until } from '../api/helpers.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * A cancel locks the run, then its stages; a claim or a finish that fails the run locks a stage, then the run. When
 * the two meet, PostgreSQL aborts one of them (40P01). Here the other side is a session of the test that holds the
 * run's stage, waits until the cancel waits for it, then updates the run. The cancel began waiting first, so its
 * deadlock check (deadlock_timeout after that) comes first and aborts it; it wrote nothing, so it is asked again, and
 * once the session commits it cancels the run: the caller sees a cancelled run, not the deadlock. On a machine so
 * loaded that the session's update began waiting only after the cancel's one check, the session is the one aborted
 * instead: that round proves nothing, and the test tries again with a new run (3 rounds at most).
 */
describe('a cancel that meets a deadlock', () => {
  let tdb: TestDatabase;
  let r: Ratchet;
  const cls = defineToolClass({ name: 'cancel_deadlock', lease: '10s', heartbeat: '2s', timeout: '5s', maxDuration: '1m' });
  const tool = defineTool({
    name: 'cancel_deadlock_tool',
    description: 'never runs',
    class: cls,
    input: z.object({}),
    output: z.object({}),
    run: async () => ({}),
  });
  const wf = defineWorkflow({ name: 'cancel_deadlock_wf', input: z.object({}), steps: [{ tool }] });
  beforeAll(async () => {
    tdb = await createTestDatabase('cancel_deadlock');
    r = await createRatchet({ databaseUrl: tdb.url, workflows: [wf], logger: silentLogger() });
  });
  afterAll(async () => {
    await r?.close();
    await tdb?.drop();
  });

  /** One round: true when the cancel was the one PostgreSQL aborted (then it must have cancelled the run), false when the session was. */
  async function round(): Promise<boolean> {
    const { id } = await r.submit('cancel_deadlock_wf', {});
    const other = new pg.Client({ connectionString: tdb.url });
    await other.connect();
    let cancel: Promise<{ ok: true; v: Awaited<ReturnType<Ratchet['cancel']>> } | { ok: false; err: unknown }> | null = null;
    try {
      await other.query('BEGIN');
      await other.query('SELECT id FROM ratchet.stages WHERE run_id = $1 FOR UPDATE', [id]);
      cancel = r.cancel(id).then(
        (v) => ({ ok: true as const, v }),
        (err: unknown) => ({ ok: false as const, err }),
      );
      // The cancel has updated the run and waits for the stage row this session holds. Read outside the session's
      // transaction: inside it, pg_stat_activity would stay as it was at its first read.
      const waiting = async () =>
        (
          (await r.store.db.query(
            `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database()
               AND wait_event_type = 'Lock' AND query LIKE '%cancelled%'`,
          )) as { n: number }[]
        )[0]!.n;
      await until('the cancel to wait for the stage row', async () => (await waiting()) > 0, 10_000);
      // Now this session asks for the run's row: a cycle.
      try {
        await other.query(`UPDATE ratchet.runs SET updated_at = now() WHERE id = $1`, [id]);
      } catch (err) {
        if ((err as { code?: string }).code !== '40P01') throw err;
        await other.query('ROLLBACK'); // this session was the one aborted: the cancel goes on
        await cancel;
        return false;
      }
      await other.query('COMMIT');
      const out = await cancel;
      expect(out.ok ? null : (out.err as { code?: string }).code).toBeNull();
      expect(out.ok && out.v).toMatchObject({ cancelled: true, previousState: 'queued' });
      const [run] = (await r.store.db.query(`SELECT state FROM ratchet.runs WHERE id = $1`, [id])) as { state: string }[];
      expect(run!.state).toBe('cancelled');
      const stages = (await r.store.db.query(`SELECT state FROM ratchet.stages WHERE run_id = $1`, [id])) as { state: string }[];
      expect(stages.map((s) => s.state)).toEqual(['cancelled']);
      return true;
    } finally {
      await other.end();
      await cancel;
    }
  }

  it('is asked again and cancels the run', async () => {
    let conclusive = false;
    for (let i = 0; i < 3 && !conclusive; i++) conclusive = await round();
    expect(conclusive, 'in 3 rounds the cancel was never the one PostgreSQL aborted').toBe(true);
  });
});
