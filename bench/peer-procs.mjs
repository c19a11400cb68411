// The peers at 1 and at N worker processes (bench/peers-more-procs.ts): does a job runner that fills the machine's
// cores with one process get faster, or slower, with more? Copied into the peers' scratch directory and run there
// (../shared/peers/run.sh installs graphile-worker and BullMQ there, pinned, next to its lib.mjs):
//   PEERS_PG_URL=postgres://... PEERS_REDIS_URL=redis://... node ratchet-peer-procs.mjs graphile|bullmq PROCS CONCURRENCY JOBS
// The parent enqueues JOBS no-op jobs and forks PROCS processes; each loads the library and builds its worker with the
// options of run.sh's own trial (m/graphile.mjs, m/bullmq.mjs), then says it is ready; on "go" (all at once) they
// start, and the parent times the drain, as run.sh times its one process (from run()/the worker's start to the last
// job). Completions are counted as run.sh counts them, by the library's own completion events, in each worker (sent
// to the parent every 5 ms): nothing polls the database or Redis while it drains. CPU per job from /proc: the worker
// processes, and this database's PostgreSQL backends (graphile) or redis-server (BullMQ). One JSON line on stdout.
import { execFileSync, fork } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { readdirSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Queue, Worker } from 'bullmq';
import { Logger, makeWorkerUtils, run } from 'graphile-worker';
import pg from 'pg';
import { chunks, cpuBusyPct, cpuSnap, dbUrl, dropDb, freshDb, REDIS_URL, sleep } from './lib.mjs';

const [peer, procsArg, concArg, jobsArg] = process.argv.slice(2);
const procs = Number(procsArg);
const concurrency = Number(concArg);
const jobs = Number(jobsArg);
if (!['graphile', 'bullmq'].includes(peer) || ![procs, concurrency, jobs].every((n) => Number.isInteger(n) && n > 0))
  throw new Error('usage: node ratchet-peer-procs.mjs graphile|bullmq PROCS CONCURRENCY JOBS');
const DB = 'peer_ratchet_procs';
const QUEUE = 'ratchet-peer-procs';
const PREFIX = 'peers-bench';
const CAP_MS = 120_000;
const REPORT_MS = 5;
const redis = () => {
  const u = new URL(REDIS_URL);
  return { host: u.hostname, port: Number(u.port || 6379), maxRetriesPerRequest: null };
};
const logger = new Logger(() => (level, m) => {
  if (level === 'error') console.error(m);
});

