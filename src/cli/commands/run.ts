import type { Command } from 'commander';
import type { Ratchet } from '../../engine.js';
import { InvalidInputError } from '../../errors.js';
import type { Store } from '../../store/index.js';
import type { Worker } from '../../worker/worker.js';
import { EXIT } from '../exit-codes.js';
import { startExampleServices } from '../run/example-services.js';
import { readRunInput } from '../run/input.js';
import { depNames } from '../api/format.js';
import { jsonReporter, textReporter } from '../run/report.js';
import { watchRun } from '../run/watch.js';
import { priorityOption } from '../run/priority-option.js';

interface RunOptions {
  input: string;
  workflowsDir: string;
  idempotencyKey?: string;
  priority?: string;
  timeout: string;
  poll: string;
  withServices: boolean;
  wait: boolean;
  // global options
  url?: string;
  token?: string;
  databaseUrl?: string;
  dataDir?: string;
  json: boolean;
}

/** How long a stopping worker lets in-flight stages finish before it hands their leases back. */
const STOP_GRACE_MS = 5000;

async function watchTimings(o: RunOptions): Promise<{ timeoutMs: number; intervalMs: number }> {
  const { resolveDuration } = await import('../../definitions/duration.js');
  const timeout = resolveDuration(o.timeout);
  if ('problem' in timeout || timeout.ms <= 0)
    throw new InvalidInputError(`--timeout: ${'problem' in timeout ? timeout.problem : 'must be > 0'}`, 'timeout');
  const intervalMs = Number(o.poll);
  if (!Number.isInteger(intervalMs) || intervalMs < 10 || intervalMs > 60_000)
    throw new InvalidInputError('--poll must be whole milliseconds in 10..60000', 'poll');
  return { timeoutMs: timeout.ms, intervalMs };
}

const backendOf = (store: Store) =>
  store.kind === 'pglite' ? (store.dataDir ? `embedded PGlite at ${store.dataDir}` : 'embedded PGlite in memory') : 'PostgreSQL';

/**
 * `ratchet run <workflow>`: submit one run and drive it to its end in this process (an
 * in-process worker serving every class), printing each stage as it advances. Exit 0 when the
 * run succeeded, 5 when it failed / was cancelled / expired, 6 when --timeout passed first,
 * 130 when interrupted, 2 for bad input (nothing persisted).
 */
async function run(name: string, o: RunOptions): Promise<void> {
  const { timeoutMs, intervalMs } = await watchTimings(o);
  priorityOption(o.priority);
  const input = await readRunInput(o.input);
  const { serverUrl, cliLogger } = await import('../api/options.js');
  if (serverUrl(o)) return runOnServer(name, input, o, timeoutMs);
  const [{ preflight }, { createRatchet }] = await Promise.all([import('../run/preflight.js'), import('../../engine.js')]);
  const { workflows } = await preflight(o.workflowsDir, name, input);
  const report = (o.json ? jsonReporter : textReporter)((line) => process.stdout.write(line));

  const interrupt = new AbortController();
  const onSignal = () => interrupt.abort();
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  let services: Awaited<ReturnType<typeof startExampleServices>> | undefined;
  let ratchet: Ratchet | undefined;
  let worker: Worker | undefined;
  try {
    if (o.withServices) {
      services = await startExampleServices();
      report.services(services.url, services.storage);
    }
    // An empty variable counts as unset (`DATABASE_URL= ratchet run ...`).
    const databaseUrl = o.databaseUrl || process.env.DATABASE_URL || undefined;
    const dataDir = o.dataDir || process.env.RATCHET_DATA_DIR || undefined;
    // Logs go to stderr, errors only by default: stage failures are printed as stage lines
    // (RATCHET_LOG_LEVEL=info shows the lease protocol at work).
    ratchet = await createRatchet({ workflows, databaseUrl, dataDir, logger: cliLogger() });
    worker = ratchet.worker();
    await worker.start();
    const started = Date.now();
    const submitted = await ratchet.submit(name, input, {
      ...(o.idempotencyKey ? { idempotencyKey: o.idempotencyKey } : {}),
      ...priorityOption(o.priority),
    });
    report.submitted({ ...submitted, workflow: name, backend: backendOf(ratchet.store) });
    const r = ratchet;
    const outcome = await watchRun((id) => r.getRun(id), submitted.id, {
      intervalMs,
      timeoutMs,
      signal: interrupt.signal,
      onStage: (stage, run) => report.stage(submitted.id, stage, depNames(stage.deps, run.stages)),
    });
    if (outcome.kind === 'finished') {
      report.finished(outcome.run, Date.now() - started);
      process.exitCode = outcome.run.state === 'succeeded' ? EXIT.ok : EXIT.runFailed;
    } else {
      report.stopped(outcome.kind, submitted.id, outcome.run);
      process.exitCode = outcome.kind === 'timeout' ? EXIT.runTimeout : EXIT.interrupted;
    }
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    await worker?.stop({ graceMs: STOP_GRACE_MS });
    await ratchet?.close();
    await services?.close();
  }
}

/** With --url (or RATCHET_URL): submit to that server; --wait watches the run with the client's poller. */
async function runOnServer(name: string, input: unknown, o: RunOptions, timeoutMs: number): Promise<void> {
  const interrupt = new AbortController();
  const onSignal = () => interrupt.abort();
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    const { runRemote } = await import('../run/remote.js');
    await runRemote(name, input, o, { timeoutMs, signal: interrupt.signal });
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

export function registerRunCommand(program: Command): void {
  program
    .command('run')
    .description('run a workflow to its end in this process (an in-process worker), showing each stage as it advances')
    .argument('<workflow>', 'the workflow name')
    .option('--input <json|@file>', 'the run input: JSON, or @file with JSON (@- reads stdin)', '{}')
    .option('--workflows-dir <dir>', 'the folder of workflow files', 'workflows')
    .option('--idempotency-key <key>', 'submit key: the same key and input give back the same run')
    .option(
      '--priority <n>',
      "the run's priority, -100..100: higher is claimed first within a tool class (default: the workflow's, else 0)",
    )
    .option('--timeout <duration>', 'stop watching after this long (the run is left as it is)', '10m')
    .option('--poll <ms>', 'how often to read the run, in ms', '200')
    .option('--with-services', 'start the example services (examples/services.ts) in this process first', false)
    .option('--wait', 'with --url: watch the run until it ends (without --url the run is always driven to its end in this process)', false)
    .action(async (workflow: string, _opts: unknown, cmd: Command) => {
      await run(workflow, cmd.optsWithGlobals<RunOptions>());
    });
}
