import type { Command } from 'commander';
import type { ServeOptions } from '../api/serve.js';
import { withServeOptions } from '../api/serve-options.js';

/**
 * `ratchet serve`: the task API over DATABASE_URL (or the embedded store; then nothing runs
 * the stages unless a worker shares the process: use `ratchet dev`). Workers are separate
 * processes (`ratchet worker`). Refuses a non-loopback --host without a token.
 */
export function registerServeCommand(program: Command): void {
  withServeOptions(
    program.command('serve').description('serve the task API (HTTP): submit, status, list, events, explain, cancel, retry'),
  ).action(async (_o: unknown, cmd: Command) => {
    const [{ serveUntilSignal }, { cliLogger }] = await Promise.all([import('../api/serve.js'), import('../api/options.js')]);
    await serveUntilSignal(cmd.optsWithGlobals<ServeOptions>(), cliLogger('info'), { worker: false, graceMs: 0 });
  });
}
