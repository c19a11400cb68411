import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

/** The repository root. */
export const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const DIST_MARK = join(ROOT, 'dist', 'cli', 'main.js');
/** One lock per checkout (node_modules may be shared between checkouts: not there). */
const LOCK = join(tmpdir(), `ratchet-build-${createHash('sha256').update(ROOT).digest('hex').slice(0, 12)}.lock`);
const INPUTS = ['src', 'drizzle', 'package.json', 'tsconfig.json', 'tsconfig.build.json'];

function newestMtime(path: string): number {
  const st = statSync(path);
  if (!st.isDirectory()) return st.mtimeMs;
  return readdirSync(path).reduce((m, name) => Math.max(m, newestMtime(join(path, name))), st.mtimeMs);
}

const stale = (): boolean => {
  const built = statSync(DIST_MARK, { throwIfNoEntry: false });
  return !built || INPUTS.some((p) => newestMtime(join(ROOT, p)) > built.mtimeMs);
};

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

/**
 * `npm run build` when dist/ is missing or older than its sources (CI builds before the tests,
 * so there it is a check). Test files that need dist/ call it in beforeAll; a lock directory
 * keeps two of them (vitest runs files in parallel processes) from building at once.
 */
export async function ensureBuilt(): Promise<void> {
  if (!stale()) return;
  const until = Date.now() + 300_000;
  for (;;) {
    try {
      mkdirSync(LOCK);
      writeFileSync(join(LOCK, 'pid'), String(process.pid));
      break;
    } catch {
      let holder = 0;
      try {
        holder = Number(readFileSync(join(LOCK, 'pid'), 'utf8'));
      } catch {
        // the holder has not written its pid yet, or has just let go
      }
      const age = Date.now() - (statSync(LOCK, { throwIfNoEntry: false })?.mtimeMs ?? Date.now());
      if ((holder && !alive(holder)) || (!holder && age > 60_000)) rmSync(LOCK, { recursive: true, force: true });
      if (Date.now() > until) throw new Error(`waited 5 minutes for the build lock ${LOCK}`);
      await new Promise((r) => setTimeout(r, 250));
    }
  }
  try {
    if (stale()) await promisify(execFile)('npm', ['run', 'build'], { cwd: ROOT, maxBuffer: 16 * 1024 * 1024 });
  } finally {
    rmSync(LOCK, { recursive: true, force: true });
  }
}
