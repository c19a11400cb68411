import { closeSync, mkdirSync, openSync, readFileSync, rmSync, writeSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { DataDirLockedError } from '../errors.js';

interface Holder {
  pid: number;
  host: string;
  startedAt: string;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Takes `<dataDir>/ratchet.lock` with O_EXCL, so two processes can never both own an embedded
 * data directory. A lock left by a dead process on this host is taken over. Returns the release.
 */
export function acquireDataDirLock(dataDir: string): () => void {
  mkdirSync(dataDir, { recursive: true });
  const path = join(dataDir, 'ratchet.lock');
  const me: Holder = { pid: process.pid, host: hostname(), startedAt: new Date().toISOString() };
  for (let tries = 0; tries < 3; tries++) {
    try {
      const fd = openSync(path, 'wx');
      writeSync(fd, JSON.stringify(me));
      closeSync(fd);
      let released = false;
      return () => {
        if (released) return;
        released = true;
        rmSync(path, { force: true });
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      let holder: Partial<Holder> = {};
      try {
        holder = JSON.parse(readFileSync(path, 'utf8')) as Holder;
      } catch {
        // A lock file being written right now, or garbage: treat as held unless it stays unreadable.
        if (tries < 2) continue;
      }
      const described = `pid ${holder.pid ?? '?'} on ${holder.host ?? '?'} since ${holder.startedAt ?? '?'}`;
      const sameHost = holder.host === me.host;
      if (sameHost && typeof holder.pid === 'number' && !alive(holder.pid)) {
        rmSync(path, { force: true }); // its holder is dead: take over
        continue;
      }
      throw new DataDirLockedError(dataDir, described);
    }
  }
  throw new DataDirLockedError(dataDir, 'a lock file that keeps reappearing');
}
