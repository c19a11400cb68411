import type { Command } from 'commander';
import pino from 'pino';
import { createRatchet } from '../../engine.js';
import { InvalidInputError } from '../../errors.js';
import { processMetrics, serveMetrics } from '../../observability/metrics.js';

interface WorkerCommandOptions {
  classes?: string;
  concurrency: string;
  workflowsDir: string;
  redisUrl?: string;
  grace: string;
  name?: string;
  databaseUrl?: string;
  dataDir?: string;
  metricsPort?: string;
  metricsHost: string;
  json: boolean;
}

const int = (value: string, flag: string, min: number, max: number): number => {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min || n > max) throw new InvalidInputError(`${flag} must be a whole number in ${min}..${max}`, flag.replace(/^--/, ''));
  return n;
};

/**
 * `ratchet worker`: a worker as its own process. Serves the given classes (default: all)
 * from DATABASE_URL, with wake-ups over REDIS_URL (BullMQ) when set; stateless, so any
 * number can run on one or many machines. SIGTERM / SIGINT: stop claiming, let in-flight
 * stages finish within --grace, hand the rest back, exit 0. With --metrics-port it serves its
 * Prometheus metrics (src/observability/metrics.ts) at http://<metrics-host>:<port>/metrics.
 */
export function registerWorkerCommand(program: Command): void {
  program.command('worker')
    .description('run a worker process: claim and execute stages of the given tool classes')
    .option('--classes <a,b>', 'tool classes to serve (default: every class of the loaded workflows)')
    .option('--concurrency <n>', 'stages of each class at once in this process', '10')
    .option('--workflows-dir <dir>', 'where workflow files live (env RATCHET_WORKFLOWS_DIR)', process.env.RATCHET_WORKFLOWS_DIR ?? 'workflows')
    .option('--redis-url <url>', 'Redis for BullMQ wake-ups (env REDIS_URL); unset = polling only')
    .option('--grace <ms>', 'on SIGTERM, how long in-flight stages may take before their leases are released', '10000')
    .option('--name <name>', 'a readable prefix for the owner id (default: host name)')
    .option('--metrics-port <port>', 'serve Prometheus metrics at http://<metrics-host>:<port>/metrics (0: any free port)')
    .option('--metrics-host <host>', 'address the metrics server listens on', '127.0.0.1')
    .action(async (_o: unknown, cmd: Command) => {
      const o = cmd.optsWithGlobals<WorkerCommandOptions>();
      const concurrency = int(o.concurrency, '--concurrency', 1, 1000);
      const graceMs = int(o.grace, '--grace', 0, 3_600_000);
      const metricsPort = o.metricsPort === undefined ? null : int(o.metricsPort, '--metrics-port', 0, 65_535);
      const classes = o.classes?.split(',').map((c) => c.trim()).filter(Boolean);
      const logger = pino({ name: 'ratchet', level: process.env.RATCHET_LOG_LEVEL ?? 'info' }, pino.destination(2));
      const ratchet = await createRatchet({
        databaseUrl: o.databaseUrl || process.env.DATABASE_URL || undefined,
        dataDir: o.dataDir || process.env.RATCHET_DATA_DIR || undefined,
        redisUrl: o.redisUrl || process.env.REDIS_URL || undefined,
        workflowsDir: o.workflowsDir,
        logger,
      });
      const worker = ratchet.worker({ classes, concurrency, graceMs, name: o.name });
      await worker.start();
      const metrics = metricsPort === null ? null
        : await serveMetrics(processMetrics().registry, { port: metricsPort, host: o.metricsHost });
      const ready = {
        ready: true, owner: worker.owner, classes: worker.classes, transport: ratchet.transport.kind, backend: ratchet.store.kind,
        metrics: metrics?.url ?? null,
      };
      const where = `${ratchet.store.kind}, ${ratchet.transport.kind}`;
      process.stdout.write(o.json ? `${JSON.stringify(ready)}\n`
        : `worker ${worker.owner} serving ${worker.classes.join(', ')} (${where})${metrics ? `, metrics at ${metrics.url}` : ''}\n`);
      await new Promise<void>((resolve) => {
        const stop = (signal: string) => {
          logger.info({ event: 'worker_stopping', signal }, 'stopping');
          process.off('SIGTERM', onTerm);
          process.off('SIGINT', onInt);
          void worker.stop().then(() => ratchet.close()).then(() => metrics?.close()).then(resolve, resolve);
        };
        const onTerm = () => stop('SIGTERM');
        const onInt = () => stop('SIGINT');
        process.on('SIGTERM', onTerm);
        process.on('SIGINT', onInt);
      });
    });
}
