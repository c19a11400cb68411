/**
 * The peers at 1 and 4 worker processes, in the engine bench's invocation (after run.sh, which installs them): the
 * yardstick for the check "more processes never slower" (issue 14). On a machine whose cores one process already
 * fills, more processes of any Node job runner may cost more CPU per job; this measures how much for graphile-worker
 * (PostgreSQL) and BullMQ (Redis) on the same machine, the same way for each (bench/peer-procs.mjs: the same jobs, the
 * same worker options as run.sh's trials, processes forked, timed from "go" to the last job), in rounds of one pair
 * each, alternating the order (1 then 4, 4 then 1, ...: the machine's speed drifts between minutes).
 */
import { execFileSync } from 'node:child_process';
import { copyFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { log } from './lib.js';

export interface PeerProcsTrial {
  peer: 'graphile' | 'bullmq';
  procs: number;
  concurrency: number;
  jobs: number;
  done: number;
  capped: boolean;
  jobs_per_s: number;
  cpu_ms_per_job: Record<string, number>;
  cpu_busy_pct: number;
}

export interface PeerProcsResult {
  peer: 'graphile' | 'bullmq';
  concurrency: number;
  /** Median jobs/s over the rounds, by process count. */
  median: Record<number, number>;
  /** Median of the rounds' ratios (more processes over 1), each round's pair run back to back (rounds with both trials drained). */
  ratio: number;
  ratios: number[];
  trials: PeerProcsTrial[];
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

/** The peers' scratch directory of ../shared/peers/run.sh (where it installed the pinned packages), or null. */
export function peersScratch(): string | null {
  const dir = process.env.PEERS_SCRATCH ?? join(process.env.TMPDIR ?? tmpdir(), 'peers-bench');
  return existsSync(join(dir, 'node_modules', 'graphile-worker')) && existsSync(join(dir, 'node_modules', 'bullmq')) ? dir : null;
}

export function runPeersMoreProcs(opts: {
  /** The PostgreSQL server (any database: the script makes its own, peer_ratchet_procs). */
  pgUrl: string;
  redisUrl: string;
  /** Rounds of each point; a round is a pair (1 process, `procs` processes), in the order 1-N, N-1, 1-N, ... */
  rounds: number;
  procs: number;
  points: { peer: 'graphile' | 'bullmq'; concurrency: number; jobs: number }[];
}): PeerProcsResult[] {
  const dir = peersScratch();
  if (!dir) {
    log('peers, more processes: skipped (run.sh has not installed graphile-worker and BullMQ in its scratch directory)');
    return [];
  }
  const script = join(dir, 'ratchet-peer-procs.mjs');
  copyFileSync(fileURLToPath(new URL('./peer-procs.mjs', import.meta.url)), script);
  const server = new URL(opts.pgUrl);
  server.pathname = ''; // lib.mjs's PEERS_PG_URL: the server, without a database (lib.mjs appends /<db>)
  server.search = '';
  const env = { ...process.env, PEERS_PG_URL: server.toString().replace(/\/$/, ''), PEERS_REDIS_URL: opts.redisUrl };
  const trial = (p: (typeof opts.points)[number], procs: number): PeerProcsTrial | null => {
    try {
      const line = execFileSync(process.execPath, [script, p.peer, String(procs), String(p.concurrency), String(p.jobs)], {
        cwd: dir,
        env,
        encoding: 'utf8',
        stdio: ['ignore', 'pipe', 'inherit'],
        timeout: 300_000,
      })
        .trim()
        .split('\n')
        .pop()!;
      return JSON.parse(line) as PeerProcsTrial;
    } catch (err) {
      log(`peers, more processes: ${p.peer} c=${p.concurrency} ${procs} proc(s) failed: ${(err as Error).message.split('\n')[0]}`);
      return null;
    }
  };
  const out: PeerProcsResult[] = [];
  for (const p of opts.points) {
    const pairs: { one: PeerProcsTrial | null; more: PeerProcsTrial | null }[] = [];
    const all: PeerProcsTrial[] = []; // every trial that answered, capped ones included (with their flag)
    for (let round = 0; round < opts.rounds; round++) {
      const pair: (typeof pairs)[number] = { one: null, more: null };
      for (const n of round % 2 === 0 ? [1, opts.procs] : [opts.procs, 1]) {
        const t = trial(p, n);
        if (t)
          log(
            `peers, more processes: ${p.peer} c=${p.concurrency} ${n} proc(s), round ${round + 1}: ${t.jobs_per_s} jobs/s, cpu ms/job ${JSON.stringify(t.cpu_ms_per_job)}${t.capped ? ` (capped: ${t.done} of ${t.jobs} jobs)` : ''}`,
          );
        if (t) all.push(t);
        pair[n === 1 ? 'one' : 'more'] = t && !t.capped ? t : null; // a capped trial is no drain: left out of the medians
      }
      pairs.push(pair);
    }
    const whole = pairs.filter((x) => x.one && x.more) as { one: PeerProcsTrial; more: PeerProcsTrial }[];
    if (whole.length === 0) {
      log(`peers, more processes: ${p.peer} c=${p.concurrency}: no round with both trials drained`);
      continue;
    }
    const ratios = whole.map((x) => Math.round((x.more.jobs_per_s / x.one.jobs_per_s) * 1000) / 1000);
    out.push({
      peer: p.peer,
      concurrency: p.concurrency,
      median: { 1: median(whole.map((x) => x.one.jobs_per_s)), [opts.procs]: median(whole.map((x) => x.more.jobs_per_s)) },
      ratio: Math.round(median(ratios) * 1000) / 1000,
      ratios,
      trials: all,
    });
  }
  return out;
}
