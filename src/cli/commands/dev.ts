import type { Command } from 'commander';
import { cliLogger } from '../api/options.js';
import { serveUntilSignal, type ServeOptions } from '../api/serve.js';

/** How long in-flight stages may take on Ctrl-C before their leases are handed back. */
const DEV_GRACE_MS = 5000;

/**
 * `ratchet dev`: everything in one process for a laptop — the embedded database (or
 * DATABASE_URL), a worker serving every class of the loaded workflows, and the task API on
 * 127.0.0.1:7700. Ctrl-C stops it gracefully.
 */
export function registerDevCommand(program: Command): void {
  program.command('dev')
    .description('embedded database, a worker and the task API in one process')
    .option('--host <host>', 'address to listen on (env RATCHET_HOST)', undefined)
    .option('--port <port>', 'port (env RATCHET_PORT; 0 picks a free one)', undefined)
    .option('--body-limit <bytes>', 'largest request body (env RATCHET_BODY_LIMIT)', undefined)
    .option('--workflows-dir <dir>', 'workflow files (env RATCHET_WORKFLOWS_DIR)', undefined)
    .action(async (_o: unknown, cmd: Command) => {
      await serveUntilSignal(cmd.optsWithGlobals<ServeOptions>(), cliLogger('warn'), { worker: true, graceMs: DEV_GRACE_MS });
    });
}
