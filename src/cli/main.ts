#!/usr/bin/env node
import { Command, CommanderError } from 'commander';
import { RatchetError } from '../errors.js';
import { registerCommands } from './commands/index.js';
import { EXIT, exitCodeFor } from './exit-codes.js';

/**
 * The `ratchet` command. Only the module of the command on the command line is imported
 * (src/cli/commands/index.ts); every command imports what it runs (the engine, the store, zod,
 * pino, ...) inside its action, so `ratchet --help` and a usage error load commander, this file
 * and the command table only.
 *
 * Exit codes (src/cli/exit-codes.ts, documented in the README): 0 ok (`run`: the run succeeded),
 * 1 unexpected, 2 bad usage / input / definitions or a locked data directory (nothing persisted),
 * 3 unknown run, 4 database unavailable, 5 `run`: the run failed, was cancelled or expired,
 * 6 `run`: --timeout passed before the run ended, 7 conflict with the run's state, 8 token
 * refused, 9 server unreachable, 130 `run`: interrupted.
 */
export { EXIT };

const program = new Command('ratchet')
  .description('Durable, staged workflow engine for LLM agents and tool pipelines')
  .option('--database-url <url>', 'PostgreSQL URL (env DATABASE_URL); unset = embedded PGlite')
  .option('--data-dir <dir>', 'embedded data directory (env RATCHET_DATA_DIR)', undefined)
  .option('--json', 'print JSON instead of text', false)
  .option(
    '--url <url>',
    'a task API server (env RATCHET_URL); unset = the store directly (status, list, events, explain, cancel, retry, run)',
  )
  .option('--token <token>', 'bearer token: sent to --url; accepted by serve / dev (env RATCHET_TOKEN)')
  .exitOverride(); // usage errors become exit 2 below, like every other bad input

// Only the command on the line is imported (src/cli/commands/index.ts): `ratchet --help` loads commander and this table.
await registerCommands(program, process.argv.slice(2));

try {
  await program.parseAsync(process.argv);
} catch (err) {
  if (err instanceof CommanderError) {
    // commander has printed its message (or the help / version) already.
    process.exitCode = err.exitCode === 0 ? EXIT.ok : EXIT.invalidInput;
    process.exit();
  }
  const { ApiError } = await import('../api/errors.js');
  const code = err instanceof RatchetError || err instanceof ApiError ? err.code : 'unexpected';
  const path =
    err instanceof ApiError ? err.path : err instanceof RatchetError && typeof err.details.path === 'string' ? err.details.path : null;
  const json = program.opts<{ json: boolean }>().json;
  process.stderr.write(
    json
      ? `${JSON.stringify({ error: { code, message: (err as Error).message, ...(path ? { path } : {}) } })}\n`
      : `ratchet: ${(err as Error).message}\n`,
  );
  process.exitCode = exitCodeFor(code);
}
