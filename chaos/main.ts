/**
 * npm run chaos -- --duration <s> --seed <n> [--workers 4] [--rate 3] [--json] [--history file]
 *
 * Runs one seeded chaos soak (chaos/soak.ts) and prints its report; exit 0 when every
 * invariant held, 1 when one broke (the report names it, with evidence), 2 on bad arguments.
 * Everything runs on loopback with a private PostgreSQL and Redis it removes afterwards.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { check } from './checker.js';
import { Command, InvalidArgumentError } from 'commander';
import { reportJson, reportText } from './report.js';
import { runSoak, type SoakOutcome } from './soak.js';

const int = (min: number, max: number) => (v: string) => {
  const n = Number(v);
  if (!/^\d+$/.test(v) || n < min || n > max) throw new InvalidArgumentError(`a whole number in ${min}..${max}`);
  return n;
};
const num = (v: string) => {
  const n = Number(v);
  if (!Number.isFinite(n) || n <= 0 || n > 100) throw new InvalidArgumentError('a number in (0, 100]');
  return n;
};

const program = new Command('chaos')
  .description('seeded chaos soak of Ratchet with an invariant checker')
  .option('--duration <s>', 'seconds of faults and submits', int(5, 24 * 3600), 60)
  .option('--seed <n>', 'the seed of every random choice', int(0, 2 ** 32 - 1), 1)
  .option('--workers <n>', 'worker processes', int(2, 32), 4)
  .option('--rate <n>', 'submits per second', num, 3)
  .option('--json', 'print the report as JSON')
  .option('--history <file>', 'write the recorded history (JSON) to this file')
  .option('--quiet', 'no progress lines on stderr')
  .option('--check <file>', 'check a history written by --history again (no soak)')
  .exitOverride((err) => process.exit(err.exitCode === 0 ? 0 : 2));

program.parse();
// Interrupted: exit through process.exit, so the 'exit' hooks stop the workers, the API, Redis and PostgreSQL.
process.once('SIGINT', () => process.exit(130));
process.once('SIGTERM', () => process.exit(143));
const o = program.opts<{
  duration: number;
  seed: number;
  workers: number;
  rate: number;
  json?: boolean;
  history?: string;
  quiet?: boolean;
  check?: string;
}>();
if (o.check) {
  const saved = JSON.parse(readFileSync(o.check, 'utf8')) as Pick<SoakOutcome, 'options' | 'config' | 'history'>;
  const outcome: SoakOutcome = { ...saved, result: check(saved.history, saved.config), workerLogs: '' };
  process.stdout.write(`${o.json ? JSON.stringify(reportJson(outcome), null, 2) : reportText(outcome)}\n`);
  process.exit(outcome.result.ok ? 0 : 1);
}
const t0 = Date.now();
const log = o.quiet ? () => {} : (line: string) => process.stderr.write(`[chaos +${((Date.now() - t0) / 1000).toFixed(1)}s] ${line}\n`);
const outcome = await runSoak({ durationS: o.duration, seed: o.seed, workers: o.workers, rate: o.rate, log });
if (o.history) writeFileSync(o.history, JSON.stringify({ options: outcome.options, config: outcome.config, history: outcome.history }));
if (!outcome.result.ok) process.stderr.write(`${outcome.workerLogs.slice(-30_000)}\n`);
process.stdout.write(`${o.json ? JSON.stringify(reportJson(outcome), null, 2) : reportText(outcome)}\n`);
process.exit(outcome.result.ok ? 0 : 1);
