import type { Command } from 'commander';
import { cliLogger } from '../api/options.js';
import { serveUntilSignal, type ServeOptions } from '../api/serve.js';

/**
 * `ratchet serve`: the task API over DATABASE_URL (or the embedded store; then nothing runs
 * the stages unless a worker shares the process: use `ratchet dev`). Workers are separate
 * processes (`ratchet worker`). Refuses a non-loopback --host without a token.
 */
export function registerServeCommand(program: Command): void {
  program.command('serve')
    .description('serve the task API (HTTP): submit, status, list, events, explain, cancel, retry')
    .option('--host <host>', 'address to listen on (env RATCHET_HOST)', undefined)
    .option('--port <port>', 'port (env RATCHET_PORT; 0 picks a free one)', undefined)
    .option('--body-limit <bytes>', 'largest request body (env RATCHET_BODY_LIMIT)', undefined)
    .option('--workflows-dir <dir>', 'workflow files (env RATCHET_WORKFLOWS_DIR)', undefined)
    .action(async (_o: unknown, cmd: Command) => {
      await serveUntilSignal(cmd.optsWithGlobals<ServeOptions>(), cliLogger('info'), { worker: false, graceMs: 0 });
    });
}
