import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';

/**
 * `ratchet dev` / `ratchet serve` check every listening option before they open the store: a
 * refused flag exits 2 with a typed error and leaves no embedded data directory behind (no
 * directory, no lock file, no migration).
 */
const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const WORKFLOWS = fileURLToPath(new URL('../fixtures/api-workflows', import.meta.url));
const tmp = mkdtempSync(join(tmpdir(), 'ratchet-cli-serve-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

function ratchet(args: string[]): Promise<{ code: number | null; stderr: string; error: any }> {
  return new Promise((resolve, reject) => {
    const env = { ...process.env };
    const unset = [
      'DATABASE_URL',
      'RATCHET_DATA_DIR',
      'RATCHET_URL',
      'RATCHET_TOKEN',
      'RATCHET_TOKENS',
      'REDIS_URL',
      'RATCHET_HOST',
      'RATCHET_PORT',
    ];
    for (const name of unset) delete env[name];
    const child = spawn(process.execPath, ['bin/ratchet.mjs', ...args], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
    });
    child.stdout.resume();
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`ratchet ${args.join(' ')} did not exit; stderr: ${stderr}`));
    }, 60_000);
    child.on('exit', (code) => {
      clearTimeout(timer);
      const line = stderr
        .trim()
        .split('\n')
        .filter((l) => l.startsWith('{"error"'))
        .at(-1);
      resolve({ code, stderr, error: line ? JSON.parse(line).error : undefined });
    });
  });
}

describe('dev and serve refuse bad listening options before touching the data directory', () => {
  const cases: [string, string[], RegExp][] = [
    ['dev --host 0.0.0.0 --token abc (a token too short)', ['dev', '--host', '0.0.0.0', '--token', 'abc'], /at least 8 characters/],
    ['dev --host 0.0.0.0 without a token', ['dev', '--host', '0.0.0.0'], /without a token/],
    ['dev --token with whitespace', ['dev', '--token', 'has a space in it'], /no whitespace/],
    ['dev --host of 300 characters', ['dev', '--host', 'h'.repeat(300), '--token', 'long-enough-token'], /at most 255|too big|<=255/i],
    ['serve --host 0.0.0.0 --token abc', ['serve', '--host', '0.0.0.0', '--token', 'abc'], /at least 8 characters/],
    ['dev --port 70000', ['dev', '--port', '70000'], /--port/],
  ];
  for (const [name, args, message] of cases) {
    it(`${name}: exit 2, invalid_input, no data directory`, async () => {
      const dataDir = join(tmp, name.replace(/[^a-z0-9]+/gi, '-'));
      const r = await ratchet([
        '--json',
        '--data-dir',
        dataDir,
        ...args,
        ...(args.includes('--port') ? [] : ['--port', '0']),
        '--workflows-dir',
        WORKFLOWS,
      ]);
      expect(r.code, r.stderr).toBe(2);
      expect(r.error).toMatchObject({ code: 'invalid_input', message: expect.stringMatching(message) });
      expect(existsSync(dataDir)).toBe(false);
    }, 60_000);
  }
});
