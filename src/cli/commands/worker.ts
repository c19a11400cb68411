import type { Command } from 'commander';
import type { Ratchet } from '../../engine.js';
import { InvalidInputError } from '../../errors.js';
import type { Worker } from '../../worker/worker.js';

interface WorkerCommandOptions {
  classes?: string;
  concurrency: string;
  workflowsDir: string;
  redisUrl?: string;
  grace: string;
  name?: string;
  retention?: string;
  databaseUrl?: string;
  dataDir?: string;
  metricsPort?: string;
  metricsHost: string;
  json: boolean;
}

const int = (value: string, flag: string, min: number, max: number): number => {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min || n > max)
    throw new InvalidInputError(`${flag} must be a whole number in ${min}..${max}`, flag.replace(/^--/, ''));
  return n;
};

/** `--retention succeeded=7d,failed=30d` as createRatchet's `retention` (which checks the states and ages). */
function retentionOption(value: string | undefined): Record<string, string> | undefined {
  if (!value) return undefined;
  return Object.fromEntries(
    value
      .split(',')
      .map((p) => p.trim())
      .filter(Boolean)
      .map((pair) => {
        const m = /^([a-z]+)=(\S+)$/.exec(pair);
        if (!m) throw new InvalidInputError(`--retention: "${pair}" is not state=age (e.g. succeeded=7d,failed=30d)`, 'retention');
        return [m[1]!, m[2]!];
      }),
  );
}

/**
 * `ratchet worker`: a worker as its own process. Serves the given classes (default: all)
 * from DATABASE_URL, with wake-ups over REDIS_URL (BullMQ) when set; stateless, so any
 * number can run on one or many machines. SIGTERM / SIGINT: stop claiming, let in-flight
 * stages finish within --grace, hand the rest back, exit 0. With --metrics-port it serves its
 * Prometheus metrics (src/observability/metrics.ts) at http://<metrics-host>:<port>/metrics.
 */
export function registerWorkerCommand(program: Command): void {
  program
    .command('worker')
    .description('run a worker process: claim and execute stages of the given tool classes')
    .option('--classes <a,b>', 'tool classes to serve (default: every class of the loaded workflows)')
    .option('--concurrency <n>', 'stages of each class at once in this process', '10')
    .option(
      '--workflows-dir <dir>',
      'where workflow files live (env RATCHET_WORKFLOWS_DIR)',
      process.env.RATCHET_WORKFLOWS_DIR ?? 'workflows',
    )
    .option('--redis-url <url>', 'Redis for BullMQ wake-ups (env REDIS_URL); unset = polling only')
    .option('--grace <ms>', 'on SIGTERM, how long in-flight stages may take before their leases are released', '10000')
    .option('--name <name>', 'a readable prefix for the owner id (default: host name)')
    .option('--metrics-port <port>', 'serve Prometheus metrics at http://<metrics-host>:<port>/metrics (0: any free port)')
    .option('--metrics-host <host>', 'address the metrics server listens on', '127.0.0.1')
    .option(
      '--retention <state=age,...>',
      'keep finished runs this long, e.g. succeeded=7d,failed=30d (env RATCHET_RETENTION); ' +
        'the sweeper prunes older ones with their events (default: keep all)',
    )
    .action(async (_o: unknown, cmd: Command) => {
      const o = cmd.optsWithGlobals<WorkerCommandOptions>();
      const concurrency = int(o.concurrency, '--concurrency', 1, 1000);
      const graceMs = int(o.grace, '--grace', 0, 3_600_000);
      const metricsPort = o.metricsPort === undefined ? null : int(o.metricsPort, '--metrics-port', 0, 65_535);
      const classes = o.classes
        ?.split(',')
        .map((c) => c.trim())
        .filter(Boolean);
      const retention = retentionOption(o.retention || process.env.RATCHET_RETENTION || undefined);
      const [
        { default: pino },
        { createRatchet },
        { processMetrics, serveMetrics },
        { loadDefinitions },
        { createRegistry },
        { servedClasses },
      ] = await Promise.all([
        import('pino'),
        import('../../engine.js'),
        import('../../observability/metrics.js'),
        import('../../definitions/loader.js'),
        import('../../definitions/registry.js'),
        import('../../worker/worker.js'),
      ]);
      const logger = pino({ name: 'ratchet', level: process.env.RATCHET_LOG_LEVEL ?? 'info' }, pino.destination(2));
      // What can be refused is refused before the store opens (nothing created, no migration): the workflows and
      // the classes asked for, then the metrics port (its server needs only the process's metrics).
      const { workflows, schedules } = await loadDefinitions(o.workflowsDir);
      servedClasses(createRegistry(workflows), classes);
      const metrics =
        metricsPort === null ? null : await serveMetrics(processMetrics().registry, { port: metricsPort, host: o.metricsHost });
      let ratchet: Ratchet | null = null;
      let worker: Worker;
      try {
        ratchet = await createRatchet({
          databaseUrl: o.databaseUrl || process.env.DATABASE_URL || undefined,
          dataDir: o.dataDir || process.env.RATCHET_DATA_DIR || undefined,
          redisUrl: o.redisUrl || process.env.REDIS_URL || undefined,
          workflows,
          schedules, // even []: this process says which schedules its files define (as workflowsDir would)
          logger,
          ...(retention ? { retention } : {}),
        });
        worker = ratchet.worker({ classes, concurrency, graceMs, name: o.name });
        await worker.start();
      } catch (err) {
        // Never left running after the error is printed: what started is stopped, the store closed.
        await ratchet?.close().catch(() => {});
        await metrics?.close().catch(() => {});
        throw err;
      }
      const ready = {
        ready: true,
        owner: worker.owner,
        classes: worker.classes,
        transport: ratchet.transport.kind,
        backend: ratchet.store.kind,
        metrics: metrics?.url ?? null,
      };
      const where = `${ratchet.store.kind}, ${ratchet.transport.kind}`;
      process.stdout.write(
        o.json
          ? `${JSON.stringify(ready)}\n`
          : `worker ${worker.owner} serving ${worker.classes.join(', ')} (${where})${metrics ? `, metrics at ${metrics.url}` : ''}\n`,
      );
      await new Promise<void>((resolve) => {
        const stop = (signal: string) => {
          logger.info({ event: 'worker_stopping', signal }, 'stopping');
          process.off('SIGTERM', onTerm);
          process.off('SIGINT', onInt);
          void worker
            .stop()
            .then(() => ratchet.close())
            .then(() => metrics?.close())
            .then(resolve, resolve);
        };
        const onTerm = () => stop('SIGTERM');
        const onInt = () => stop('SIGINT');
        process.on('SIGTERM', onTerm);
        process.on('SIGINT', onInt);
      });
    });
}
