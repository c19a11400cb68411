import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { InvalidDefinitionError } from '../../src/errors.js';
import { defineTool, isTool, type ToolOptions } from '../../src/definitions/index.js';
import { makeClass } from './fixtures.js';

const io = makeClass({ retry: { maxAttempts: 5, backoff: { initial: '2s' } } });
const base: ToolOptions<{ url: string }, { text: string }> = {
  name: 'fetch_doc',
  description: 'Fetches a document',
  class: io,
  input: z.object({ url: z.string() }),
  output: z.object({ text: z.string() }),
  run: async (input) => ({ text: input.url }),
};

function refusal(options: unknown): InvalidDefinitionError {
  try {
    defineTool(options as ToolOptions<unknown, unknown>);
  } catch (err) {
    expect(err).toBeInstanceOf(InvalidDefinitionError);
    return err as InvalidDefinitionError;
  }
  throw new Error('expected the tool to be refused');
}

describe('defineTool', () => {
  it('makes a frozen tool with the class policy', () => {
    const tool = defineTool(base);
    expect(tool.kind).toBe('tool');
    expect(tool.class).toBe(io);
    expect(tool.retry).toEqual(io.retry);
    expect(isTool(tool)).toBe(true);
    expect(Object.isFrozen(tool)).toBe(true);
    expect('reconcile' in tool).toBe(false);
  });

  it('merges a partial retry over the class policy', () => {
    const tool = defineTool({ ...base, retry: { maxAttempts: 2, backoff: { factor: 3 } } });
    expect(tool.retry).toEqual({ maxAttempts: 2, backoff: { initialMs: 2000, factor: 3, maxMs: 60_000, jitter: 0.2 }, maxElapsedMs: null });
    expect(io.retry.maxAttempts).toBe(5);
  });

  it('keeps reconcile and idempotencyKey', async () => {
    const tool = defineTool({ ...base, reconcile: async () => ({ done: false }), idempotencyKey: (i) => `doc:${i.url}` });
    expect(tool.idempotencyKey?.({ url: 'a' })).toBe('doc:a');
    expect(await tool.reconcile?.({ url: 'a' }, {} as never)).toEqual({ done: false });
  });

  it('refuses an unknown class', () => {
    expect(refusal({ ...base, class: { ...io } }).message).toMatch(/unknown class/);
    expect(refusal({ ...base, class: 'io' }).path).toBe('tool[fetch_doc].class');
  });

  it('refuses schemas that are not zod, and a run that is not a function', () => {
    expect(refusal({ ...base, input: { type: 'object' } }).path).toBe('tool[fetch_doc].input');
    expect(refusal({ ...base, output: undefined }).path).toBe('tool[fetch_doc].output');
    expect(refusal({ ...base, run: 'go' }).message).toMatch(/must be a function/);
    expect(refusal({ ...base, reconcile: 1 }).path).toBe('tool[fetch_doc].reconcile');
  });

  it('refuses names a model cannot call', () => {
    for (const name of ['', '1st', 'fetch.doc', 'fetch doc', 'a'.repeat(65)])
      expect(refusal({ ...base, name }).message).toMatch(/must be a letter/);
    expect(defineTool({ ...base, name: 'FetchDoc-2' }).name).toBe('FetchDoc-2');
  });

  it('refuses an empty description and unknown keys', () => {
    expect(refusal({ ...base, description: '  ' }).path).toBe('tool[fetch_doc].description');
    expect(refusal({ ...base, timeout: '5s' }).message).toMatch(/Unrecognized key.*timeout/);
  });

  it('refuses a bad retry override', () => {
    expect(refusal({ ...base, retry: { maxAttempts: -1 } }).path).toBe('tool[fetch_doc].retry.maxAttempts');
    expect(refusal({ ...base, retry: { backoff: { max: '1s' } } }).message).toMatch(
      /backoff.max 1000 ms must not be below backoff.initial 2000 ms/,
    );
  });

  it('refuses an output that is not JSON-serialisable', () => {
    const err = refusal({ ...base, output: z.object({ at: z.date(), n: z.array(z.bigint()) }) });
    expect(err.message).toMatch(/output is not JSON-serialisable: date at properties.at, bigint at properties.n.items/);
    expect(err.path).toBe('tool[fetch_doc].output');
    expect(refusal({ ...base, output: z.map(z.string(), z.number()) }).message).toMatch(/map at \(root\)/);
    // Representable outputs, and transforms (judged by value at run time), are accepted.
    expect(defineTool({ ...base, output: z.object({ at: z.iso.datetime(), n: z.number().nullable() }) as never }).name).toBe('fetch_doc');
    expect(defineTool({ ...base, output: z.string().transform((s) => ({ text: s })) as never }).name).toBe('fetch_doc');
  });
});
