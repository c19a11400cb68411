// The peers at 1 and at N worker processes (bench/engine.ts, "peers, more processes"): does a job runner that fills
// the machine's cores with one process get faster, or slower, with more? Run from the peers' scratch directory
// (../shared/peers/run.sh installs graphile-worker and BullMQ there, pinned), since node resolves packages next
// to the importing file:
//   node peer-procs.mjs graphile|bullmq PROCS CONCURRENCY JOBS PG_ADMIN_URL REDIS_URL
// The parent enqueues JOBS no-op jobs, forks PROCS processes that each run the library's worker at CONCURRENCY (the
// same options as run.sh's own trial), says "go" once all are ready, and times the drain. CPU per job from /proc:
// the worker processes, and PostgreSQL's (graphile) or Redis's (BullMQ) processes. One JSON line on stdout.
import { fork } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const [peer, procsArg, concArg, jobsArg, pgAdminUrl, redisUrl] = process.argv.slice(2);
const role = process.env.PEER_PROCS_ROLE ?? 'parent';
const procs = Number(procsArg);
const concurrency = Number(concArg);
const jobs = Number(jobsArg);
const DB = 'peer_ratchet_procs';
const dbUrl = () => {
  const u = new URL(pgAdminUrl);
  u.pathname = `/${DB}`;
  return u.toString();
};
const redis = () => {
  const u = new URL(redisUrl);
  return { host: u.hostname, port: Number(u.port || 6379) };
};
const QUEUE = 'ratchet-peer-procs';
const PREFIX = 'peers-bench';

async function graphileWorker() {
  const { Logger, run } = await import('graphile-worker');
  const logger = new Logger(() => (level, m) => {
    if (level === 'error') console.error(m);
  });
  // run.sh's graphile trial: defaults otherwise (no local queue, no completion batching)
  const runner = await run({
    connectionString: dbUrl(),
    logger,
    concurrency,
    maxPoolSize: Math.max(10, concurrency + 2),
    pollInterval: 2000,
    noHandleSignals: true,
    taskList: { noop: async () => {} },
  });
  return () => runner.stop();
}

async function bullmqWorker() {
  const { Worker } = await import('bullmq');
  const w = new Worker(QUEUE, async () => {}, { connection: redis(), concurrency, prefix: PREFIX, removeOnComplete: { count: 0 } });
  return () => w.close();
}

if (role === 'worker') {
  process.once('message', async () => {
    const stop = await (peer === 'graphile' ? graphileWorker() : bullmqWorker());
    process.once('message', async () => {
      await stop();
      process.exit(0);
    });
  });
  process.send('ready');
} else {
  const ticks = (pid) => {
    const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
    return Number(f[11]) + Number(f[12]); // utime + stime, clock ticks (100 per second)
  };
  const pidsOf = (prefix) =>
    readdirSync('/proc')
      .filter((p) => /^\d+$/.test(p))
      .filter((p) => {
        try {
          return readFileSync(`/proc/${p}/cmdline`, 'utf8').startsWith(prefix);
        } catch {
          return false;
        }
      });
  const snap = (prefix) => {
    const m = new Map();
    for (const p of pidsOf(prefix)) {
      try {
        m.set(p, ticks(p));
      } catch {}
    }
    return m;
  };
  const since = (before, after) => {
    let t = 0;
    for (const [p, x] of after) t += x - (before.get(p) ?? 0);
    return t;
  };

  let left;
  let close;
  const serverPrefix = peer === 'graphile' ? 'postgres' : 'redis-server';
  if (peer === 'graphile') {
    const { makeWorkerUtils } = await import('graphile-worker');
    const pg = (await import('pg')).default;
    const admin = new pg.Client({ connectionString: pgAdminUrl });
    await admin.connect();
    await admin.query(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`);
    await admin.query(`CREATE DATABASE ${DB}`);
    const utils = await makeWorkerUtils({ connectionString: dbUrl() });
    await utils.migrate();
    for (let i = 0; i < jobs; i += 1000)
      await utils.addJobs(Array.from({ length: Math.min(1000, jobs - i) }, (_, k) => ({ identifier: 'noop', payload: { i: i + k } })));
    const db = new pg.Client({ connectionString: dbUrl() });
    await db.connect();
    left = async () => Number((await db.query('SELECT count(*) FROM graphile_worker._private_jobs')).rows[0].count);
    close = async () => {
      await db.end();
      await utils.release();
      await admin.query(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`);
      await admin.end();
    };
  } else {
    const { Queue } = await import('bullmq');
    const q = new Queue(QUEUE, { connection: redis(), prefix: PREFIX });
    await q.obliterate({ force: true });
    for (let i = 0; i < jobs; i += 1000)
      await q.addBulk(Array.from({ length: Math.min(1000, jobs - i) }, (_, k) => ({ name: 'noop', data: { i: i + k } })));
    left = async () => {
      const c = await q.getJobCounts('wait', 'active', 'prioritized');
      return c.wait + c.active + c.prioritized;
    };
    close = async () => {
      await q.obliterate({ force: true });
      await q.close();
    };
  }

  const me = fileURLToPath(import.meta.url);
  const kids = Array.from({ length: procs }, () =>
    fork(me, process.argv.slice(2), { env: { ...process.env, PEER_PROCS_ROLE: 'worker' }, stdio: ['ignore', 'ignore', 'inherit', 'ipc'] }),
  );
  await Promise.all(kids.map((k) => new Promise((r) => k.once('message', r))));
  const k0 = kids.map((k) => ticks(k.pid));
  const s0 = snap(serverPrefix);
  const busy0 = readFileSync('/proc/stat', 'utf8').split('\n')[0].split(/\s+/).slice(1).map(Number);
  const t0 = performance.now();
  for (const k of kids) k.send('go');
  const capMs = 120_000;
  let remaining = jobs;
  while (remaining > 0 && performance.now() - t0 < capMs) {
    await new Promise((r) => setTimeout(r, 20));
    remaining = await left();
  }
  const s = (performance.now() - t0) / 1000;
  const workers = kids.reduce((a, k, i) => a + ticks(k.pid) - k0[i], 0);
  const server = since(s0, snap(serverPrefix));
  const busy1 = readFileSync('/proc/stat', 'utf8').split('\n')[0].split(/\s+/).slice(1).map(Number);
  const d = busy1.map((x, i) => x - busy0[i]);
  const idle = d[3] + d[4];
  const total = d.reduce((a, x) => a + x, 0);
  for (const k of kids) k.send('stop');
  await Promise.all(kids.map((k) => new Promise((r) => k.once('exit', r))));
  await close();
  const done = jobs - remaining;
  const perJob = (t) => Math.round(((t * 10) / Math.max(done, 1)) * 1000) / 1000; // ticks of 10 ms -> ms per job
  console.log(
    JSON.stringify({
      peer,
      procs,
      concurrency,
      jobs,
      done,
      capped: remaining > 0,
      jobs_per_s: Math.round(done / s),
      cpu_ms_per_job: { workers: perJob(workers), [peer === 'graphile' ? 'postgres' : 'redis']: perJob(server) },
      cpu_busy_pct: Math.round((1 - idle / Math.max(total, 1)) * 1000) / 10,
    }),
  );
  process.exit(0);
}
