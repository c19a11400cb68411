import type { Command } from 'commander';
import { cliLogger } from '../api/options.js';
import { serveUntilSignal, withServeOptions, type ServeOptions } from '../api/serve.js';

/**
 * `ratchet serve`: the task API over DATABASE_URL (or the embedded store; then nothing runs
 * the stages unless a worker shares the process: use `ratchet dev`). Workers are separate
 * processes (`ratchet worker`). Refuses a non-loopback --host without a token.
 */
export function registerServeCommand(program: Command): void {
  withServeOptions(program.command('serve')
    .description('serve the task API (HTTP): submit, status, list, events, explain, cancel, retry'))
    .action(async (_o: unknown, cmd: Command) => {
      await serveUntilSignal(cmd.optsWithGlobals<ServeOptions>(), cliLogger('info'), { worker: false, graceMs: 0 });
    });
}
