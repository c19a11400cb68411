import { cpSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { drizzle } from 'drizzle-orm/node-postgres';
import { migrate } from 'drizzle-orm/node-postgres/migrator';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { CONCURRENT_INDEXES, MIGRATIONS_FOLDER, migratePostgres } from '../../src/store/migrate.js';
import { until } from '../api/helpers.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * The last migration of the previous release (commit b5e1831, before schedules and
 * priorities). A database at that schema, with runs in flight written the way that release
 * wrote them, takes the new migrations and the new workers finish every run.
 */
const PREVIOUS_RELEASE_LAST = '0005_active_deadline_index';
/** From this migration on, each one is forward-only and safe while older workers run (README, Operations). */
const FORWARD_ONLY_SINCE = '0006';

type Entry = { idx: number; tag: string };
const journal = JSON.parse(readFileSync(join(MIGRATIONS_FOLDER, 'meta/_journal.json'), 'utf8')) as { entries: Entry[] };

const io = defineToolClass({ name: 'upgrade-io', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '5s', maxDuration: '30s' });
const n = z.object({ n: z.number() });
const first = defineTool({
  name: 'upgrade_first',
  description: 'first',
  class: io,
  input: n,
  output: n,
  run: async (i) => ({ n: i.n + 1 }),
});
const second = defineTool({
  name: 'upgrade_second',
  description: 'second',
  class: io,
  input: n,
  output: n,
  run: async (i) => ({ n: i.n * 10 }),
});
const wf = defineWorkflow({ name: 'upgrade', input: n, steps: [{ tool: first }, { tool: second }] });

/** What the previous release wrote for a run of `wf` in a given phase (its columns only, nothing newer). */
async function oldRelease(c: pg.Client, i: number, phase: 'queued' | 'expired_lease' | 'live_lease' | 'second_queued'): Promise<string> {
  const id = `00000000-0000-7000-8000-${String(i).padStart(12, '0')}`;
  const runState = phase === 'queued' ? 'queued' : 'running';
  await c.query(
    `INSERT INTO ratchet.runs (id, workflow, definition_hash, input, state, created_at, updated_at)
    VALUES ($1, 'upgrade', $2, $3, $4, ratchet.db_now(), ratchet.db_now())`,
    [id, wf.hash, JSON.stringify({ n: i }), runState],
  );
  /** One stage row; `more` adds columns (name -> SQL value, parameters from $8 on). */
  const stage = (
    seq: number,
    tool: string,
    state: string,
    stageInput: string | null,
    more: Record<string, string> = {},
    values: unknown[] = [],
  ) =>
    c.query(
      `INSERT INTO ratchet.stages (run_id, definition_hash, seq, name, tool, tool_class, state, lease_ms, timeout_ms, max_duration_ms,
        max_attempts, idempotency_key, input, available_at${Object.keys(more)
          .map((k) => `, ${k}`)
          .join('')})
      VALUES ($1, $2, $3, $4, $4, 'upgrade-io', $5, 3000, 5000, 30000, 3, $6, $7, ratchet.db_now()${Object.values(more)
        .map((v) => `, ${v}`)
        .join('')})`,
      [id, wf.hash, seq, tool, state, `${id}:${seq}:${tool}`, stageInput, ...values],
    );
  const input = JSON.stringify({ n: i });
  if (phase === 'queued') {
    await stage(1, 'upgrade_first', 'queued', input);
    await stage(2, 'upgrade_second', 'pending', null);
  } else if (phase === 'second_queued') {
    await stage(1, 'upgrade_first', 'succeeded', input, { result: '$8::jsonb', attempt: '1', finished_at: 'ratchet.db_now()' }, [
      JSON.stringify({ n: i + 1 }),
    ]);
    await stage(2, 'upgrade_second', 'queued', input); // a step without an input function gets the run's input
  } else {
    // A worker of the old release holds (or held) the first stage's lease, and is gone.
    const leaseMs = phase === 'expired_lease' ? -1000 : 2000;
    await stage(
      1,
      'upgrade_first',
      'running',
      input,
      {
        owner_id: '$8',
        fence: `nextval('ratchet.fence_seq')`,
        attempt: '1',
        lease_until: `ratchet.db_now() + $9::int * interval '1 millisecond'`,
        heartbeat_at: 'ratchet.db_now()',
        claimed_at: 'ratchet.db_now()',
      },
      ['old-release:4242:deadbeef', leaseMs],
    );
    await stage(2, 'upgrade_second', 'pending', null);
  }
  return id;
}

