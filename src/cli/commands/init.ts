import type { Command } from 'commander';
import type { GlobalOptions } from '../api/options.js';

/**
 * `ratchet init [dir]`: a starter a newcomer can run at once — workflows/hello.ts (a tool
 * class, a pure tool, a fenced tool and a workflow), a tsconfig.json when the folder has none,
 * and the next command to type. Never overwrites: an existing starter file is exit 2 with
 * nothing written.
 */
export function registerInitCommand(program: Command): void {
  program
    .command('init')
    .description('create a starter workflow (workflows/hello.ts) and a tsconfig.json if none exists; never overwrites (exit 2)')
    .argument('[dir]', 'the project folder (created if missing)', '.')
    .action(async (dir: string, _o: unknown, cmd: Command) => {
      const [{ initProject }, { printer }] = await Promise.all([import('../init/init.js'), import('../api/options.js')]);
      const o = cmd.optsWithGlobals<GlobalOptions>();
      const res = await initProject(dir);
      printer(o)(res, () =>
        [
          ...res.created.map((f) => `created ${f}`),
          ...res.kept.map((f) => `kept    ${f} (it exists)`),
          '',
          'next:',
          ...res.next.map((c) => `  ${c}`),
        ].join('\n'),
      );
    });
}
