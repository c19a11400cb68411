import type { Command } from 'commander';
import type { ServeOptions } from '../api/serve.js';
import { withServeOptions } from '../api/serve-options.js';

/** How long in-flight stages may take on Ctrl-C before their leases are handed back. */
const DEV_GRACE_MS = 5000;

/**
 * `ratchet dev`: everything in one process for a laptop — the embedded database (or
 * DATABASE_URL), a worker serving every class of the loaded workflows, and the task API on
 * 127.0.0.1:7700. Ctrl-C stops it gracefully.
 */
export function registerDevCommand(program: Command): void {
  withServeOptions(program.command('dev').description('embedded database, a worker and the task API in one process')).action(
    async (_o: unknown, cmd: Command) => {
      const [{ serveUntilSignal }, { cliLogger }] = await Promise.all([import('../api/serve.js'), import('../api/options.js')]);
      await serveUntilSignal(cmd.optsWithGlobals<ServeOptions>(), cliLogger('warn'), { worker: true, graceMs: DEV_GRACE_MS });
    },
  );
}