describe('upgrading from the previous release with runs in flight', () => {
  let db: TestDatabase | undefined;
  let r: Ratchet | undefined;
  const dir = mkdtempSync(join(tmpdir(), 'ratchet-upgrade-'));
  afterAll(async () => {
    rmSync(dir, { recursive: true, force: true });
    await r?.close();
    await db?.drop();
  });

  it('applies the new migrations under runs queued, running (lease live or lapsed) and half done; new workers finish them all', async () => {
    const last = journal.entries.find((e) => e.tag === PREVIOUS_RELEASE_LAST);
    expect(last, `${PREVIOUS_RELEASE_LAST} is in the journal`).toBeDefined();
    expect(journal.entries.length, 'this release adds migrations after the previous one').toBeGreaterThan(last!.idx + 1);
    db = await createTestDatabase('upgrade', { empty: true });
    cpSync(MIGRATIONS_FOLDER, dir, { recursive: true });
    writeFileSync(
      join(dir, 'meta/_journal.json'),
      JSON.stringify({ ...journal, entries: journal.entries.filter((e) => e.idx <= last!.idx) }),
    );
    const c = new pg.Client({ connectionString: db.url });
    await c.connect();
    const ids: string[] = [];
    try {
      await migrate(drizzle({ client: c }), { migrationsFolder: dir, migrationsSchema: 'drizzle', migrationsTable: 'ratchet_migrations' });
      const phases = ['queued', 'expired_lease', 'live_lease', 'second_queued'] as const;
      for (let i = 1; i <= 16; i++) ids.push(await oldRelease(c, i, phases[i % 4]!));
    } finally {
      await c.end();
    }

    // The new release starts: its store applies the new migrations to that database.
    r = await createRatchet({ databaseUrl: db.url, workflows: [wf], logger: silentLogger() });
    const [applied] = await db.query(`SELECT count(*)::int AS n FROM drizzle.ratchet_migrations`);
    expect(applied!.n).toBe(journal.entries.length);

    // An older process still writes the old way after the upgrade (a submitter not yet redeployed): the new schema takes it.
    const c2 = new pg.Client({ connectionString: db.url });
    await c2.connect();
    try {
      for (let i = 17; i <= 20; i++) ids.push(await oldRelease(c2, i, 'queued'));
    } finally {
      await c2.end();
    }

    await r.worker({ pollIntervalMs: 50, sweepIntervalMs: 100 }).start();
    await r.store.clock.advance(5000); // the live leases of the dead old worker lapse
    await until(
      'every run succeeded',
      async () => {
        const rows = await db!.query(`SELECT count(*)::int AS n FROM ratchet.runs WHERE state = 'succeeded'`);
        return rows[0]!.n === ids.length;
      },
      45_000,
    );
    for (const [k, id] of ids.entries()) {
      const run = await r.getRun(id);
      expect(run!.result, id).toEqual({ n: (k + 1) * 10 }); // the second step's output on the run's input
      expect(run!.stages.map((s) => s.state)).toEqual(['succeeded', 'succeeded']);
      // The stages the gone old worker held were reclaimed: a later attempt, with a newer fence (at least the second: on a
      // loaded machine the new worker's own 3 s lease may lapse once more, which is a reclaim too, not a defect).
      if (k + 1 <= 16 && [1, 2].includes((k + 1) % 4)) expect(run!.stages[0]!.attempt, id).toBeGreaterThanOrEqual(2);
    }
  });
});

/** Statements an older worker cannot survive: it still reads and writes the old columns and tables. */
const UNSAFE: [RegExp, string][] = [
  [/\bDROP\s+(TABLE|COLUMN|SCHEMA|SEQUENCE|FUNCTION|TYPE|VIEW)\b/i, 'drops something an older worker may use'],
  [/\bRENAME\b/i, 'renames something an older worker names'],
  [/\bALTER\s+COLUMN\s+"?\w+"?\s+(SET\s+DATA\s+)?TYPE\b/i, "changes a column's type under older workers"],
  [/\bSET\s+NOT\s+NULL\b/i, 'makes a column NOT NULL that older workers may leave empty'],
];

