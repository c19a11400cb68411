import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { conclusiveDeadlock, deadlockRound } from '../helpers/deadlock-round.js';
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

  /** One round (test/helpers/deadlock-round.ts): true when the cancel was the one PostgreSQL aborted (then it must have cancelled the run), false when the session was. */
  async function round(): Promise<boolean> {
    const { id } = await r.submit('cancel_deadlock_wf', {});
    const [stage] = (await r.store.db.query(`SELECT id::text FROM ratchet.stages WHERE run_id = $1`, [id])) as { id: string }[];
    const out = await deadlockRound({
      url: tdb.url,
      probe: r.store.db,
      runId: id,
      stageId: stage!.id,
      blocked: 'cancelled',
      request: () => r.cancel(id),
    });
    if (out === null) return false;
    expect(out.ok ? null : (out.err as { code?: string }).code).toBeNull();
    expect(out.ok && out.value).toMatchObject({ cancelled: true, previousState: 'queued' });
    const [run] = (await r.store.db.query(`SELECT state FROM ratchet.runs WHERE id = $1`, [id])) as { state: string }[];
    expect(run!.state).toBe('cancelled');
    const stages = (await r.store.db.query(`SELECT state FROM ratchet.stages WHERE run_id = $1`, [id])) as { state: string }[];
    expect(stages.map((s) => s.state)).toEqual(['cancelled']);
    return true;
  }

  it('is asked again and cancels the run', async () => {
    await conclusiveDeadlock(round);
  });
});
