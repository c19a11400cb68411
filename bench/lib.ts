/** Small helpers for the benchmarks in bench/: JSON output, percentiles, scratch databases, CPU, pgbench. */
import { execFile } from 'node:child_process';
import { cpus } from 'node:os';
import { promisify } from 'node:util';
import pg from 'pg';
import type { Queryable } from '../src/store/index.js';

export interface Line {
  metric: string;
  variant: string;
  value: number | boolean | null;
  unit: string;
  info?: Record<string, unknown>;
}

/** One JSON line on stdout per figure; everything else goes to stderr. */
export function emit(bench: string, line: Line): void {
  process.stdout.write(`${JSON.stringify({ bench, ...line })}\n`);
}

export const log = (msg: string): void => void process.stderr.write(`[${new Date().toISOString().slice(11, 19)}] ${msg}\n`);

/** Nearest-rank percentile (p in 0..100) of unsorted samples; null when there are none. */
export function percentile(samples: readonly number[], p: number): number | null {
  if (samples.length === 0) return null;
  const sorted = [...samples].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!;
}

export const round = (v: number, digits = 2): number => Math.round(v * 10 ** digits) / 10 ** digits;

/** The URL of database `name` on the server of `adminUrl`. */
export function dbUrl(adminUrl: string, name: string): string {
  const u = new URL(adminUrl);
  u.pathname = `/${name}`;
  return u.toString();
}

async function admin<T>(adminUrl: string, fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client({ connectionString: adminUrl });
  await c.connect();
  try {
    return await fn(c);
  } finally {
    await c.end();
  }
}

const safeName = (name: string) => {
  if (!/^[a-z_][a-z0-9_]{0,62}$/.test(name)) throw new Error(`unsafe database name ${name}`);
  return name;
};

/** Creates (or re-creates) an empty scratch database and returns its URL. */
export async function createDb(adminUrl: string, name: string): Promise<string> {
  await admin(adminUrl, async (c) => {
    await c.query(`DROP DATABASE IF EXISTS ${safeName(name)} WITH (FORCE)`);
    await c.query(`CREATE DATABASE ${safeName(name)}`);
  });
  return dbUrl(adminUrl, name);
}

export async function dropDb(adminUrl: string, name: string): Promise<void> {
  await admin(adminUrl, (c) => c.query(`DROP DATABASE IF EXISTS ${safeName(name)} WITH (FORCE)`));
}

/**
 * Inserts `count` single-stage runs, each stage queued and due, in one statement. Run ids are
 * ordered like uuidv7 ids; each stage's idempotency key is unique (run id, seq, tool).
 */
export async function insertQueuedStages(db: Queryable, count: number, toolClass: string): Promise<void> {
  await db.query(
    `
    WITH r AS (
      INSERT INTO ratchet.runs (id, workflow, definition_hash, input, state)
      SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(i), 12, '0'))::uuid, 'bench', 'h', '{}'::jsonb, 'queued'
      FROM generate_series(1, $1::int) AS i
      RETURNING id
    )
    INSERT INTO ratchet.stages (run_id, definition_hash, seq, name, tool, tool_class, state, lease_ms, timeout_ms, max_duration_ms,
      max_attempts, idempotency_key, input, available_at)
    SELECT r.id, 'h', 1, 'noop', 'noop', $2, 'queued', 30000, 30000, 600000, 3, r.id::text || ':1:noop', '{}'::jsonb,
      ratchet.db_now() - interval '1 second'
    FROM r`,
    [count, toolClass],
  );
}

/** Machine-wide CPU counters, for the share of all cores busy between two snapshots. */
export function cpuSnap(): { busy: number; total: number } {
  let busy = 0;
  let total = 0;
  for (const c of cpus()) {
    const t = c.times.user + c.times.nice + c.times.sys + c.times.irq + c.times.idle;
    total += t;
    busy += t - c.times.idle;
  }
  return { busy, total };
}

export function cpuBusyPct(before: { busy: number; total: number }): number {
  const now = cpuSnap();
  const total = now.total - before.total;
  return total > 0 ? round(((now.busy - before.busy) / total) * 100, 1) : 0;
}

/**
 * PostgreSQL's own single-row-update commit rate, measured like shared/peers (m/pgbench.mjs):
 * a fresh database with a 100k-row table, `script`, prepared protocol, `clients` clients.
 */
export async function pgbenchTps(
  adminUrl: string,
  script: string,
  clients: number,
  seconds: number,
): Promise<{ tps: number; xacts: number | null; latencyMs: number | null }> {
  const name = `bench_pgbench_c${clients}`;
  const url = await createDb(adminUrl, name);
  try {
    await admin(url, async (c) => {
      await c.query('CREATE TABLE kv (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0)');
      await c.query('INSERT INTO kv (id) SELECT generate_series(1, 100000)');
      await c.query('VACUUM ANALYZE');
      await c.query('CHECKPOINT');
    });
    const u = new URL(adminUrl);
    const { stdout } = await promisify(execFile)(
      'pgbench',
      [
        '-h',
        u.hostname,
        '-p',
        u.port || '5432',
        '-U',
        decodeURIComponent(u.username),
        '-n',
        '-M',
        'prepared',
        '-c',
        String(clients),
        '-j',
        String(Math.min(clients, 2)),
        '-T',
        String(seconds),
        '-f',
        script,
        name,
      ],
      { encoding: 'utf8' },
    );
    const num = (re: RegExp) => {
      const m = stdout.match(re);
      return m ? Number(m[1]) : null;
    };
    const tps = num(/^tps = ([\d.]+)/m);
    if (tps === null) throw new Error(`could not parse pgbench output:\n${stdout}`);
    return { tps, xacts: num(/transactions actually processed: (\d+)/), latencyMs: num(/latency average = ([\d.]+) ms/) };
  } finally {
    await dropDb(adminUrl, name);
  }
}

interface PlanNode {
  'Node Type': string;
  'Parent Relationship'?: string;
  'Relation Name'?: string;
  'Index Name'?: string;
  Plans?: PlanNode[];
}

/** Walks an EXPLAIN (FORMAT JSON) plan and says whether the claim is served by the partial indexes. */
export function checkClaimPlan(root: PlanNode): Record<string, boolean | string[]> {
  const nodes: { node: PlanNode; underSort: boolean }[] = [];
  const walk = (n: PlanNode, underSort: boolean) => {
    nodes.push({ node: n, underSort });
    // A CTE hangs under the top node as an InitPlan/SubPlan: not an input of a Sort there.
    for (const c of n.Plans ?? []) {
      const input = c['Parent Relationship'] === 'Outer' || c['Parent Relationship'] === 'Inner';
      walk(c, input && (underSort || n['Node Type'] === 'Sort'));
    }
  };
  walk(root, false);
  const indexes = [...new Set(nodes.map((x) => x.node['Index Name']).filter((i): i is string => !!i))];
  const onStages = (n: PlanNode) => n['Relation Name'] === 'stages';
  return {
    uses_queued_idx: indexes.includes('stages_queued_claim_idx'),
    uses_running_idx: indexes.includes('stages_running_lease_idx'),
    seq_scan_on_stages: nodes.some((x) => x.node['Node Type'] === 'Seq Scan' && onStages(x.node)),
    sort_over_stages_scan: nodes.some((x) => x.underSort && onStages(x.node) && /Scan/.test(x.node['Node Type'])),
    indexes,
  };
}
