import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { exec } from '../helpers/exec.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/** `ratchet schedules [add|delete]` as a user types it, against the store directly (--database-url), with --json. */
const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const WORKFLOWS = fileURLToPath(new URL('../fixtures/api-workflows', import.meta.url));
let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase('cli_sched');
});
afterAll(async () => {
  await db?.drop();
});

const ratchet = (args: string[]) =>
  exec(process.execPath, ['bin/ratchet.mjs', ...args, '--database-url', db.url, '--json'], { cwd: ROOT, timeoutMs: 90_000 });

describe('ratchet schedules', () => {
  it('adds, lists and deletes; bad input is exit 2 and unknown names exit 3, with nothing written', async () => {
    const added = await ratchet([
      'schedules',
      'add',
      'hourly',
      '--cron',
      '0 * * * *',
      '--workflow',
      'echo',
      '--input',
      '{"key":"k"}',
      '--timezone',
      'Europe/Berlin',
      '--catch-up',
      '2',
      '--workflows-dir',
      WORKFLOWS,
    ]);
    expect(added.code, added.stderr).toBe(0);
    expect(added.json[0]).toMatchObject({
      created: true,
      schedule: { name: 'hourly', catchUp: 2, timezone: 'Europe/Berlin', source: 'api' },
    });

    const listed = await ratchet(['schedules']);
    expect(listed.code, listed.stderr).toBe(0);
    expect((listed.json[0] as { schedules: { name: string }[] }).schedules.map((s) => s.name)).toEqual(['hourly']);

    for (const bad of [
      ['--cron', 'nope'],
      ['--cron', '0 * * * *', '--timezone', 'Nowhere/City'],
      ['--cron', '0 * * * *', '--input', '{"key":1}'],
    ]) {
      const res = await ratchet(['schedules', 'add', 'broken', '--workflow', 'echo', ...bad, '--workflows-dir', WORKFLOWS]);
      expect(res.code, `${bad.join(' ')}: ${res.stderr}`).toBe(2);
      expect(res.stderr).toContain('"code":"invalid_input"');
    }
    const unknownWorkflow = await ratchet([
      'schedules',
      'add',
      'broken',
      '--cron',
      '0 * * * *',
      '--workflow',
      'nope',
      '--workflows-dir',
      WORKFLOWS,
    ]);
    expect(unknownWorkflow.code).toBe(2);
    expect((await db.query(`SELECT name FROM ratchet.schedules`)).map((r) => r.name)).toEqual(['hourly']);

    expect((await ratchet(['schedules', 'delete', 'hourly'])).json[0]).toEqual({ name: 'hourly', deleted: true });
    const again = await ratchet(['schedules', 'delete', 'hourly']);
    expect(again.code).toBe(3);
    expect(again.stderr).toContain('"code":"unknown_schedule"');
  }, 240_000); // eight CLI processes, each loading tsx, on a busy 2-core machine
});
