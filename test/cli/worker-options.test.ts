import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';

/** `ratchet worker` refuses a bad --metrics-port before it opens anything (exit 2, invalid_input naming the option). */
const ROOT = fileURLToPath(new URL('../..', import.meta.url));

/** Runs `ratchet <args>`; a process still running after 20 s is killed (code null: it did not exit on its own). */
function ratchet(args: string[], extraEnv: Record<string, string> = {}): Promise<{ code: number | null; stderr: string }> {
  return new Promise((resolve) => {
    const env = { ...process.env, DATABASE_URL: 'postgres://root@127.0.0.1:1/never-opened', REDIS_URL: '', ...extraEnv };
    const child = spawn(process.execPath, ['bin/ratchet.mjs', ...args], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    let killed = false;
    const timer = setTimeout(() => {
      killed = true;
      child.kill('SIGKILL');
    }, 20_000);
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code: killed ? null : code, stderr });
    });
  });
}

describe('ratchet worker --metrics-port', () => {
  for (const port of ['70000', '-1', 'abc']) {
    it(`refuses --metrics-port ${port}`, async () => {
      const { code, stderr } = await ratchet(['worker', '--json', '--metrics-port', port]);
      expect(code).toBe(2);
      const line = stderr
        .trim()
        .split('\n')
        .filter((l) => l.startsWith('{"error"'))
        .at(-1)!;
      expect(JSON.parse(line).error).toMatchObject({ code: 'invalid_input', path: 'metrics-port' });
    }, 30_000);
  }
});

describe('ratchet worker refuses what it can before it opens the store, and never runs on after an error', () => {
  const made: string[] = [];
  afterAll(() => {
    for (const d of made) rmSync(d, { recursive: true, force: true });
  });
  const dataDir = () => {
    const parent = mkdtempSync(join(tmpdir(), 'ratchet-worker-opts-'));
    made.push(parent);
    return join(parent, 'data');
  };

  it('an unknown --classes: exit 2, the data dir never created', async () => {
    const dir = dataDir();
    const { code, stderr } = await ratchet(['worker', '--json', '--classes', 'nope', '--data-dir', dir], { DATABASE_URL: '' });
    expect(code).toBe(2);
    expect(stderr).toMatch(/no workflow uses tool class \\?"nope/);
    expect(existsSync(dir)).toBe(false);
  }, 30_000);

  it('a --metrics-port already taken: the process exits with the error (it did not run on, claiming work), the data dir never created', async () => {
    const taken = createServer();
    await new Promise<void>((res) => taken.listen(0, '127.0.0.1', res));
    const port = String((taken.address() as AddressInfo).port);
    const dir = dataDir();
    try {
      const { code, stderr } = await ratchet(['worker', '--json', '--metrics-port', port, '--data-dir', dir], { DATABASE_URL: '' });
      expect(code).not.toBeNull(); // exited on its own
      expect(code).not.toBe(0);
      expect(stderr).toMatch(/EADDRINUSE/);
      expect(existsSync(dir)).toBe(false);
    } finally {
      await new Promise((res) => taken.close(res));
    }
  }, 30_000);
});
