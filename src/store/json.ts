import { InvalidInputError } from '../errors.js';

/**
 * Serialises a value for a jsonb column, refusing what PostgreSQL or a round trip would
 * silently change: BigInt, functions, symbols, undefined, NaN/Infinity, circular references,
 * class instances (Date, Map, ...), and U+0000 anywhere (jsonb cannot store it).
 * Throws InvalidInputError naming the JSON path; nothing is written.
 */
export function toJsonText(value: unknown, path = '$'): string {
  check(value, path, new Set());
  return JSON.stringify(value);
}

/** Like toJsonText, but null/undefined pass through as SQL NULL. */
export function toJsonTextOrNull(value: unknown, path = '$'): string | null {
  return value === undefined || value === null ? null : toJsonText(value, path);
}

function check(value: unknown, path: string, seen: Set<object>): void {
  switch (typeof value) {
    case 'string':
      if (value.includes('\u0000')) throw new InvalidInputError('string contains \\u0000, which PostgreSQL cannot store', path);
      return;
    case 'boolean':
      return;
    case 'number':
      if (!Number.isFinite(value)) throw new InvalidInputError(`number ${value} is not JSON`, path);
      return;
    case 'bigint':
      throw new InvalidInputError('BigInt is not JSON; pass it as a string', path);
    case 'undefined':
      throw new InvalidInputError('undefined is not JSON', path);
    case 'function':
    case 'symbol':
      throw new InvalidInputError(`${typeof value} is not JSON`, path);
    case 'object': {
      if (value === null) return;
      if (seen.has(value)) throw new InvalidInputError('circular reference is not JSON', path);
      seen.add(value);
      if (Array.isArray(value)) {
        value.forEach((item, i) => check(item, `${path}[${i}]`, seen));
      } else {
        const proto = Object.getPrototypeOf(value);
        if (proto !== Object.prototype && proto !== null) {
          const name = (value as { constructor?: { name?: string } }).constructor?.name ?? 'object';
          throw new InvalidInputError(`${name} instance is not plain JSON; convert it first`, path);
        }
        for (const [key, item] of Object.entries(value)) {
          const at = `${path}.${key}`;
          if (key.includes('\u0000')) throw new InvalidInputError('key contains \\u0000', at);
          if (item === undefined) continue; // dropped by JSON, like JSON.stringify does
          check(item, at, seen);
        }
      }
      seen.delete(value);
      return;
    }
  }
}