if (process.env.PEER_PROCS_ROLE === 'worker') {
  process.on('disconnect', () => process.exit(1)); // the parent is gone: never linger on its queue or database
  const fail = (err) => {
    console.error(err);
    process.exit(2); // the parent sees a worker gone before "stop": the trial fails
  };
  // Completed jobs, told to the parent at most every REPORT_MS.
  let completed = 0;
  let told = 0;
  let timer = null;
  const complete = () => {
    completed++;
    timer ??= setTimeout(() => {
      timer = null;
      process.send(completed - told);
      told = completed;
    }, REPORT_MS);
  };
  let worker = null;
  if (peer === 'bullmq') {
    // m/bullmq.mjs: one Worker, concurrency C; removeOnComplete as its jobs' option (below, at the enqueue)
    worker = new Worker(QUEUE, async () => {}, { connection: redis(), concurrency, prefix: PREFIX, autorun: false });
    worker.on('completed', complete);
    await worker.waitUntilReady();
  }
  const events = new EventEmitter();
  events.on('job:complete', ({ error }) => {
    if (!error) complete();
  });
  let started = null;
  process.on('message', async (m) => {
    if (m === 'go') {
      if (peer === 'bullmq') {
        worker.run().catch(fail); // resolves when the worker closes
        started = Promise.resolve(() => worker.close());
      } else
        // m/graphile.mjs runOptions: defaults otherwise (no local queue, no completion batching)
        started = run({
          connectionString: dbUrl(DB),
          logger,
          events,
          concurrency,
          maxPoolSize: Math.max(10, concurrency + 2),
          pollInterval: 2000,
          noHandleSignals: true,
          taskList: { noop: async () => {} },
        }).then((runner) => () => runner.stop(), fail);
    } else if (m === 'stop') {
      try {
        const stop = await started;
        await stop?.();
      } finally {
        process.exit(0);
      }
    }
  });
  process.send('ready');
} else {
  const CLK_TCK = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
  /** utime + stime of a process, ms; 0 once it is gone. */
  const cpuMs = (pid) => {
    try {
      const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
      return ((Number(f[11]) + Number(f[12])) * 1000) / CLK_TCK;
    } catch {
      return 0;
    }
  };
  const pidsNamed = (comm) =>
    readdirSync('/proc')
      .filter((p) => /^\d+$/.test(p))
      .filter((p) => {
        try {
          return readFileSync(`/proc/${p}/comm`, 'utf8').trim() === comm;
        } catch {
          return false;
        }
      })
      .map(Number);

  const kids = [];
  let close = async () => {};
  try {
    let left;
    /** The server's processes that serve this trial, and their CPU before "go". */
    let serverPids;
    if (peer === 'graphile') {
      await freshDb(DB);
      const utils = await makeWorkerUtils({ connectionString: dbUrl(DB), logger });
      const poller = new pg.Client({ connectionString: dbUrl(DB) });
      close = async () => {
        await poller.end().catch(() => {});
        await utils.release().catch(() => {});
        await dropDb(DB);
      };
      await utils.migrate();
      for (const ids of chunks(jobs, 1000)) await utils.addJobs(ids.map((i) => ({ identifier: 'noop', payload: { i } })));
      await poller.connect();
      const pollerPid = (await poller.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
      left = async () => Number((await poller.query('SELECT count(*) FROM graphile_worker.jobs')).rows[0].count); // after the drain only
      // this database's backends at the end, the poller's excluded (the workers' pools keep theirs open)
      serverPids = async () =>
        (await poller.query('SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> $1', [pollerPid])).rows.map((r) =>
          Number(r.pid),
        );
    } else {
      const q = new Queue(QUEUE, { connection: redis(), prefix: PREFIX });
      close = async () => {
        await q.obliterate({ force: true }).catch(() => {});
        await q.close();
      };
      await q.obliterate({ force: true });
      for (const ids of chunks(jobs, 1000))
        await q.addBulk(ids.map((i) => ({ name: 'noop', data: { i }, opts: { removeOnComplete: true, removeOnFail: 1000 } })));
      left = async () => {
        // after the drain only
        const c = await q.getJobCounts('wait', 'active', 'prioritized', 'delayed');
        return c.wait + c.active + c.prioritized + c.delayed;
      };
      serverPids = async () => pidsNamed('redis-server');
    }

    const me = fileURLToPath(import.meta.url);
    for (let i = 0; i < procs; i++)
      kids.push(fork(me, process.argv.slice(2), { env: { ...process.env, PEER_PROCS_ROLE: 'worker' }, stdio: ['ignore', 'ignore', 'inherit', 'ipc'] }));
    await Promise.all(
      kids.map(
        (k) =>
          new Promise((resolve, reject) => {
            k.once('message', resolve);
            k.once('exit', (code) => reject(new Error(`a worker process exited (${code}) before it was ready`)));
          }),
      ),
    );
    let done = 0;
    let gone = null; // a worker process that exited before "stop"
    let finish;
    const drained = new Promise((resolve) => {
      finish = resolve;
    });
    for (const k of kids) {
      k.on('message', (n) => {
        if (typeof n !== 'number') return;
        done += n;
        if (done >= jobs) finish();
      });
      k.once('exit', (code, signal) => {
        gone ??= `a worker process exited (${code ?? signal}) during the trial`;
        finish();
      });
    }
    const cap = setTimeout(() => finish(), CAP_MS);
    const before = new Map([...pidsNamed(peer === 'graphile' ? 'postgres' : 'redis-server'), ...kids.map((k) => k.pid)].map((p) => [p, cpuMs(p)]));
    const machine = cpuSnap();
    const t0 = performance.now();
    for (const k of kids) k.send('go');
    await drained;
    const s = (performance.now() - t0) / 1000;
    const finished = Math.min(done, jobs);
    clearTimeout(cap);
    if (gone !== null) throw new Error(gone);
    const since = (pids) => pids.reduce((a, p) => a + cpuMs(p) - (before.get(p) ?? 0), 0); // a backend started after go: all of it
    const workersMs = since(kids.map((k) => k.pid));
    const serverMs = since(await serverPids());
    const busy = cpuBusyPct(machine);
    // The library's own count agrees: once every job was reported complete, none is left (its delete may commit a moment later).
    let remaining = await left();
    for (let i = 0; finished === jobs && remaining !== 0 && i < 100; i++) {
      await sleep(20);
      remaining = await left();
    }
    if (finished === jobs && remaining !== 0) throw new Error(`${jobs} jobs reported complete, but ${remaining} are left`);
    const perJob = (ms) => Math.round((ms / Math.max(finished, 1)) * 1000) / 1000;
    console.log(
      JSON.stringify({
        peer,
        procs,
        concurrency,
        jobs,
        done: finished,
        capped: finished < jobs,
        jobs_per_s: Math.round(finished / s),
        cpu_ms_per_job: { workers: perJob(workersMs), [peer === 'graphile' ? 'postgres' : 'redis']: perJob(serverMs) },
        cpu_busy_pct: busy,
      }),
    );
  } finally {
    // stop every worker process (killed after 15 s), then drop the database or obliterate the queue
    await Promise.all(
      kids.map(
        (k) =>
          new Promise((resolve) => {
            if (k.exitCode !== null || k.signalCode !== null) return resolve();
            const t = setTimeout(() => k.kill('SIGKILL'), 15_000);
            k.once('exit', () => {
              clearTimeout(t);
              resolve();
            });
            if (k.connected) k.send('stop', () => {});
            else k.kill('SIGKILL');
          }),
      ),
    );
    await close();
  }
  process.exit(0);
}
