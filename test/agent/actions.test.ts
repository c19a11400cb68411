import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass } from '../../src/definitions/index.js';
import { validateActions } from '../../src/planner/actions.js';

const io = defineToolClass({ name: 'io', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '2s', maxDuration: '10s' });
const search = defineTool({
  name: 'search',
  description: 's',
  class: io,
  input: z.object({ q: z.string().min(1) }),
  output: z.object({}),
  run: async () => ({}),
});
const createCase = defineTool({
  name: 'create_case',
  description: 'c',
  class: io,
  input: z.object({ invoiceId: z.string() }),
  output: z.object({}),
  run: async () => ({}),
});
const call = (name: string, args: string, id = 'c1') => ({ id, type: 'function' as const, function: { name, arguments: args } });

/** The planner's check of a proposed action list: all of it, before anything is persisted. */
describe('validateActions', () => {
  it('accepts a valid list and keeps only what the schema knows (a lease or retry field is dropped)', () => {
    const v = validateActions(
      [search, createCase],
      [call('search', '{"q":"inv 42","lease":"999s","retry":{"maxAttempts":99},"ttl":5}'), call('create_case', '{"invoiceId":"42"}', 'c2')],
      10,
    );
    expect(v).toEqual({
      ok: true,
      actions: [
        { callId: 'c1', tool: search, input: { q: 'inv 42' } },
        { callId: 'c2', tool: createCase, input: { invoiceId: '42' } },
      ],
    });
  });
  it.each([
    ['an unknown tool', [call('delete_everything', '{}')], 'unknown_tool'],
    ['a Cyrillic look-alike name', [call('sеarch', '{"q":"x"}')], 'unknown_tool'],
    ['a name differing in case', [call('Search', '{"q":"x"}')], 'unknown_tool'],
    ['a name with trailing space', [call('search ', '{"q":"x"}')], 'unknown_tool'],
    ['arguments failing the schema', [call('search', '{"q":""}')], 'invalid_arguments'],
    ['arguments of the wrong type', [call('search', '{"q":42}')], 'invalid_arguments'],
    ['arguments that are not JSON', [call('search', "{q: 'x'}")], 'arguments_not_json'],
    ['arguments wrapped in markdown fences', [call('search', '```json\n{"q":"x"}\n```')], 'arguments_not_json'],
    ['arguments that are a JSON array', [call('search', '["x"]')], 'arguments_not_json'],
    ['too many actions', Array.from({ length: 4 }, (_, i) => call('search', '{"q":"x"}', `c${i}`)), 'too_many_actions'],
  ])('refuses %s', (_what, calls, reason) => {
    const v = validateActions([search, createCase], calls, 3);
    expect(v.ok).toBe(false);
    if (!v.ok) expect(v.errors.map((e) => e.reason)).toContain(reason);
  });
  it('refuses the whole list when one action is bad', () => {
    const v = validateActions([search], [call('search', '{"q":"ok"}', 'a'), call('search', 'not json', 'b')], 10);
    expect(v.ok).toBe(false);
    if (!v.ok) expect(v.errors).toEqual([expect.objectContaining({ callId: 'b', reason: 'arguments_not_json' })]);
  });
});
