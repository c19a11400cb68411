import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { InvalidDefinitionError, RatchetError } from '../../src/errors.js';
import { createRegistry, defineWorkflow, type Tool, type Workflow } from '../../src/definitions/index.js';
import { makeClass, makeTool } from './fixtures.js';

const io = makeClass();
const cpu = makeClass({ name: 'cpu' });
const fetchDoc = makeTool('fetch_doc', io);
const crunch = makeTool('crunch', cpu);
const wf = (name: string, ...tools: Tool[]) => defineWorkflow({ name, input: z.object({}), steps: tools.map((tool) => ({ tool })) });

describe('createRegistry', () => {
  const a = wf('a', fetchDoc);
  const b = wf('b', fetchDoc, crunch);
  const registry = createRegistry([a, b]);

  it('finds workflows, tools and classes by name', () => {
    expect(registry.get('a')).toBe(a);
    expect(registry.get('nope')).toBeUndefined();
    expect(registry.require('b')).toBe(b);
    expect(registry.list()).toEqual([a, b]);
    expect(registry.tool('crunch')).toBe(crunch);
    expect(registry.tool('nope')).toBeUndefined();
    expect(registry.toolClasses()).toEqual([cpu, io]);
  });

  it('require() of an unknown workflow is invalid_input / unknown_workflow', () => {
    const err = (() => {
      try {
        registry.require('nope');
      } catch (e) {
        return e;
      }
    })() as RatchetError;
    expect(err).toBeInstanceOf(RatchetError);
    expect(err.code).toBe('invalid_input');
    expect(err.details.reason).toBe('unknown_workflow');
    expect(err.details.known).toEqual(['a', 'b']);
  });

  it('refuses duplicate workflow names, naming the files when known', () => {
    const one = { ...wf('same', fetchDoc), sourceFile: '/w/one.ts' } as Workflow;
    const two = { ...wf('same', fetchDoc), sourceFile: '/w/two.ts' } as Workflow;
    expect(() => createRegistry([one, two])).toThrow(InvalidDefinitionError);
    expect(() => createRegistry([one, two])).toThrow(/"same".*\/w\/one\.ts.*\/w\/two\.ts/);
  });

  it('refuses two different tools with one name across workflows', () => {
    const twin = makeTool('fetch_doc', io);
    expect(() => createRegistry([a, wf('c', twin)])).toThrow(/two different tools are named "fetch_doc"/);
  });

  it('refuses two different classes with one name across workflows', () => {
    const other = makeTool('other', makeClass());
    expect(() => createRegistry([a, wf('c', other)])).toThrow(/two different tool classes are named "io"/);
  });

  it('refuses what is not a workflow', () => {
    expect(() => createRegistry([{ name: 'x' } as unknown as Workflow])).toThrow(/not a workflow/);
  });
});
