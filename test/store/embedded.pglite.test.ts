import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { DataDirLockedError } from '../../src/errors.js';
import { openStore } from '../../src/store/index.js';
import { spawnTs } from '../helpers/child.js';

describe('embedded PGlite data directory', () => {
  const dirs: string[] = [];
  const newDir = () => {
    const d = mkdtempSync(join(tmpdir(), 'ratchet-embedded-'));
    dirs.push(d);
    return d;
  };
  afterAll(() => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  it('refuses a second process on the same directory with a clear error, and takes over once the holder is dead', async () => {
    const dir = newDir();
    const holder = spawnTs('test/fixtures/store-process.ts', ['hold', dir]);
    await holder.line((o) => o.ready === true, 60_000);

    const err = await openStore({ dataDir: dir }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(DataDirLockedError);
    expect((err as DataDirLockedError).code).toBe('data_dir_locked');
    expect((err as Error).message).toContain(`pid ${holder.proc.pid}`);

    const second = spawnTs('test/fixtures/store-process.ts', ['hold', dir]);
    const refused = await second.line((o) => 'error' in o);
    expect(refused.error).toMatchObject({ code: 'data_dir_locked' });
    expect((await second.exit).code).toBe(3);

    holder.proc.kill('SIGKILL');
    await holder.exit;
    const store = await openStore({ dataDir: dir }); // the dead holder's lock is taken over
    await store.close();
    expect(existsSync(join(dir, 'ratchet.lock'))).toBe(false);
  });

  it('a lock file naming a live process on this host is respected even without a child', async () => {
    const dir = newDir();
    writeFileSync(join(dir, 'ratchet.lock'), JSON.stringify({ pid: process.pid, host: hostname(), startedAt: 'now' }));
    await expect(openStore({ dataDir: dir })).rejects.toBeInstanceOf(DataDirLockedError);
  });

  it('reclaims at once, at start-up, the leases a dead process left', async () => {
    const dir = newDir();
    const doomed = spawnTs('test/fixtures/store-process.ts', ['claim-and-die', dir, 'io']);
    const claimed = await doomed.line((o) => 'stageId' in o, 60_000);
    expect((await doomed.exit).signal).toBe('SIGKILL');

    const store = await openStore({ dataDir: dir });
    try {
      // The lease was 10 minutes long; no clock moves, yet the claim takes it over now.
      const [s] = await store.claim({ owner: 'successor', toolClass: 'io', limit: 1 });
      expect(s!.id).toBe(claimed.stageId);
      expect(s!.previousState).toBe('running');
      expect(s!.attempt).toBe(2);
      expect(BigInt(s!.fence)).toBeGreaterThan(BigInt(claimed.fence as string));
      const types = (await store.listEvents(s!.runId)).map((e) => e.type);
      expect(types).toEqual(['run_submitted', 'job_claimed', 'lease_expired_at_startup', 'lease_reclaimed']);
    } finally {
      await store.close();
    }
  });
});