describe('migrations are forward-only and safe under running older workers', () => {
  const files = readdirSync(MIGRATIONS_FOLDER)
    .filter((f) => f.endsWith('.sql') && f >= FORWARD_ONLY_SINCE)
    .sort();

  it('every migration since the rule has a file, and the journal lists them in order', () => {
    expect(files.length).toBeGreaterThan(0);
    const tags = journal.entries.map((e) => e.tag);
    expect([...tags].sort()).toEqual(tags);
    for (const f of files) expect(tags).toContain(f.replace(/\.sql$/, ''));
  });

  it.each(files)('%s drops, renames and retypes nothing; a new column is nullable or has a default', (f) => {
    const statements = readFileSync(join(MIGRATIONS_FOLDER, f), 'utf8')
      .replace(/--[^\n]*$/gm, '')
      .split('--> statement-breakpoint');
    for (const s of statements) {
      for (const [pattern, why] of UNSAFE) expect(pattern.test(s), `${f}: ${why}:\n${s.trim()}`).toBe(false);
      for (const add of s.match(/ADD\s+COLUMN[^,;]*/gi) ?? []) {
        if (/NOT\s+NULL/i.test(add))
          expect(/DEFAULT/i.test(add), `${f}: a NOT NULL column without a default breaks older writers:\n${add}`).toBe(true);
      }
      // drizzle runs the pending migrations in one transaction: an index built there blocks every worker's writes for the
      // whole build (behind any ADD COLUMN's lock too). Indexes on the busy tables go to CONCURRENT_INDEXES (src/store/migrate.ts).
      const index = s.match(/CREATE\s+(UNIQUE\s+)?INDEX\b[^;]*?\bON\s+(ONLY\s+)?"?ratchet"?\."?(stages|runs|events)\b/i);
      expect(index, `${f}: builds an index on a busy table inside the migrations' transaction:\n${s.trim()}`).toBeNull();
    }
  });

  it('every index of CONCURRENT_INDEXES is declared in the schema (drizzle-kit keeps it in its snapshot)', () => {
    const schema = readFileSync(join(MIGRATIONS_FOLDER, '..', 'src/store/schema.ts'), 'utf8');
    for (const ix of CONCURRENT_INDEXES) expect(schema, ix.name).toContain(`${ix.unique ? 'uniqueIndex' : 'index'}('${ix.name}')`);
  });
});

describe('the migrator under running workers', () => {
  let db: TestDatabase | undefined;
  const dir = mkdtempSync(join(tmpdir(), 'ratchet-upgrade-lock-'));
  afterAll(async () => {
    rmSync(dir, { recursive: true, force: true });
    await db?.drop();
  });
  const connect = async (name: string) => {
    const c = new pg.Client({ connectionString: db!.url, application_name: name });
    await c.connect();
    return c;
  };
  const validIndexes = async () =>
    (
      await db!.query<{ name: string }>(
        `SELECT c.relname AS name FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE c.relname = ANY($1::text[]) AND i.indisvalid ORDER BY 1`,
        [CONCURRENT_INDEXES.map((x) => x.name)],
      )
    ).map((r) => r.name);

  it('gives way to workers behind a long transaction (lock_timeout, retried), then builds the indexes concurrently', async () => {
    db = await createTestDatabase('upgrade_lock', { empty: true });
    const before = journal.entries.filter((e) => e.tag < '0008');
    cpSync(MIGRATIONS_FOLDER, dir, { recursive: true });
    writeFileSync(join(dir, 'meta/_journal.json'), JSON.stringify({ ...journal, entries: before }));
    const holder = await connect('test-holder');
    const worker = await connect('test-worker');
    const migrator = await connect('test-migrator');
    try {
      await migrate(drizzle({ client: holder }), {
        migrationsFolder: dir,
        migrationsSchema: 'drizzle',
        migrationsTable: 'ratchet_migrations',
      });
      // A long transaction of an older worker has read stages: ADD COLUMN on stages waits for it.
      await holder.query('BEGIN');
      await holder.query('SELECT count(*) FROM ratchet.stages');
      const migrating = migratePostgres(migrator, { lockTimeoutMs: 300 });
      let done = false;
      void migrating.then(() => (done = true)).catch(() => {});
      await until('the migrator waits for a lock', async () => {
        const [w] = await db!.query(
          `SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = 'test-migrator' AND wait_event_type = 'Lock'`,
        );
        return w!.n > 0;
      });
      // A worker's query queued behind the migrator's lock request goes through once that request times out.
      const blocked = Symbol('blocked');
      const got = await Promise.race([
        worker.query('SELECT count(*)::int AS n FROM ratchet.stages').then((r) => r.rows[0].n as number),
        new Promise<symbol>((resolve) => setTimeout(() => resolve(blocked), 15_000)),
      ]);
      expect(got, 'a worker query waited behind the migration for as long as the long transaction lasted').toBe(0);
      expect(done, 'the migration cannot finish while the long transaction holds stages').toBe(false);
      await holder.query('COMMIT');
      await migrating; // retried until the lock was free
      const [applied] = await db.query(`SELECT count(*)::int AS n FROM drizzle.ratchet_migrations`);
      expect(applied!.n).toBe(journal.entries.length);
      expect(await validIndexes()).toEqual(CONCURRENT_INDEXES.map((x) => x.name).sort());
    } finally {
      await Promise.all([holder.end(), worker.end(), migrator.end()]);
    }
  });

  it('builds a missing index again, and drops and rebuilds one a crashed build left INVALID', async () => {
    const [a, b] = CONCURRENT_INDEXES.map((x) => x.name) as [string, string];
    await db!.query(`DROP INDEX ratchet."${a}"`);
    await db!.query(`UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'ratchet."${b}"'::regclass`);
    const all = CONCURRENT_INDEXES.map((x) => x.name).sort();
    expect(await validIndexes()).toEqual(all.filter((x) => x !== a && x !== b));
    const c = await connect('test-migrator-2');
    try {
      await migratePostgres(c);
      await migratePostgres(c); // idempotent
    } finally {
      await c.end();
    }
    expect(await validIndexes()).toEqual(all);
    const [n] = await db!.query(`SELECT count(*)::int AS n FROM pg_class WHERE relname = ANY($1::text[])`, [[a, b]]);
    expect(n!.n).toBe(2);
  });
});
