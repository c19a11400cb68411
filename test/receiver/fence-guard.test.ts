import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  createFenceGuard,
  HandlerEndedTransactionError,
  InvalidFenceError,
  InvalidHandlerResponseError,
  InvalidIdempotencyKeyError,
  type FenceGuard,
  type GuardResult,
} from '../../src/receiver/index.js';
import { RatchetError } from '../../src/errors.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

let db: TestDatabase;
let pool: pg.Pool;
let guard: FenceGuard;
let seq = 0;
const newKey = (label: string) => `case:${label}:${++seq}`;

/** The handler's own effect: one row per call, written through the guard's transaction. */
const effect =
  (key: string, status = 201, calls?: { n: number }) =>
  async (tx: pg.ClientBase) => {
    if (calls) calls.n += 1;
    const r = await tx.query<{ id: number }>('INSERT INTO app_effects (key) VALUES ($1) RETURNING id', [key]);
    return { status, body: { id: r.rows[0]?.id, key } };
  };
const effectCount = async (key: string) =>
  Number((await db.query<{ n: string }>('SELECT count(*) AS n FROM app_effects WHERE key = $1', [key]))[0]?.n);
const guardRow = async (key: string) =>
  (
    await db.query<{ fence: string; status: string; response_status: number | null }>(
      'SELECT fence::text AS fence, status, response_status FROM ratchet_receiver.effects WHERE key = $1',
      [key],
    )
  )[0];
const rowCount = async () => Number((await db.query<{ n: string }>('SELECT count(*) AS n FROM ratchet_receiver.effects'))[0]?.n);

function gate(): { wait: Promise<void>; open: () => void } {
  let open!: () => void;
  const wait = new Promise<void>((r) => {
    open = r;
  });
  return { wait, open };
}

beforeAll(async () => {
  db = await createTestDatabase('receiver_guard', { empty: true });
  pool = new pg.Pool({ connectionString: db.url, max: 16 });
  pool.on('error', () => {});
  guard = createFenceGuard(pool);
  await Promise.all([guard.migrate(), guard.migrate()]); // concurrent and idempotent
  await guard.migrate();
  await db.query('CREATE TABLE app_effects (id serial PRIMARY KEY, key text NOT NULL)');
});

afterAll(async () => {
  await pool?.end();
  await db?.drop();
});

describe('fence guard: concurrency', () => {
  it('answers a concurrent request with the same key 409 in_progress at once; one effect', async () => {
    const key = newKey('concurrent');
    const entered = gate();
    const release = gate();
    const first = guard.run(key, '7', async (tx) => {
      const r = await effect(key)(tx);
      entered.open();
      await release.wait;
      return r;
    });
    await entered.wait;
    const calls = { n: 0 };
    const t0 = performance.now();
    const second = await guard.run(key, '7', effect(key, 201, calls));
    expect(performance.now() - t0).toBeLessThan(2000); // answered, not blocked behind the first
    expect(second).toEqual({ status: 409, body: { error: 'in_progress' }, verdict: 'in_progress', replayed: false });
    expect(calls.n).toBe(0);
    release.open();
    const done = await first;
    expect(done.verdict).toBe('applied');
    expect(done.status).toBe(201);
    expect(await effectCount(key)).toBe(1);
    // Once the first has committed, the same key replays.
    const third = await guard.run(key, '7', effect(key, 201, calls));
    expect(third).toMatchObject({ verdict: 'replayed', replayed: true, status: 201, body: done.body });
    expect(calls.n).toBe(0);
  });

  it('a burst of concurrent requests with one key: exactly one effect, others in_progress or replayed', async () => {
    const key = newKey('burst');
    const calls = { n: 0 };
    const results = await Promise.all(
      Array.from({ length: 12 }, () =>
        guard.run(key, '3', async (tx) => {
          const r = await effect(key, 200, calls)(tx);
          await new Promise((res) => setTimeout(res, 50));
          return r;
        }),
      ),
    );
    expect(await effectCount(key)).toBe(1);
    expect(calls.n).toBe(1);
    expect(results.filter((r) => r.verdict === 'applied')).toHaveLength(1);
    for (const r of results) {
      expect(['applied', 'in_progress', 'replayed']).toContain(r.verdict);
      if (r.verdict === 'in_progress') expect(r).toMatchObject({ status: 409, body: { error: 'in_progress' } });
    }
  });

  it('a row lock held outside the guard is answered in_progress at once (FOR UPDATE NOWAIT)', async () => {
    const key = newKey('nowait');
    expect((await guard.run(key, '1', effect(key, 503))).verdict).toBe('not_stored');
    const holder = await pool.connect();
    try {
      await holder.query('BEGIN');
      await holder.query('SELECT 1 FROM ratchet_receiver.effects WHERE key = $1 FOR UPDATE', [key]);
      const calls = { n: 0 };
      expect((await guard.run(key, '1', effect(key, 201, calls))).verdict).toBe('in_progress');
      expect(calls.n).toBe(0);
    } finally {
      await holder.query('ROLLBACK');
      holder.release();
    }
    expect((await guard.run(key, '1', effect(key))).verdict).toBe('applied');
  });

  it('different keys do not block each other', async () => {
    const a = newKey('indep');
    const b = newKey('indep');
    const release = gate();
    const entered = gate();
    const first = guard.run(a, '1', async (tx) => {
      const r = await effect(a)(tx);
      entered.open();
      await release.wait;
      return r;
    });
    await entered.wait;
    expect((await guard.run(b, '1', effect(b))).verdict).toBe('applied');
    release.open();
    expect((await first).verdict).toBe('applied');
  });
});

