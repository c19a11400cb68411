import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { PGlite, type PGliteOptions } from '@electric-sql/pglite';

/**
 * A fresh PGlite cluster without initdb. PGlite runs initdb (1-3 s on a busy 2-core machine) for
 * every in-memory instance and every new data directory; loading a tarball of an empty cluster
 * made by the same PGlite version takes 0.4-0.6 s. The first fresh create on a machine pays
 * initdb and saves the empty cluster (gzip, ~5 MB) under the cache directory; later fresh creates
 * load it. Only the empty cluster is cached, never a schema: migrations still run as before.
 * An existing data directory opens as it always did. Any trouble with the cache (unwritable,
 * unreadable, refused by PGlite) falls back to initdb. RATCHET_PGLITE_TEMPLATE=0 turns it off;
 * RATCHET_CACHE_DIR moves it (default <tmpdir>/ratchet-cache).
 */
const VERSION = (() => {
  try {
    // The package's exports hide its package.json: find it beside the resolved entry (dist/index.*).
    const entry = createRequire(import.meta.url).resolve('@electric-sql/pglite');
    const pkg = JSON.parse(readFileSync(join(dirname(entry), '..', 'package.json'), 'utf8')) as { name?: string; version?: string };
    return pkg.name === '@electric-sql/pglite' && pkg.version ? pkg.version : null;
  } catch {
    return null;
  }
})();

function templateFile(): string | null {
  if (process.env.RATCHET_PGLITE_TEMPLATE === '0' || !VERSION) return null;
  const dir = process.env.RATCHET_CACHE_DIR || join(tmpdir(), 'ratchet-cache');
  return join(dir, `pglite-${VERSION}-empty-cluster.tar.gz`);
}

/** Opens PGlite at `dataDir` (undefined = in memory), loading the cached empty cluster when the directory is new. */
export async function createPglite(dataDir: string | undefined, options: PGliteOptions = {}): Promise<PGlite> {
  const file = templateFile();
  const fresh = dataDir === undefined || !existsSync(join(dataDir, 'PG_VERSION'));
  if (!file || !fresh) return PGlite.create({ ...options, ...(dataDir ? { dataDir } : {}) });
  if (existsSync(file)) {
    try {
      const blob = new Blob([readFileSync(file)]);
      return await PGlite.create({ ...options, ...(dataDir ? { dataDir } : {}), loadDataDir: blob });
    } catch {
      // A damaged template: remove it, start clean below (a half-written directory would not be "fresh" next time).
      rmSync(file, { force: true });
      if (dataDir) rmSync(dataDir, { recursive: true, force: true });
    }
  }
  const pglite = await PGlite.create({ ...options, ...(dataDir ? { dataDir } : {}) });
  try {
    const dump = await pglite.dumpDataDir('gzip');
    mkdirSync(join(file, '..'), { recursive: true });
    const tmp = `${file}.${process.pid}.${Date.now()}.tmp`;
    writeFileSync(tmp, Buffer.from(await dump.arrayBuffer()));
    renameSync(tmp, file); // atomic: a reader sees the whole file or none
  } catch {
    /* no cache this time */
  }
  return pglite;
}
