/**
 * The peers at 1 and 4 worker processes, in the engine bench's invocation (after run.sh, which installs them): the
 * yardstick for the check "more processes never slower" (issue 14). On a machine whose cores one process already
 * fills, more processes of any Node job runner may cost more CPU per job; this measures how much for graphile-worker
 * (PostgreSQL) and BullMQ (Redis) on the same machine, the same way for each (bench/peer-procs.mjs: the same jobs, the
 * same worker options as run.sh's trials, processes forked, timed from "go" to the last job), in alternating rounds
 * (1, 4, 1, 4, ...: the machine's speed drifts between minutes).
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
  /** Median of the rounds' ratios (more processes over 1), each round's pair run back to back. */
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
  pgAdminUrl: string;
  redisUrl: string;
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
  const out: PeerProcsResult[] = [];
  for (const p of opts.points) {
    const trials: PeerProcsTrial[] = [];
    for (let round = 0; round < opts.rounds; round++)
      for (const procs of [1, opts.procs]) {
        const line = execFileSync(
          process.execPath,
          [script, p.peer, String(procs), String(p.concurrency), String(p.jobs), opts.pgAdminUrl, opts.redisUrl],
          { cwd: dir, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'], timeout: 300_000 },
        )
          .trim()
          .split('\n')
          .pop()!;
        const t = JSON.parse(line) as PeerProcsTrial;
        trials.push(t);
        log(
          `peers, more processes: ${p.peer} c=${p.concurrency} ${procs} proc(s), round ${round + 1}: ${t.jobs_per_s} jobs/s, cpu ms/job ${JSON.stringify(t.cpu_ms_per_job)}${t.capped ? ' (capped)' : ''}`,
        );
      }
    const of = (n: number) => trials.filter((t) => t.procs === n).map((t) => t.jobs_per_s);
    const ratios = of(1).map((one, i) => Math.round((of(opts.procs)[i]! / one) * 1000) / 1000);
    out.push({
      peer: p.peer,
      concurrency: p.concurrency,
      median: { 1: median(of(1)), [opts.procs]: median(of(opts.procs)) },
      ratio: median(ratios),
      ratios,
      trials,
    });
  }
  return out;
}