describe('fence guard: fencing', () => {
  it('a lower fence for a key not done is 409 stale_fence with the highest, and no effect', async () => {
    const key = newKey('stale');
    expect((await guard.run(key, '42', effect(key, 503))).verdict).toBe('not_stored');
    const calls = { n: 0 };
    const stale = await guard.run(key, '41', effect(key, 201, calls));
    expect(stale).toEqual({ status: 409, body: { error: 'stale_fence', highest: '42' }, verdict: 'stale_fence', replayed: false });
    expect(calls.n).toBe(0);
    expect(await effectCount(key)).toBe(0);
  });

  it('keeps the fence of a request whose handler failed: an older owner is still refused', async () => {
    const key = newKey('stale-after-5xx');
    expect((await guard.run(key, '10', effect(key, 503))).verdict).toBe('not_stored');
    expect(await guardRow(key)).toMatchObject({ fence: '10', status: 'in_progress', response_status: null });
    const calls = { n: 0 };
    expect(await guard.run(key, '9', effect(key, 201, calls))).toMatchObject({
      status: 409,
      body: { error: 'stale_fence', highest: '10' },
    });
    expect(calls.n).toBe(0);
    expect(await effectCount(key)).toBe(0);
  });

  it('compares fences as BigInt: 2^53 + 1 beats 2^53 (equal as Numbers)', async () => {
    const key = newKey('bigint');
    expect((await guard.run(key, '9007199254740993', effect(key, 503))).verdict).toBe('not_stored');
    const stale = await guard.run(key, 9007199254740992n, effect(key));
    expect(stale.body).toEqual({ error: 'stale_fence', highest: '9007199254740993' });
    expect((await guard.run(key, '9223372036854775807', effect(key))).verdict).toBe('applied');
    expect((await guardRow(key))?.fence).toBe('9223372036854775807');
  });

  it('a done key answers its stored response to any fence: run(k, 5), run(k, 7), run(k, 6) all give the first answer', async () => {
    const key = newKey('fence-order');
    const first = await guard.run(key, '5', effect(key));
    expect(first.verdict).toBe('applied');
    const calls = { n: 0 };
    for (const fence of ['7', '6', '5', '1']) {
      expect(await guard.run(key, fence, effect(key, 201, calls))).toEqual({
        status: 201,
        body: first.body,
        verdict: 'replayed',
        replayed: true,
      });
    }
    expect(calls.n).toBe(0);
    expect(await effectCount(key)).toBe(1);
    expect(await guardRow(key)).toMatchObject({ fence: '5', status: 'done', response_status: 201 }); // a replay writes nothing
  });

  it('a key not done yet is still refused to a lower fence after a higher one was admitted', async () => {
    const key = newKey('not-done-order');
    expect((await guard.run(key, '5', effect(key, 503))).verdict).toBe('not_stored');
    expect((await guard.run(key, '7', effect(key, 503))).verdict).toBe('not_stored');
    const calls = { n: 0 };
    expect(await guard.run(key, '6', effect(key, 201, calls))).toEqual({
      status: 409,
      body: { error: 'stale_fence', highest: '7' },
      verdict: 'stale_fence',
      replayed: false,
    });
    expect(calls.n).toBe(0);
    expect((await guard.run(key, '7', effect(key))).verdict).toBe('applied');
    expect((await guard.run(key, '6', effect(key, 201, calls))).verdict).toBe('replayed');
    expect(await effectCount(key)).toBe(1);
  });
});

