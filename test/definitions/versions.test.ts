import { fileURLToPath } from 'node:url';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { InvalidDefinitionError, InvalidInputError } from '../../src/errors.js';
import { createRegistry, defineToolClass, defineWorkflow, loadWorkflows } from '../../src/definitions/index.js';
import { defineAgent } from '../../src/definitions/agent.js';
import { makeClass, makeTool } from './fixtures.js';

const io = makeClass();
const fetchDoc = makeTool('fetch_doc', io);
const input = z.object({});
const SRC = fileURLToPath(new URL('../../src/definitions/index.js', import.meta.url));

describe('workflow versions', () => {
  it('version defaults to 1 and leaves the hash of an unversioned definition as it was (runs in flight keep matching)', () => {
    const w = defineWorkflow({ name: 'stable', input, steps: [{ tool: makeTool('fetch_doc', io) }] });
    expect(w.version).toBe(1);
    expect(w.hash).toBe('bc888e90033ce370d8fad45e61c0ae05f4d1f92e69dcca2e24665e4a00dd43e3'); // as computed before versions existed
    expect(defineWorkflow({ name: 'stable', version: 1, input, steps: [{ tool: makeTool('fetch_doc', io) }] }).hash).toBe(w.hash);
    const model = defineToolClass({ name: 'model', lease: '90s', heartbeat: '30s', timeout: '60s', maxDuration: '10m' });
    const agent = (version?: number) =>
      defineAgent({ name: 'stable_agent', version, input, model: { name: 'm', class: model }, instructions: 'x', tools: [fetchDoc] });
    expect(agent().hash).toBe('cec304e5d3b60ab82258aabab4cf2d6a4d009abc0313424f13ca734a207b5d9b');
    expect(agent(3).version).toBe(3);
    expect(agent(3).hash).not.toBe(agent().hash);
  });

  it('a declared version is part of the hash, even with the same steps; a bad version is refused at definition', () => {
    const one = defineWorkflow({ name: 'doc', input, steps: [{ tool: fetchDoc }] });
    const two = defineWorkflow({ name: 'doc', version: 2, input, steps: [{ tool: fetchDoc }] });
    expect(two.hash).not.toBe(one.hash);
    for (const version of [0, 1.5, -1, '2']) {
      expect(() => defineWorkflow({ name: 'doc', version: version as number, input, steps: [{ tool: fetchDoc }] })).toThrow(
        InvalidDefinitionError,
      );
    }
    expect(() => defineWorkflow({ name: 'doc', version: 0, input, steps: [{ tool: fetchDoc }] })).toThrow(
      expect.objectContaining({ path: 'workflow[doc].version' }),
    );
  });

  it('the registry holds several versions of one name: the newest by default, any by number or by hash', () => {
    const v1 = defineWorkflow({ name: 'doc', input, steps: [{ tool: fetchDoc }] });
    const otherFetch = makeTool('fetch_doc', io, { output: z.object({ text: z.string(), pages: z.number() }) });
    const v3 = defineWorkflow({ name: 'doc', version: 3, input, steps: [{ tool: otherFetch }] }); // the same tool name, changed
    const cpu = makeClass({ name: 'cpu' });
    const legacy = defineWorkflow({ name: 'doc', version: 2, input, steps: [{ tool: makeTool('crunch', cpu) }] }); // a class only an old version uses
    const registry = createRegistry([v1, v3, legacy]);
    expect(registry.get('doc')).toBe(v3);
    expect(registry.get('doc', 1)).toBe(v1);
    expect(registry.get('doc', 4)).toBeUndefined();
    expect(registry.require('doc', 2)).toBe(legacy);
    expect(registry.byHash(v1.hash)).toBe(v1);
    expect(registry.byHash('nope')).toBeUndefined();
    expect(registry.list()).toEqual([v3, legacy, v1]);
    expect(registry.hashesOf('io').sort()).toEqual([v1.hash, v3.hash].sort());
    expect(registry.hashesOf('cpu')).toEqual([legacy.hash]);
    expect(registry.toolClasses().map((c) => c.name)).toEqual(['cpu', 'io']); // old versions' classes are still served
    expect(registry.tool('fetch_doc')).toBe(otherFetch); // the newest definition of a name
    const err = (() => {
      try {
        registry.require('doc', 9);
      } catch (e) {
        return e;
      }
    })() as InvalidInputError;
    expect(err).toBeInstanceOf(InvalidInputError);
    expect(err).toMatchObject({
      code: 'invalid_input',
      path: 'version',
      details: { reason: 'unknown_version', workflow: 'doc', loaded: [1, 2, 3] },
    });
  });

  it('refuses one name and version declared twice, and two different tools of one name across the newest versions', () => {
    const a = defineWorkflow({ name: 'doc', version: 2, input, steps: [{ tool: fetchDoc }] });
    const b = defineWorkflow({ name: 'doc', version: 2, input, steps: [{ tool: fetchDoc }] });
    expect(() => createRegistry([a, b])).toThrow(/version 2 of workflow "doc" is declared twice/);
    const other = defineWorkflow({ name: 'other', input, steps: [{ tool: makeTool('fetch_doc', io) }] });
    expect(() => createRegistry([a, other])).toThrow(/two different tools are named "fetch_doc"/);
  });

  it('the loader takes versions side by side, in two files or in one; one name and version in two files is refused', async () => {
    const versions = await loadWorkflows(fileURLToPath(new URL('../fixtures/version-workflows', import.meta.url)));
    expect(versions.map((w) => [w.name, w.version]).sort()).toEqual([
      ['roll', 1],
      ['roll', 2],
    ]);
    const dir = mkdtempSync(join(tmpdir(), 'ratchet-versions-'));
    try {
      const file = (version: number, extra = '') => `import { z } from 'zod';
import { defineToolClass, defineTool, defineWorkflow } from ${JSON.stringify(SRC)};
const c = defineToolClass({ name: 'io', lease: '90s', heartbeat: '30s', timeout: '60s', maxDuration: '10m' });
const t = defineTool({ name: 't', description: 't', class: c, input: z.object({}), output: z.object({}), run: async () => ({}) });
export const v${version} = defineWorkflow({ name: 'w', version: ${version}, input: z.object({}), steps: [{ tool: t }] });
${extra}`;
      writeFileSync(
        join(dir, 'w.ts'),
        file(2, "export const v1 = defineWorkflow({ name: 'w', input: z.object({}), steps: [{ tool: t }] });"),
      );
      const loaded = await loadWorkflows(dir);
      expect(loaded.map((w) => w.version).sort()).toEqual([1, 2]);
      expect(createRegistry(loaded).get('w')!.version).toBe(2);
      writeFileSync(join(dir, 'w2.ts'), file(2));
      await expect(loadWorkflows(dir)).rejects.toThrow(/version 2 of workflow "w" is declared twice/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
