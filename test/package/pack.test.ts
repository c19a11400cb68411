import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensureBuilt, ROOT } from '../helpers/build.js';
import { exec, type ExecResult } from '../helpers/exec.js';

/**
 * The published package, as a plain Node project gets it: `npm pack`, then the tarball installed
 * into a fresh project in a temp folder (nothing else from this repository: no link, no path
 * into it), then, there, a plain .mjs file that imports `ratchet`, `npx ratchet init` and
 * `npx ratchet run`, and `tsc` against the installed type declarations.
 *
 * Offline: `npm install <tarball>` in a project without a lockfile asks the registry for every
 * dependency's metadata, which the npm cache does not hold after `npm ci` (it holds the
 * tarballs, by integrity). So the project gets a lockfile made from this repository's
 * package-lock.json — the same versions `npm ci` installed here, production entries only, plus
 * typescript and @types/node as the project's dev dependencies — and `npm ci --offline`
 * installs it from the cache: a real npm install of the tarball and of its dependencies,
 * never the network.
 */
const tmp = mkdtempSync(join(tmpdir(), 'ratchet-pack-'));
const app = join(tmp, 'app');
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

interface PackFile {
  path: string;
}
interface LockEntry {
  version?: string;
  dev?: boolean;
  devOptional?: boolean;
  optional?: boolean;
  [k: string]: unknown;
}

/** npm's own settings for the children (not the ones `npm test` passes down to its scripts), offline, with this machine's cache. */
const NPM_CACHE = execFileSync('npm', ['config', 'get', 'cache'], { cwd: tmpdir(), encoding: 'utf8' }).trim();
const npmEnv = (): NodeJS.ProcessEnv => {
  const env: NodeJS.ProcessEnv = {};
  for (const name of Object.keys(process.env)) if (/^npm_/i.test(name)) env[name] = undefined;
  return {
    ...env,
    npm_config_cache: NPM_CACHE,
    npm_config_offline: 'true',
    npm_config_audit: 'false',
    npm_config_fund: 'false',
    npm_config_update_notifier: 'false',
  };
};
const run = (file: string, args: string[], timeoutMs = 180_000): Promise<ExecResult> =>
  exec(file, args, { cwd: app, env: npmEnv(), timeoutMs });

/** The consumer's package.json and lockfile: the tarball, its dependencies at this repository's locked versions, and typescript. */
function consumerProject(tarball: string): { pkg: object; lock: object } {
  const ours = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
    version: string;
    license: string;
    engines: Record<string, string>;
    dependencies: Record<string, string>;
    devDependencies: Record<string, string>;
  };
  const locked = (JSON.parse(readFileSync(join(ROOT, 'package-lock.json'), 'utf8')) as { packages: Record<string, LockEntry> }).packages;
  const integrity = `sha512-${createHash('sha512')
    .update(readFileSync(join(app, tarball)))
    .digest('base64')}`;
  const dependencies = { ratchet: `file:${tarball}` };
  const devDependencies = { typescript: ours.devDependencies.typescript!, '@types/node': ours.devDependencies['@types/node']! };
  const packages: Record<string, LockEntry> = {
    '': { name: 'consumer', version: '1.0.0', dependencies, devDependencies },
    'node_modules/ratchet': {
      version: ours.version,
      resolved: `file:${tarball}`,
      integrity,
      license: ours.license,
      dependencies: ours.dependencies,
      bin: { ratchet: 'dist/cli/main.js' },
      engines: ours.engines,
    },
  };
  for (const [path, entry] of Object.entries(locked)) {
    if (!path || entry.dev) continue;
    const { devOptional, ...rest } = entry;
    packages[path] = devOptional ? { ...rest, optional: true } : rest;
  }
  for (const path of ['node_modules/typescript', 'node_modules/@types/node', 'node_modules/undici-types']) {
    const { devOptional: _d, optional: _o, ...rest } = locked[path]!;
    packages[path] = { ...rest, dev: true };
  }
  return {
    pkg: { name: 'consumer', version: '1.0.0', private: true, dependencies, devDependencies },
    lock: { name: 'consumer', version: '1.0.0', lockfileVersion: 3, requires: true, packages },
  };
}

const APP_MJS = `
import { z } from 'zod';
import { createRatchet, defineTool, defineToolClass, defineWorkflow, silentLogger } from 'ratchet';
import { createClient } from 'ratchet/client';
import { createFenceGuard } from 'ratchet/receiver';
import { openStore } from 'ratchet/store';
import { createServer } from 'ratchet/api';

for (const [name, value] of Object.entries({ createClient, createFenceGuard, openStore, createServer })) {
  if (typeof value !== 'function') throw new Error(name + ' is not exported');
}
const cpu = defineToolClass({ name: 'cpu', lease: '30s', heartbeat: '10s', timeout: '10s', maxDuration: '1m' });
const double = defineTool({
  name: 'double', description: 'doubles n', class: cpu,
  input: z.object({ n: z.number() }), output: z.object({ n: z.number() }), run: async ({ n }) => ({ n: n * 2 }),
});
const twice = defineWorkflow({
  name: 'twice', input: z.object({ n: z.number() }),
  steps: [{ tool: double }, { name: 'again', tool: double, input: ({ results }) => results.double }],
});
const ratchet = await createRatchet({ workflows: [twice], logger: silentLogger() });
const worker = ratchet.worker({ pollIntervalMs: 20 });
await worker.start();
const { id } = await ratchet.submit('twice', { n: 21 });
let run;
for (let i = 0; i < 1500; i++) {
  run = await ratchet.getRun(id);
  if (['succeeded', 'failed', 'cancelled', 'expired'].includes(run.state)) break;
  await new Promise((r) => setTimeout(r, 20));
}
await worker.stop();
await ratchet.close();
console.log(JSON.stringify({ state: run.state, result: run.result, backend: ratchet.store.kind, dataDir: ratchet.store.dataDir }));
`;

