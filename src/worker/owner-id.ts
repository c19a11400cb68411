import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';

/**
 * A worker's owner id: unique per process start (host, pid and a random part), so a
 * restarted worker that reuses a name can never pass for its former self.
 */
export function makeOwnerId(name?: string): string {
  return `${name ?? hostname()}:${process.pid}:${randomBytes(4).toString('hex')}`;
}
