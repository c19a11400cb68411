import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresDb } from '../../src/store/db-postgres.js';
import type { Db } from '../../src/store/db.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * The pool's column parsers (db-postgres.ts): a timestamptz text equal to the last one parsed is
 * answered from its kept time, never as the same Date object, and never mixed up with another
 * instant; infinity is not kept; json/jsonb's `[]` is a fresh array each time.
 */
describe('db-postgres column parsers', () => {
  let tdb: TestDatabase;
  let db: Db;
  beforeAll(async () => {
    tdb = await createTestDatabase('type_parsers');
    db = createPostgresDb({ connectionString: tdb.url, max: 2 });
  });
  afterAll(async () => {
    await db?.close();
    await tdb?.drop();
  });

  it('the same timestamptz on every row: equal Dates, each its own object, as pg parses them', async () => {
    const rows = await db.query<{ t: Date; u: Date }>(
      `SELECT t, t + interval '1 millisecond' * g AS u FROM (SELECT timestamptz '2026-12-01 16:14:21.123456+00' AS t) x,
         generate_series(0, 3) g ORDER BY g`,
    );
    expect(rows).toHaveLength(4);
    for (const r of rows) expect(r.t).toEqual(new Date('2026-12-01T16:14:21.123Z'));
    expect(rows[0]!.t).not.toBe(rows[1]!.t);
    rows[0]!.t.setTime(0); // a caller changing its Date changes no other row's
    expect(rows[1]!.t.getTime()).toBe(Date.parse('2026-12-01T16:14:21.123Z'));
    expect(rows.map((r) => r.u.getTime() - Date.parse('2026-12-01T16:14:21.123Z'))).toEqual([0, 1, 2, 3]);
    const again = await db.query<{ t: Date }>(`SELECT timestamptz '2026-12-01 16:14:21.123456+00' AS t`);
    expect(again[0]!.t).toEqual(new Date('2026-12-01T16:14:21.123Z'));
    const other = await db.query<{ t: Date; n: null }>(`SELECT timestamptz '1999-01-02 03:04:05+02' AS t, NULL::timestamptz AS n`);
    expect(other[0]!.t).toEqual(new Date('1999-01-02T01:04:05.000Z'));
    expect(other[0]!.n).toBeNull();
  });

  it('infinity is parsed as pg does, every time, and not kept', async () => {
    const rows = await db.query<{ t: unknown }>(`SELECT 'infinity'::timestamptz AS t UNION ALL SELECT 'infinity'::timestamptz`);
    expect(rows[0]!.t).toBe(Number.POSITIVE_INFINITY);
    expect(rows[1]!.t).toBe(Number.POSITIVE_INFINITY);
  });

  it('json and jsonb: `[]` is a new array per row, anything else parsed as JSON', async () => {
    const rows = await db.query<{ a: unknown[]; b: unknown; c: unknown }>(
      `SELECT '[]'::jsonb AS a, '{"x": [1, "y"]}'::jsonb AS b, '[ ]'::json AS c FROM generate_series(1, 2)`,
    );
    expect(rows[0]!.a).toEqual([]);
    expect(rows[0]!.a).not.toBe(rows[1]!.a);
    rows[0]!.a.push(1);
    expect(rows[1]!.a).toEqual([]);
    expect(rows[0]!.b).toEqual({ x: [1, 'y'] });
    expect(rows[0]!.c).toEqual([]);
  });
});
