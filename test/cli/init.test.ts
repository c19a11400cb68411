import { mkdirSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensureBuilt, ROOT } from '../helpers/build.js';
import { exec } from '../helpers/exec.js';

/**
 * `ratchet init` as a newcomer meets it: the compiled CLI (dist/, built first when stale) into an
 * empty folder, then the package linked into that folder the way `npm link ratchet` does, and
 * `ratchet run` of the generated workflow on the embedded default. (test/package/ does the same
 * from the packed tarball.)
 */
const tmp = mkdtempSync(join(tmpdir(), 'ratchet-init-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
const CLI = join(ROOT, 'dist', 'cli', 'main.js');
const NEXT_RUN = `npx ratchet run hello --input '{"name":"world"}'`;

/** Every file under `dir` (but the data it made) with its bytes and mtime: "nothing changed" means equal. */
function snapshot(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      if (['.ratchet', 'node_modules', 'outbox'].includes(e.name)) continue;
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else out[relative(dir, p)] = `${statSync(p).mtimeMs}:${readFileSync(p, 'base64')}`;
    }
  };
  walk(dir);
  return out;
}

describe('ratchet init', () => {
  beforeAll(() => ensureBuilt(), 300_000);

  it('writes a starter into an empty folder that `ratchet run` runs at once; a second init changes nothing (exit 2)', async () => {
    const app = join(tmp, 'app');
    const first = await exec(process.execPath, [CLI, 'init', 'app'], { cwd: tmp });
    expect(first.code, first.stderr).toBe(0);
    expect(first.stdout).toContain('created workflows/hello.ts');
    expect(first.stdout).toContain('created tsconfig.json');
    // Nothing to import from yet (a bare temp folder): it says what to install, then the command to type.
    expect(first.stdout.trim().split('\n').slice(-3)).toEqual(['  cd app', '  npm install ratchet zod', `  ${NEXT_RUN}`]);
    expect(JSON.parse(readFileSync(join(app, 'tsconfig.json'), 'utf8'))).toMatchObject({
      compilerOptions: { module: 'NodeNext', strict: true },
    });
    const workflow = readFileSync(join(app, 'workflows', 'hello.ts'), 'utf8');
    for (const part of ['defineToolClass(', 'defineTool(', 'defineWorkflow(', 'ctx.fence', 'ctx.idempotencyKey', "from 'ratchet'"]) {
      expect(workflow).toContain(part);
    }

    // `npm link ratchet` (and zod, which the workflow imports): the package from this checkout, one copy of everything.
    mkdirSync(join(app, 'node_modules'));
    symlinkSync(ROOT, join(app, 'node_modules', 'ratchet'), 'dir');
    symlinkSync(realpathSync(join(ROOT, 'node_modules', 'zod')), join(app, 'node_modules', 'zod'), 'dir');
    const bin = join(app, 'node_modules', 'ratchet', 'dist', 'cli', 'main.js');
    const run = await exec(process.execPath, [bin, 'run', 'hello', '--input', '{"name":"world"}', '--json'], { cwd: app });
    expect(run.code, run.stderr).toBe(0);
    const done = run.json.at(-1)!;
    expect(done).toMatchObject({ type: 'run_finished', workflow: 'hello', state: 'succeeded', result: { delivered: true } });
    const backend = `embedded PGlite at ${join(realpathSync(app), '.ratchet')}`;
    expect(run.json.find((l) => l.type === 'run_submitted')).toMatchObject({ backend });
    // The fenced tool wrote once, stamped with its attempt's fence and keyed by what it means.
    const delivered = done.result as { file: string; fence: string };
    expect(JSON.parse(readFileSync(delivered.file, 'utf8'))).toEqual({
      key: 'greeting:world',
      fence: delivered.fence,
      text: 'Hello, world!',
    });
    // A second run with the same name finds the effect done: nothing is delivered twice.
    const again = await exec(process.execPath, [bin, 'run', 'hello', '--input', '{"name":"world"}', '--json'], { cwd: app });
    expect(again.json.at(-1)).toMatchObject({ state: 'succeeded', result: { delivered: false, fence: delivered.fence } });
    expect(readdirSync(join(app, 'outbox'))).toHaveLength(1);

    const before = snapshot(app);
    const second = await exec(process.execPath, [bin, 'init'], { cwd: app });
    expect(second.code).toBe(2);
    expect(second.stderr).toMatch(/workflows\/hello\.ts already exists: ratchet init never overwrites/);
    const json = await exec(process.execPath, [bin, '--json', 'init', '.'], { cwd: app });
    expect(json.code).toBe(2);
    expect(JSON.parse(json.stderr)).toMatchObject({ error: { code: 'invalid_input', path: 'dir' } });
    expect(snapshot(app)).toEqual(before);
  }, 180_000);

  it('keeps an existing tsconfig.json, answers --json, and refuses a path that is a file (exit 2)', async () => {
    const dir = join(tmp, 'has-tsconfig');
    mkdirSync(dir);
    writeFileSync(join(dir, 'tsconfig.json'), '{ "compilerOptions": { "strict": false } }\n');
    const res = await exec(process.execPath, [CLI, '--json', 'init', dir], { cwd: tmp });
    expect(res.code, res.stderr).toBe(0);
    expect(res.json[0]).toMatchObject({ created: ['workflows/hello.ts', 'workflows/package.json'], kept: ['tsconfig.json'] });
    expect(readFileSync(join(dir, 'tsconfig.json'), 'utf8')).toBe('{ "compilerOptions": { "strict": false } }\n');

    writeFileSync(join(tmp, 'a-file'), 'x');
    const file = await exec(process.execPath, [CLI, 'init', 'a-file'], { cwd: tmp });
    expect(file.code).toBe(2);
    expect(file.stderr).toContain('a-file exists and is not a folder');
    expect(readFileSync(join(tmp, 'a-file'), 'utf8')).toBe('x');
  });
});