describe('fence guard: what was sent', () => {
  it("a repeated key with another request fingerprint is 422 idempotency_key_reused, never another request's answer", async () => {
    const key = newKey('reused');
    const first = await guard.run(key, '3', effect(key), { fingerprint: 'sha-a' });
    expect(first.verdict).toBe('applied');
    const calls = { n: 0 };
    for (const fence of ['3', '9', '1']) {
      expect(await guard.run(key, fence, effect(key, 201, calls), { fingerprint: 'sha-b' })).toEqual({
        status: 422,
        body: { error: 'idempotency_key_reused' },
        verdict: 'idempotency_key_reused',
        replayed: false,
      });
    }
    expect(await guard.run(key, '3', effect(key, 201, calls), { fingerprint: 'sha-a' })).toMatchObject({
      verdict: 'replayed',
      body: first.body,
    });
    // A caller that sends no fingerprint is not compared (documented on RunOptions.fingerprint: the programmatic
    // caller that retries its own request under its key passes none and gets the stored answer).
    expect(await guard.run(key, '3', effect(key, 201, calls))).toMatchObject({ verdict: 'replayed', body: first.body });
    expect(calls.n).toBe(0);
    expect(await effectCount(key)).toBe(1);
  });

  it('a key whose effect never happened takes the next request whatever its fingerprint', async () => {
    const key = newKey('reused-after-5xx');
    expect((await guard.run(key, '1', effect(key, 503), { fingerprint: 'sha-a' })).verdict).toBe('not_stored');
    expect((await guard.run(key, '1', effect(key), { fingerprint: 'sha-b' })).verdict).toBe('applied');
    expect((await guard.run(key, '1', effect(key), { fingerprint: 'sha-a' })).verdict).toBe('idempotency_key_reused');
    expect(await effectCount(key)).toBe(1);
  });

  it.each([[''], ['x'.repeat(300)], [42]])('refuses a fingerprint %s with a typed error and writes nothing', async (fingerprint) => {
    const before = await rowCount();
    const err = await guard.run(newKey('bad-fp'), '1', effect('x'), { fingerprint: fingerprint as string }).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'invalid_input', path: 'fingerprint' });
    expect(await rowCount()).toBe(before);
  });
});

