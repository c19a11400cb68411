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
  walk(value, path, '');
  const text = JSON.stringify(value);
  checkSize(text, path);
  return text;
}

/** Like toJsonText, but null/undefined pass through as SQL NULL. */
export function toJsonTextOrNull(value: unknown, path = '$'): string | null {
  return value === undefined || value === null ? null : toJsonText(value, path);
}

/**
 * toJsonText's checks without its text, for a value serialised later as part of a larger one (a
 * finish row's values go into one JSON text per batch): the same values accepted, the same
 * errors. The size is bounded while walking (each value's largest possible JSON text); only a
 * value whose bound passes MAX_JSON_BYTES is serialised to measure it exactly. The error's path
 * is `path + field` (`finish[3]` + `.result`), joined only for an error.
 */
export function checkJson(value: unknown, path = '$', field = ''): void {
  if (walk(value, path, field) > MAX_JSON_BYTES) checkSize(JSON.stringify(value), path + field);
}

/** A high surrogate not followed by a low one, or a low one not after a high one: not Unicode, refused by jsonb. */
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;
/** U+0000 or a lone surrogate: one test for the common case (neither), checkText says which. */
const UNSTORABLE = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** Text PostgreSQL stores as it is: no U+0000, no lone surrogate (a text column would turn it into U+FFFD). */
export function isStorableText(text: string): boolean {
  return !UNSTORABLE.test(text);
}

function checkText(text: string, w: Walk, what: string): void {
  if (!UNSTORABLE.test(text)) return;
  if (text.includes('\u0000')) throw new InvalidInputError(`${what} contains \\u0000, which PostgreSQL cannot store`, pathOf(w));
  if (LONE_SURROGATE.test(text)) {
    throw new InvalidInputError(`${what} contains a lone UTF-16 surrogate (not Unicode text), which PostgreSQL cannot store`, pathOf(w));
  }
}

function checkSize(text: string, path: string): void {
  if (text.length > MAX_JSON_BYTES / 3 && Buffer.byteLength(text) > MAX_JSON_BYTES) {
    const bytes = Buffer.byteLength(text);
    throw new InvalidInputError(`the value is ${bytes} bytes as JSON, more than ${MAX_JSON_BYTES}`, path, { limit: MAX_JSON_BYTES });
  }
}

/**
 * Where the walk is: the path kept as its segments, spelled out only for an error (`$.a[0].b`),
 * and the objects open above it (`open[d]` at depth d): a value among them is a circular
 * reference. At most MAX_JSON_DEPTH of them, so a scan is bounded and, for the shallow values
 * stages return, cheaper than a Set's add and delete per object.
 */
interface Walk {
  root: string;
  field: string;
  trail: (string | number)[];
  open: object[];
}

function pathOf(w: Walk): string {
  let p = w.root + w.field;
  for (const s of w.trail) p += typeof s === 'number' ? `[${s}]` : `.${s}`;
  return p;
}

/*
 * The largest JSON text of a value, in UTF-8 bytes, counted without serialising it: a string's
 * UTF-16 unit becomes at most 6 bytes (`\u001f`; a character outside U+0000-U+07FF takes 3 bytes
 * per unit, a pair 4 for two units), plus its quotes; a number at most 25 characters
 * (`-0.0000012345678901234567`, `-1.2345678901234567e-308`); each array element or object entry
 * one comma; an array's hole is `null`. An upper bound, so a value under the limit by it is under
 * the limit; test/store/json-check.test.ts compares it with JSON.stringify's length.
 */
const STRING_UNIT_MAX = 6;
const NUMBER_MAX = 25;

/** The walk's size bound of a JSON-safe value (for the test that holds it against JSON.stringify). */
export const jsonSizeBound = (value: unknown): number => walk(value, '$', '');

/** Checks a value as toJsonText documents; returns an upper bound of its JSON text's size in bytes. */
function walk(value: unknown, root: string, field: string): number {
  return check(value, { root, field, trail: [], open: [] }, 0);
}

function check(value: unknown, w: Walk, depth: number): number {
  switch (typeof value) {
    case 'string':
      checkText(value, w, 'string');
      return 2 + STRING_UNIT_MAX * value.length;
    case 'boolean':
      return 5;
    case 'number':
      if (!Number.isFinite(value)) throw new InvalidInputError(`number ${value} is not JSON`, pathOf(w));
      return NUMBER_MAX;
    case 'bigint':
      throw new InvalidInputError('BigInt is not JSON; pass it as a string', pathOf(w));
    case 'undefined':
      throw new InvalidInputError('undefined is not JSON', pathOf(w));
    case 'function':
    case 'symbol':
      throw new InvalidInputError(`${typeof value} is not JSON`, pathOf(w));
    case 'object': {
      if (value === null) return 4;
      const open = w.open;
      for (let d = 0; d < depth; d++) if (open[d] === value) throw new InvalidInputError('circular reference is not JSON', pathOf(w));
      if (depth >= MAX_JSON_DEPTH) {
        throw new InvalidInputError(`nested more than ${MAX_JSON_DEPTH} levels deep`, pathOf(w), { limit: MAX_JSON_DEPTH });
      }
      open[depth] = value;
      let size = 2;
      const trail = w.trail;
      if (Array.isArray(value)) {
        const n = value.length;
        size += 5 * n; // a comma each, and `null` for a hole (skipped, as forEach and the old check did)
        for (let i = 0; i < n; i++) {
          if (!(i in value)) continue;
          trail.push(i);
          size += check(value[i], w, depth + 1);
          trail.pop();
        }
      } else {
        const proto = Object.getPrototypeOf(value);
        if (proto !== Object.prototype && proto !== null) {
          const name = (value as { constructor?: { name?: string } }).constructor?.name ?? 'object';
          throw new InvalidInputError(`${name} instance is not plain JSON; convert it first`, pathOf(w));
        }
        const obj = value as Record<string, unknown>;
        for (const key of Object.keys(obj)) {
          trail.push(key);
          checkText(key, w, 'key');
          const item = obj[key];
          if (item !== undefined) size += 4 + STRING_UNIT_MAX * key.length + check(item, w, depth + 1); // dropped by JSON, like JSON.stringify does
          trail.pop();
        }
      }
      return size;
    }
  }
  return 0;
}
