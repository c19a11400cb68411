import { createHash, timingSafeEqual } from 'node:crypto';
import { isIP } from 'node:net';

/**
 * Bearer tokens from configuration. Each token and each presented value is hashed (SHA-256)
 * first, so the comparison is over equal lengths, and every configured token is compared
 * (no early exit): the time taken says nothing about how close a guess was.
 */
export function createTokenCheck(tokens: readonly string[]): (authorization: string | undefined) => boolean {
  const digests = tokens.map((t) => createHash('sha256').update(t, 'utf8').digest());
  return (authorization) => {
    const m = /^Bearer[ ]+(\S.*)$/i.exec(authorization ?? '');
    const presented = createHash('sha256')
      .update(m?.[1]?.trim() ?? '', 'utf8')
      .digest();
    let ok = false;
    for (const d of digests) ok = timingSafeEqual(d, presented) || ok;
    return ok && m !== null;
  };
}

/** 127.0.0.0/8, ::1, localhost: reachable from this machine only. */
export function isLoopback(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '').toLowerCase();
  if (h === 'localhost') return true;
  if (isIP(h) === 4) return h.startsWith('127.');
  if (isIP(h) === 6) return h === '::1' || h === '0:0:0:0:0:0:0:1' || /^::ffff:127\./.test(h);
  return false;
}
