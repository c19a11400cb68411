/** Where the tests find the shared services (override with env). */
export const PG_ADMIN_URL = process.env.RATCHET_TEST_PG_URL ?? 'postgres://root@127.0.0.1:5432/test';
export const REDIS_URL = process.env.RATCHET_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379';

/** postgres://.../<name> on the same server as PG_ADMIN_URL. */
export function databaseUrl(name: string): string {
  const u = new URL(PG_ADMIN_URL);
  u.pathname = `/${name}`;
  return u.toString();
}