/** Type-checks imports of every subpath against the installed declarations (the `types` conditions). */
const SUBPATHS_TS = `
import { createRatchet, type Ratchet, type RunView } from 'ratchet';
import { createClient } from 'ratchet/client';
import { createFenceGuard } from 'ratchet/receiver';
import { openStore, type Store } from 'ratchet/store';
import { createServer } from 'ratchet/api';

export async function check(): Promise<void> {
  const r: Ratchet = await createRatchet({ workflowsDir: 'workflows', retention: { succeeded: '7d' } });
  const view: RunView | null = await r.getRun('x');
  const store: Store = r.store;
  void [view, store, createClient, createFenceGuard, openStore, createServer];
}
`;

describe('the published package', () => {
  let files: string[] = [];

  beforeAll(async () => {
    await ensureBuilt();
    mkdirSync(app);
    const packed = JSON.parse(
      execFileSync('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', app], {
        cwd: ROOT,
        encoding: 'utf8',
        env: { ...process.env, ...npmEnv() },
      }),
    ) as { filename: string; files: PackFile[] }[];
    files = packed[0]!.files.map((f) => f.path);
    const { pkg, lock } = consumerProject(packed[0]!.filename);
    writeFileSync(join(app, 'package.json'), `${JSON.stringify(pkg, null, 2)}\n`);
    writeFileSync(join(app, 'package-lock.json'), `${JSON.stringify(lock, null, 2)}\n`);
    const install = await run('npm', ['ci', '--offline', '--no-audit', '--no-fund']);
    expect(install.code, install.stderr).toBe(0);
  }, 400_000);

  it('ships dist/ (JavaScript, declarations, source maps) and the migrations, nothing else of the repository', () => {
    for (const f of [
      'dist/index.js',
      'dist/index.d.ts',
      'dist/index.js.map',
      'dist/cli/main.js',
      'dist/store/migrate.js',
      'drizzle/0000_init.sql',
      'drizzle/meta/_journal.json',
      'package.json',
      'README.md',
    ])
      expect(files).toContain(f);
    const journal = JSON.parse(readFileSync(join(ROOT, 'drizzle/meta/_journal.json'), 'utf8')) as { entries: { tag: string }[] };
    for (const e of journal.entries) expect(files).toContain(`drizzle/${e.tag}.sql`);
    expect(files.filter((f) => !/^(dist\/|drizzle\/|package\.json$|README\.md$|LICENSE)/.test(f))).toEqual([]);
    expect(files.filter((f) => /\.test\.|^dist\/.*\.ts$/.test(f) && !f.endsWith('.d.ts'))).toEqual([]);
    const pkg = JSON.parse(readFileSync(join(app, 'node_modules/ratchet/package.json'), 'utf8')) as {
      exports: Record<string, string | Record<string, string>>;
      bin: Record<string, string>;
    };
    for (const target of Object.values(pkg.exports).flatMap((e) => (typeof e === 'string' ? [e] : Object.values(e)))) {
      expect(existsSync(join(app, 'node_modules/ratchet', target)), target).toBe(true);
    }
    expect(existsSync(join(app, 'node_modules/ratchet', pkg.bin.ratchet!))).toBe(true);
    // Installed, not linked: the package lives inside the project.
    expect(realpathSync(join(app, 'node_modules/ratchet'))).toBe(join(realpathSync(app), 'node_modules/ratchet'));
    expect(existsSync(join(app, 'node_modules/ratchet/src'))).toBe(false);
  });

  it('a plain .mjs file imports ratchet, defines a workflow and runs it on the embedded default', async () => {
    writeFileSync(join(app, 'app.mjs'), APP_MJS);
    const res = await run(process.execPath, ['app.mjs']);
    expect(res.code, res.stderr).toBe(0);
    expect(res.json.at(-1)).toEqual({
      state: 'succeeded',
      result: { n: 84 },
      backend: 'pglite',
      dataDir: join(realpathSync(app), '.ratchet'),
    });
  }, 120_000);

  it('npx ratchet init, then npx ratchet run of the TypeScript workflow; tsc checks it against the installed declarations', async () => {
    const help = await run('npx', ['ratchet', '--help']);
    expect(help.code).toBe(0);
    expect(help.stdout).toContain('Usage: ratchet');

    const init = await run('npx', ['ratchet', 'init']);
    expect(init.code, init.stderr).toBe(0);
    expect(init.stdout.trim().split('\n').at(-1)).toBe(`  npx ratchet run hello --input '{"name":"world"}'`);
    const res = await run('npx', ['ratchet', 'run', 'hello', '--input', '{"name":"world"}', '--json']);
    expect(res.code, res.stderr).toBe(0);
    expect(res.json.at(-1)).toMatchObject({ type: 'run_finished', workflow: 'hello', state: 'succeeded', result: { delivered: true } });

    mkdirSync(join(app, 'typecheck'));
    writeFileSync(join(app, 'typecheck', 'subpaths.ts'), SUBPATHS_TS);
    writeFileSync(join(app, 'tsconfig.check.json'), JSON.stringify({ extends: './tsconfig.json', include: ['workflows', 'typecheck'] }));
    const tsc = await run('npx', ['tsc', '-p', 'tsconfig.check.json']);
    expect(tsc.code, tsc.stdout + tsc.stderr).toBe(0);

    const prune = await run('npx', ['ratchet', '--json', 'prune', '--older-than', '1d', '--dry-run']);
    expect(prune.code, prune.stderr).toBe(0);
    expect(prune.json[0]).toMatchObject({ dryRun: true, runs: 0 });
  }, 240_000);
});
