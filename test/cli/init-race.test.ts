import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { PLAN, writeStarterFiles } from '../../src/cli/init/init.js';
import { InvalidInputError } from '../../src/errors.js';

/**
 * `ratchet init` checks for existing files, then writes with the exclusive flag. A file that
 * appears between the two (another init, an editor) is never overwritten, and the answer is the
 * typed error of the check (invalid_input, reason file_exists), not a bare EEXIST.
 */
describe('ratchet init when a file appears after the check', () => {
  const dirs: string[] = [];
  afterAll(() => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });
  const fresh = () => {
    const d = mkdtempSync(join(tmpdir(), 'ratchet-init-race-'));
    dirs.push(d);
    return d;
  };

  it('the starter workflow: a typed error with a stable code, the file untouched', async () => {
    const dir = fresh();
    const required = PLAN.find((f) => f.required)!;
    mkdirSync(join(dir, required.path, '..'), { recursive: true });
    writeFileSync(join(dir, required.path), 'mine');
    const err = await writeStarterFiles(dir, dir, PLAN).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InvalidInputError);
    expect(err).toMatchObject({ code: 'invalid_input', details: { reason: 'file_exists', files: [required.path] } });
    expect(readFileSync(join(dir, required.path), 'utf8')).toBe('mine');
  });

  it('an optional file (tsconfig.json): kept as it is, the rest written', async () => {
    const dir = fresh();
    writeFileSync(join(dir, 'tsconfig.json'), '{"mine":true}');
    const r = await writeStarterFiles(dir, dir, PLAN);
    expect(r.kept).toEqual(['tsconfig.json']);
    expect(r.created).toEqual(PLAN.map((f) => f.path).filter((p) => p !== 'tsconfig.json'));
    expect(readFileSync(join(dir, 'tsconfig.json'), 'utf8')).toBe('{"mine":true}');
  });
});