describe('fence guard: replay and 5xx', () => {
  it('a repeated key replays the stored response without calling the handler', async () => {
    const key = newKey('replay');
    const calls = { n: 0 };
    const first = await guard.run(key, '1', async (tx) => {
      calls.n += 1;
      await tx.query('INSERT INTO app_effects (key) VALUES ($1)', [key]);
      return { status: 201, body: { created: true, items: [1, 2, 3], note: null } };
    });
    expect(first).toEqual({ status: 201, body: { created: true, items: [1, 2, 3], note: null }, verdict: 'applied', replayed: false });
    const again: GuardResult = await guard.run(key, '1', effect(key, 200, calls));
    expect(again).toEqual({ status: 201, body: { created: true, items: [1, 2, 3], note: null }, verdict: 'replayed', replayed: true });
    expect(calls.n).toBe(1);
    expect(await effectCount(key)).toBe(1);
    expect(await guardRow(key)).toMatchObject({ fence: '1', status: 'done', response_status: 201 });
  });

  it('stores a 4xx answer (a definite answer) and replays it', async () => {
    const key = newKey('4xx');
    const calls = { n: 0 };
    const first = await guard.run(key, '1', async () => {
      calls.n += 1;
      return { status: 422, body: { error: 'bad_invoice' } };
    });
    expect(first.verdict).toBe('applied');
    expect(
      await guard.run(key, '1', async () => {
        calls.n += 1;
        return { status: 200, body: {} };
      }),
    ).toMatchObject({ verdict: 'replayed', status: 422, body: { error: 'bad_invoice' } });
    expect(calls.n).toBe(1);
  });

  it('a 5xx is not stored and its write is rolled back; a retry runs the handler again', async () => {
    const key = newKey('5xx');
    const calls = { n: 0 };
    const failed = await guard.run(key, '4', effect(key, 503, calls));
    expect(failed).toMatchObject({ status: 503, verdict: 'not_stored', replayed: false });
    expect(await effectCount(key)).toBe(0);
    const retried = await guard.run(key, '4', effect(key, 201, calls));
    expect(retried).toMatchObject({ status: 201, verdict: 'applied' });
    expect(calls.n).toBe(2);
    expect(await effectCount(key)).toBe(1);
    expect((await guard.run(key, '4', effect(key, 201, calls))).verdict).toBe('replayed');
    expect(calls.n).toBe(2);
  });

  it('a handler that throws: the error propagates, its write is rolled back, nothing stored', async () => {
    const key = newKey('throws');
    const boom = new Error('boom');
    await expect(
      guard.run(key, '2', async (tx) => {
        await tx.query('INSERT INTO app_effects (key) VALUES ($1)', [key]);
        throw boom;
      }),
    ).rejects.toBe(boom);
    expect(await effectCount(key)).toBe(0);
    expect(await guardRow(key)).toMatchObject({ fence: '2', status: 'in_progress' });
    expect((await guard.run(key, '2', effect(key))).verdict).toBe('applied');
  });

  it('a handler whose SQL fails inside the transaction is rolled back to the savepoint', async () => {
    const key = newKey('sql-error');
    await expect(
      guard.run(key, '1', async (tx) => {
        await tx.query('INSERT INTO app_effects (key) VALUES ($1)', [key]);
        await tx.query('SELECT * FROM no_such_table');
        return { status: 200, body: {} };
      }),
    ).rejects.toMatchObject({ code: '42P01' });
    expect(await effectCount(key)).toBe(0);
    expect((await guard.run(key, '1', effect(key))).verdict).toBe('applied');
    expect(await effectCount(key)).toBe(1);
  });

  it('an invalid handler response is a typed error and its write is rolled back', async () => {
    const key = newKey('bad-response');
    await expect(
      guard.run(key, '1', async (tx) => {
        await tx.query('INSERT INTO app_effects (key) VALUES ($1)', [key]);
        return { status: 99, body: {} };
      }),
    ).rejects.toBeInstanceOf(InvalidHandlerResponseError);
    await expect(guard.run(key, '1', async () => ({ status: 200, body: { n: 1n } }))).rejects.toMatchObject({
      code: 'invalid_input',
      path: 'response.body.n',
    });
    expect(await effectCount(key)).toBe(0);
  });

  it.each([
    ['\\u0000 in a string', { note: 'a\u0000b' }],
    ['a lone surrogate', { note: '\ud800' }],
    ['\\u0000 in a key', { 'a\u0000': 1 }],
    ['a Date (changed by a round trip)', { at: new Date(0) }],
  ])(
    'a response body that cannot be stored (%s) is InvalidHandlerResponseError; the write is rolled back, the fence kept',
    async (_label, body) => {
      const key = newKey('unstorable');
      const err = await guard
        .run(key, '4', async (tx) => {
          await tx.query('INSERT INTO app_effects (key) VALUES ($1)', [key]);
          return { status: 201, body };
        })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(InvalidHandlerResponseError);
      expect(err).toMatchObject({ code: 'invalid_input', path: expect.stringMatching(/^response\.body\./) });
      expect(await effectCount(key)).toBe(0);
      expect(await guardRow(key)).toMatchObject({ fence: '4', status: 'in_progress' });
      expect((await guard.run(key, '4', effect(key))).verdict).toBe('applied');
    },
  );
});

