import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT } from '../helpers/build.js';
import { exec } from '../helpers/exec.js';
import { DAY_MS, insertRuns } from '../helpers/finished-runs.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/** `ratchet prune` as an operator types it (`node bin/ratchet.mjs` in a child process) against a PostgreSQL database. */
const tmp = mkdtempSync(join(tmpdir(), 'ratchet-cli-prune-'));
const ratchet = (args: string[], env: NodeJS.ProcessEnv = {}) => exec(process.execPath, ['bin/ratchet.mjs', ...args], { cwd: ROOT, env });

describe('ratchet prune', () => {
  let db: TestDatabase;
  const byState = async () =>
    Object.fromEntries(
      (await db.query(`SELECT workflow || ':' || state AS k, count(*)::int AS n FROM ratchet.runs GROUP BY 1`)).map((x) => [
        x.k as string,
        x.n as number,
      ]),
    );
  const totals = async () =>
    (
      await db.query(`SELECT (SELECT count(*) FROM ratchet.runs)::int AS runs, (SELECT count(*) FROM ratchet.stages)::int AS stages,
    (SELECT count(*) FROM ratchet.events)::int AS events`)
    )[0];

  beforeAll(async () => {
    db = await createTestDatabase('cli_prune');
    await insertRuns(db, { count: 40, createdAgoMs: 40 * DAY_MS, workflow: 'old', stagesPerRun: 2, eventsPerRun: 3 }); // 10 of each finished state
    await insertRuns(db, { count: 8, createdAgoMs: 10 * DAY_MS, workflow: 'young' });
    await insertRuns(db, { count: 6, createdAgoMs: 90 * DAY_MS, finished: false, states: ['queued', 'running'], workflow: 'open' });
  });
  afterAll(async () => {
    await db?.drop();
    rmSync(tmp, { recursive: true, force: true });
  });

  it('--dry-run reports what would go (by state) and deletes nothing', async () => {
    const before = await totals();
    const res = await ratchet(['--database-url', db.url, '--json', 'prune', '--older-than', '30d', '--dry-run']);
    expect(res.code, res.stderr).toBe(0);
    expect(res.json[0]).toMatchObject({
      dryRun: true,
      olderThan: '30d',
      olderThanMs: 30 * DAY_MS,
      states: ['succeeded', 'failed', 'cancelled', 'expired'],
      runs: 40,
      stages: 80,
      events: 120,
      batches: 0,
      byState: { succeeded: { runs: 10 }, failed: { runs: 10 }, cancelled: { runs: 10 }, expired: { runs: 10 } },
    });
    const text = await ratchet(['--database-url', db.url, 'prune', '--older-than', '7d', '--state', 'failed', '--dry-run']);
    expect(text.stdout.trim()).toBe(
      'would prune 12 runs (22 stages, 36 events): failed that finished more than 7d ago; nothing deleted (--dry-run)',
    );
    expect(await totals()).toEqual(before);
  });

  it('deletes the named states older than the age, in batches, with their stages and events; nothing unfinished', async () => {
    const res = await ratchet([
      '--database-url',
      db.url,
      '--json',
      'prune',
      '--older-than',
      '30d',
      '--state',
      'succeeded,cancelled',
      '--batch-size',
      '3',
    ]);
    expect(res.code, res.stderr).toBe(0);
    expect(res.json[0]).toMatchObject({
      dryRun: false,
      runs: 20,
      stages: 40,
      events: 60,
      complete: true,
      states: ['succeeded', 'cancelled'],
    });
    expect(res.json[0]!.batches).toBe(8); // 3 + 3 + 3 + 1 per state
    expect(await byState()).toEqual({
      'old:failed': 10,
      'old:expired': 10,
      'young:succeeded': 2,
      'young:failed': 2,
      'young:cancelled': 2,
      'young:expired': 2,
      'open:queued': 3,
      'open:running': 3,
    });
    const text = await ratchet(['--database-url', db.url, 'prune', '--older-than', '1d']);
    expect(text.code, text.stderr).toBe(0);
    expect(text.stdout.trim()).toBe(
      'pruned 28 runs (48 stages, 84 events): succeeded, failed, cancelled, expired that finished more than 1d ago, in 4 batches',
    );
    expect(await byState()).toEqual({ 'open:queued': 3, 'open:running': 3 });
    const [orphans] = await db.query(
      `SELECT count(*)::int AS n FROM ratchet.events e WHERE NOT EXISTS (SELECT 1 FROM ratchet.runs r WHERE r.id = e.run_id)`,
    );
    expect(orphans!.n).toBe(0);
  });

  it('bad arguments: exit 2 with a typed error, nothing deleted, no data directory made', async () => {
    await insertRuns(db, { count: 4, createdAgoMs: 40 * DAY_MS, workflow: 'again' });
    const before = await totals();
    const dataDir = join(tmp, 'never');
    const cases: [string[], RegExp][] = [
      [[], /--older-than is required/],
      [['--older-than', 'soon'], /cannot read "soon" as an age/],
      [['--older-than', '0'], /greater than 0/],
      [['--older-than', '-3d'], /greater than 0/],
      [['--older-than', '30d', '--state', 'running'], /running: not a finished state; prune deletes only finished runs/],
      [['--older-than', '30d', '--state', 'succeeded,bogus'], /bogus: not a finished state/],
      [['--older-than', '30d', '--state', ','], /no state given/],
      [['--older-than', '30d', '--batch-size', '0'], /1\.\.10000/],
      [['--older-than', '30d', '--batch-size', 'lots'], /1\.\.10000/],
    ];
    for (const [i, [args, message]] of cases.entries()) {
      // Against PostgreSQL, and (a few) against an embedded data directory that must not come into being.
      for (const target of [['--database-url', db.url], ...(i % 3 === 0 ? [['--data-dir', dataDir]] : [])]) {
        const res = await ratchet([...target, '--json', 'prune', ...args]);
        expect(res.code, `${args.join(' ')}: ${res.stderr}`).toBe(2);
        const { error } = JSON.parse(res.stderr) as { error: { code: string; message: string; path: string } };
        expect(error.code).toBe('invalid_input');
        expect(error.message).toMatch(message);
        expect(error.path).toMatch(/^(older-than|prune\.)/);
      }
    }
    const unknown = await ratchet(['--database-url', db.url, 'prune', '--older-than', '30d', '--no-such-flag']);
    expect(unknown.code).toBe(2);
    expect(await totals()).toEqual(before);
    expect(existsSync(dataDir)).toBe(false);
  }, 120_000);

  it('ratchet worker --retention: a policy it cannot read is exit 2 with a typed error, before anything opens', async () => {
    const dataDir = join(tmp, 'never-worker');
    const cases: [string, RegExp][] = [
      ['succeeded', /"succeeded" is not state=age/],
      ['running=1d', /running/],
      ['failed=soon', /cannot read "soon"/],
    ];
    for (const [policy, message] of cases) {
      const res = await ratchet(['--data-dir', dataDir, '--json', 'worker', '--retention', policy, '--workflows-dir', 'workflows']);
      expect(res.code, res.stderr).toBe(2);
      const { error } = JSON.parse(res.stderr.trim().split('\n').at(-1)!) as { error: { code: string; message: string } };
      expect(error.code).toBe('invalid_input');
      expect(error.message).toMatch(message);
    }
    expect(existsSync(dataDir)).toBe(false);
  });

  it('works on the embedded store too', async () => {
    const res = await ratchet(['--data-dir', join(tmp, 'embedded'), '--json', 'prune', '--older-than', '1d']);
    expect(res.code, res.stderr).toBe(0);
    expect(res.json[0]).toMatchObject({ dryRun: false, runs: 0, batches: 4, complete: true });
  });
});
