import { Command, CommanderError } from 'commander';
import { openStore } from '../store/index.js';
import { RatchetError } from '../errors.js';
import { registerRunCommand } from './commands/run.js';
import { registerWorkerCommand } from './commands/worker.js';
import { EXIT } from './exit-codes.js';

/**
 * Exit codes (src/cli/exit-codes.ts, documented in the README): 0 ok (`run`: the run succeeded),
 * 1 unexpected, 2 bad usage / input / definitions or a locked data directory (nothing persisted),
 * 3 unknown run, 4 database unavailable, 5 `run`: the run failed, was cancelled or expired,
 * 6 `run`: --timeout passed before the run ended, 130 `run`: interrupted.
 */
export { EXIT };

const program = new Command('ratchet')
  .description('Durable, staged workflow engine for LLM agents and tool pipelines')
  .option('--database-url <url>', 'PostgreSQL URL (env DATABASE_URL); unset = embedded PGlite')
  .option('--data-dir <dir>', 'embedded data directory (env RATCHET_DATA_DIR)', undefined)
  .option('--json', 'print JSON instead of text', false)
  .exitOverride(); // usage errors become exit 2 below, like every other bad input

const storeOptions = () => {
  const o = program.opts<{ databaseUrl?: string; dataDir?: string }>();
  return { databaseUrl: o.databaseUrl ?? process.env.DATABASE_URL ?? undefined, dataDir: o.dataDir ?? process.env.RATCHET_DATA_DIR ?? undefined };
};
const print = (json: unknown, text: string) => {
  process.stdout.write(program.opts<{ json: boolean }>().json ? `${JSON.stringify(json)}\n` : `${text}\n`);
};

program.command('migrate')
  .description('apply the database migrations (under an advisory lock) and exit')
  .action(async () => {
    const opts = storeOptions();
    const store = await openStore(opts);
    await store.close();
    print({ ok: true, backend: store.kind, dataDir: store.dataDir }, `migrations applied (${store.kind}${store.dataDir ? ` at ${store.dataDir}` : ''})`);
  });

registerRunCommand(program);
registerWorkerCommand(program);

try {
  await program.parseAsync(process.argv);
} catch (err) {
  if (err instanceof CommanderError) {
    // commander has printed its message (or the help / version) already.
    process.exitCode = err.exitCode === 0 ? EXIT.ok : EXIT.invalidInput;
    process.exit();
  }
  const code = err instanceof RatchetError ? err.code : 'unexpected';
  const json = program.opts<{ json: boolean }>().json;
  process.stderr.write(json ? `${JSON.stringify({ error: { code, message: (err as Error).message } })}\n` : `ratchet: ${(err as Error).message}\n`);
  process.exitCode = code === 'invalid_input' || code === 'invalid_definition' || code === 'data_dir_locked' ? EXIT.invalidInput
    : code === 'unknown_run' ? EXIT.unknownRun
    : code === 'database_unavailable' ? EXIT.databaseUnavailable : EXIT.unexpected;
}