describe("fence guard: the handler's own SQL error", () => {
  it("a data exception (class 22) raised by the handler's own statement is rethrown as it is, not relabelled as an unstorable body", async () => {
    const key = newKey('handler-22');
    const err = await guard
      .run(key, '5', async (tx) => {
        await tx.query('INSERT INTO app_effects (key) VALUES ($1)', [key]);
        await tx.query("SELECT 'not a number'::int");
        return { status: 201, body: {} };
      })
      .catch((e: unknown) => e);
    expect(err).not.toBeInstanceOf(InvalidHandlerResponseError);
    expect(err).toMatchObject({ code: '22P02' });
    expect(await effectCount(key)).toBe(0);
    expect(await guardRow(key)).toMatchObject({ fence: '5', status: 'in_progress' });
  });
});

describe('fence guard: a handler that ends the transaction', () => {
  it.each([
    [
      'COMMIT and returns',
      async (tx: pg.ClientBase) => {
        await tx.query('COMMIT');
      },
    ],
    [
      'COMMIT, swallows the error and returns',
      async (tx: pg.ClientBase) => {
        await tx.query('COMMIT').catch(() => {});
      },
    ],
    [
      'COMMIT then BEGIN',
      async (tx: pg.ClientBase) => {
        await tx.query('COMMIT').catch(() => {});
        await tx.query('BEGIN');
      },
    ],
    [
      'ROLLBACK and returns',
      async (tx: pg.ClientBase) => {
        await tx.query('ROLLBACK');
      },
    ],
  ])('a handler that runs %s fails before its effect is kept; a retry applies once', async (_label, end) => {
    for (const earlier of [false, true]) {
      const key = newKey('commits');
      // With and without a row left by an earlier attempt (an autocommitted UPDATE must not mark it done).
      if (earlier) expect((await guard.run(key, '1', effect(key, 503))).verdict).toBe('not_stored');
      const err = await guard
        .run(key, '2', async (tx) => {
          await tx.query('INSERT INTO app_effects (key) VALUES ($1)', [key]);
          await end(tx);
          return { status: 201, body: { ok: true } };
        })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(HandlerEndedTransactionError);
      expect(err).toMatchObject({ code: 'invalid_input', path: 'handler' });
      expect(await effectCount(key)).toBe(0);
      expect((await guardRow(key))?.status ?? 'absent').not.toBe('done');
      expect((await guard.run(key, '2', effect(key))).verdict).toBe('applied');
      expect(await effectCount(key)).toBe(1);
    }
  });

  it("a handler's own transaction-control mistake inside the transaction is its own error, not HandlerEndedTransactionError", async () => {
    const key = newKey('own-savepoint');
    const err = await guard
      .run(key, '1', async (tx) => {
        await effect(key)(tx);
        await tx.query('ROLLBACK TO SAVEPOINT never_made');
        return { status: 201, body: {} };
      })
      .catch((e: unknown) => e);
    expect(err).not.toBeInstanceOf(HandlerEndedTransactionError);
    expect(err).toMatchObject({ code: '3B001' });
    expect(await effectCount(key)).toBe(0);
    expect((await guard.run(key, '1', effect(key))).verdict).toBe('applied');
  });

  it('the pool is healthy afterwards (the client was not left inside a transaction)', async () => {
    const key = newKey('after-commit');
    await guard
      .run(key, '1', async (tx) => {
        await tx.query('COMMIT').catch(() => {});
        await tx.query('BEGIN');
        return { status: 200, body: {} };
      })
      .catch(() => {});
    const states = await Promise.all(
      Array.from({ length: 16 }, async () => {
        const c = await pool.connect();
        try {
          return (await c.query<{ s: string }>("SELECT CASE WHEN now() = statement_timestamp() THEN 'idle' ELSE 'in_tx' END AS s")).rows[0]
            ?.s;
        } finally {
          c.release();
        }
      }),
    );
    expect(states.every((s) => s === 'idle')).toBe(true);
  });
});

