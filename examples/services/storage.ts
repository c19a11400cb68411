import pg from 'pg';
import { createPglite } from '../../src/store/pglite-template.js';
import { pglitePool, type PoolLike } from './pglite-pool.js';

export interface ServicesStorage {
  kind: 'postgres' | 'pglite';
  pool: PoolLike;
}

/**
 * The services' own database (not Ratchet's): PostgreSQL when a URL is given
 * (SERVICES_DATABASE_URL), else an in-memory PGlite behind a pool-like adapter, so the demo
 * runs offline. Either way the fence guard keeps its records there.
 */
export async function openServicesStorage(databaseUrl: string | undefined): Promise<ServicesStorage> {
  if (databaseUrl) {
    const pool = new pg.Pool({ connectionString: databaseUrl, max: 5 });
    pool.on('error', () => {}); // an idle client's error: the next request reports it
    return { kind: 'postgres', pool: pool as unknown as PoolLike };
  }
  return { kind: 'pglite', pool: pglitePool(await createPglite(undefined)) };
}
