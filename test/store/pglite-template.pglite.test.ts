import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openStore } from '../../src/store/index.js';

/**
 * A new embedded cluster loads the cached empty cluster instead of running initdb
 * (src/store/pglite-template.ts): the store it gives is migrated and works, an existing data
 * directory keeps its data, and a damaged template falls back to initdb and is replaced.
 */
const root = mkdtempSync(join(tmpdir(), 'ratchet-template-test-'));
const cache = join(root, 'cache');
const saved = process.env.RATCHET_CACHE_DIR;
beforeAll(() => {
  process.env.RATCHET_CACHE_DIR = cache;
});
afterAll(() => {
  if (saved === undefined) delete process.env.RATCHET_CACHE_DIR;
  else process.env.RATCHET_CACHE_DIR = saved;
  rmSync(root, { recursive: true, force: true });
});

const templates = () => (existsSync(cache) ? readdirSync(cache).filter((f) => f.endsWith('.tar.gz')) : []);

async function roundTrip(dataDir: string): Promise<number> {
  const store = await openStore({ dataDir });
  try {
    const [r] = await store.db.query<{ n: number }>('SELECT count(*)::int AS n FROM ratchet.runs');
    return r!.n;
  } finally {
    await store.close();
  }
}

describe('PGlite empty-cluster template', () => {
  it('the first new cluster writes the template; the next loads it and is migrated', async () => {
    expect(await roundTrip(join(root, 'a'))).toBe(0);
    expect(templates()).toHaveLength(1);
    expect(await roundTrip(join(root, 'b'))).toBe(0);
  }, 120_000);

  it('an existing data directory keeps its rows (no template over it)', async () => {
    const dir = join(root, 'c');
    const store = await openStore({ dataDir: dir });
    await store.db.query('CREATE TABLE public.keep (v text)');
    await store.db.query("INSERT INTO public.keep VALUES ('x')");
    await store.close();
    const again = await openStore({ dataDir: dir });
    try {
      expect(await again.db.query('SELECT v FROM public.keep')).toEqual([{ v: 'x' }]);
    } finally {
      await again.close();
    }
  }, 120_000);

  it('a damaged template falls back to initdb and is replaced', async () => {
    const [file] = templates();
    writeFileSync(join(cache, file!), 'not a tarball');
    expect(await roundTrip(join(root, 'd'))).toBe(0);
    expect(templates()).toHaveLength(1);
    expect(await roundTrip(join(root, 'e'))).toBe(0);
  }, 120_000);
});
