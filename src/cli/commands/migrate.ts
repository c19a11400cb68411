import type { Command } from 'commander';
import type { GlobalOptions } from '../api/options.js';

/** `ratchet migrate`: apply the migrations (under an advisory lock) and exit. */
export function registerMigrateCommand(program: Command): void {
  program
    .command('migrate')
    .description('apply the database migrations (under an advisory lock) and exit')
    .action(async (_o: unknown, cmd: Command) => {
      const { openStore } = await import('../../store/index.js');
      const o = cmd.optsWithGlobals<GlobalOptions>();
      const store = await openStore({
        databaseUrl: o.databaseUrl ?? process.env.DATABASE_URL ?? undefined,
        dataDir: o.dataDir ?? process.env.RATCHET_DATA_DIR ?? undefined,
      });
      await store.close();
      const res = { ok: true, backend: store.kind, dataDir: store.dataDir };
      const text = `migrations applied (${store.kind}${store.dataDir ? ` at ${store.dataDir}` : ''})`;
      process.stdout.write(o.json ? `${JSON.stringify(res)}\n` : `${text}\n`);
    });
}
