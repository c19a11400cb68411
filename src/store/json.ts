import { InvalidInputError } from '../errors.js';
import { MAX_JSON_BYTES, MAX_JSON_DEPTH } from './limits.js';

/**
 * Serialises a value for a jsonb column, refusing what PostgreSQL or a round trip would
 * silently change or refuse: BigInt, functions, symbols, undefined, NaN/Infinity, circular
 * references, class instances (Date, Map, ...), U+0000 and lone UTF-16 surrogates anywhere
 * (jsonb cannot store them), nesting deeper than MAX_JSON_DEPTH and text larger than
 * MAX_JSON_BYTES (src/store/limits.ts). Throws InvalidInputError naming the JSON path; nothing is written.
 */
export function toJsonText(value: unknown, path = '$'): string {
  check(value, path, new Set(), 0);
  const text = JSON.stringify(value);
  if (text.length > MAX_JSON_BYTES / 3 && Buffer.byteLength(text) > MAX_JSON_BYTES) {
    const bytes = Buffer.byteLength(text);
    throw new InvalidInputError(`the value is ${bytes} bytes as JSON, more than ${MAX_JSON_BYTES}`, path, { limit: MAX_JSON_BYTES });
  }
  return text;
}

/** Like toJsonText, but null/undefined pass through as SQL NULL. */
export function toJsonTextOrNull(value: unknown, path = '$'): string | null {
  return value === undefined || value === null ? null : toJsonText(value, path);
}

/** A high surrogate not followed by a low one, or a low one not after a high one: not Unicode, refused by jsonb. */
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** Text PostgreSQL stores as it is: no U+0000, no lone surrogate (a text column would turn it into U+FFFD). */
export function isStorableText(text: string): boolean {
  return !text.includes('\u0000') && !LONE_SURROGATE.test(text);
}

function checkText(text: string, path: string, what: string): void {
  if (text.includes('\u0000')) throw new InvalidInputError(`${what} contains \\u0000, which PostgreSQL cannot store`, path);
  if (LONE_SURROGATE.test(text)) {
    throw new InvalidInputError(`${what} contains a lone UTF-16 surrogate (not Unicode text), which PostgreSQL cannot store`, path);
  }
}

function check(value: unknown, path: string, seen: Set<object>, depth: number): void {
  switch (typeof value) {
    case 'string':
      checkText(value, path, 'string');
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
      if (depth >= MAX_JSON_DEPTH) {
        throw new InvalidInputError(`nested more than ${MAX_JSON_DEPTH} levels deep`, path, { limit: MAX_JSON_DEPTH });
      }
      seen.add(value);
      if (Array.isArray(value)) {
        value.forEach((item, i) => check(item, `${path}[${i}]`, seen, depth + 1));
      } else {
        const proto = Object.getPrototypeOf(value);
        if (proto !== Object.prototype && proto !== null) {
          const name = (value as { constructor?: { name?: string } }).constructor?.name ?? 'object';
          throw new InvalidInputError(`${name} instance is not plain JSON; convert it first`, path);
        }
        for (const [key, item] of Object.entries(value)) {
          const at = `${path}.${key}`;
          checkText(key, at, 'key');
          if (item === undefined) continue; // dropped by JSON, like JSON.stringify does
          check(item, at, seen, depth + 1);
        }
      }
      seen.delete(value);
      return;
    }
  }
}