describe('fence guard: bad input', () => {
  it.each([['abc'], ['-1'], ['1.5'], [' 1'], ['1e3'], [''], ['0x10'], ['9223372036854775808'], [-1n], [42], [null]])(
    'refuses fence %s with a typed error and writes nothing',
    async (fence) => {
      const before = await rowCount();
      const calls = { n: 0 };
      const err = await guard.run(newKey('bad-fence'), fence as string, effect('x', 201, calls)).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(InvalidFenceError);
      expect(err).toBeInstanceOf(RatchetError);
      expect(err).toMatchObject({ code: 'invalid_input', path: 'fence' });
      expect(calls.n).toBe(0);
      expect(await rowCount()).toBe(before);
    },
  );

  it.each([
    ['empty', ''],
    ['513 characters', 'x'.repeat(513)],
    ['with a newline', 'a\nb'],
    ['undefined', undefined],
  ])('refuses a key (%s) with a typed error and writes nothing', async (_label, key) => {
    const before = await rowCount();
    const err = await guard.run(key as string, '1', effect('x')).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InvalidIdempotencyKeyError);
    expect(err).toMatchObject({ code: 'invalid_input', path: 'idempotencyKey' });
    expect(await rowCount()).toBe(before);
  });

  it('refuses a schema name that is not a plain identifier', () => {
    expect(() => createFenceGuard(pool, { schema: 'x"; DROP TABLE y; --' })).toThrow(
      expect.objectContaining({ code: 'invalid_input', path: 'opts.schema' }),
    );
  });

  it('a guard in another schema keeps its own table', async () => {
    const other = createFenceGuard(pool, { schema: 'receiver_two' });
    await other.migrate();
    const key = newKey('schema');
    expect((await other.run(key, '1', effect(key))).verdict).toBe('applied');
    expect((await guard.run(key, '1', async () => ({ status: 200, body: 'main' }))).verdict).toBe('applied');
    expect(await db.query('SELECT key FROM receiver_two.effects WHERE key = $1', [key])).toHaveLength(1);
  });
});

describe('fence guard: migrate', () => {
  it('upgrades a table made by an earlier version in place: its done keys still replay, new keys get the commit check', async () => {
    // The DDL of the first version, with one done row in it.
    await db.query('CREATE SCHEMA receiver_v1');
    await db.query(`CREATE TABLE receiver_v1.effects (key text PRIMARY KEY, fence bigint NOT NULL CHECK (fence >= 0),
      status text NOT NULL CHECK (status IN ('in_progress', 'done')), response_status int CHECK (response_status BETWEEN 200 AND 499),
      response_body jsonb, updated_at timestamptz NOT NULL DEFAULT now(), CHECK ((status = 'done') = (response_status IS NOT NULL)))`);
    await db.query(
      `INSERT INTO receiver_v1.effects (key, fence, status, response_status, response_body) VALUES ('old', 9, 'done', 201, '{"id": 1}')`,
    );
    const upgraded = createFenceGuard(pool, { schema: 'receiver_v1' });
    await Promise.all([upgraded.migrate(), upgraded.migrate()]);
    await upgraded.migrate();
    expect(await upgraded.run('old', '3', effect('old'), { fingerprint: 'any' })).toMatchObject({
      verdict: 'replayed',
      status: 201,
      body: { id: 1 },
    });
    const key = newKey('upgraded');
    const err = await upgraded
      .run(key, '1', async (tx) => {
        await effect(key)(tx);
        await tx.query('COMMIT');
        return { status: 201, body: {} };
      })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(HandlerEndedTransactionError);
    expect(await effectCount(key)).toBe(0);
    expect((await upgraded.run(key, '1', effect(key), { fingerprint: 'f' })).verdict).toBe('applied');
    expect((await db.query('SELECT request_hash FROM receiver_v1.effects WHERE key = $1', [key]))[0]?.request_hash).toBe('f');
  });
});
