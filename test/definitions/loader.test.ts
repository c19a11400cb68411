import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { InvalidDefinitionError, InvalidInputError } from '../../src/errors.js';
import { createRegistry, loadWorkflows, WorkflowLoadError } from '../../src/definitions/index.js';
import { spawnTs } from '../helpers/child.js';

const definitions = new URL('../../src/definitions/index.ts', import.meta.url).href;
const errors = new URL('../../src/errors.ts', import.meta.url).href;
const nodeModules = join(dirname(fileURLToPath(import.meta.url)), '../../node_modules');

/** A throwaway project: package.json (ESM), node_modules linked to ours, a workflows/ folder. */
const roots: string[] = [];
function project(files: Record<string, string>): string {
  const root = mkdtempSync(join(tmpdir(), 'ratchet-loader-'));
  roots.push(root);
  writeFileSync(join(root, 'package.json'), '{ "type": "module" }\n');
  symlinkSync(nodeModules, join(root, 'node_modules'), 'dir');
  for (const [name, text] of Object.entries(files)) {
    const path = join(root, 'workflows', name);
    mkdirSync(dirname(path), { recursive: true });
    writeFileSync(path, text);
  }
  return join(root, 'workflows');
}
afterAll(() => {
  for (const root of roots) rmSync(root, { recursive: true, force: true });
});

const tools = `
import { z } from 'zod';
import { defineTool, defineToolClass } from '${definitions}';
export const io = defineToolClass({ name: 'io', lease: '90s', heartbeat: '30s', timeout: '60s', maxDuration: '10m' });
export const fetchDoc = defineTool({ name: 'fetch_doc', description: 'fetch', class: io,
  input: z.object({ url: z.string() }), output: z.object({ text: z.string() }), run: async (i: { url: string }) => ({ text: i.url }) });
`;
const workflow = (name: string, exportAs = 'default') => `
import { z } from 'zod';
import { defineWorkflow } from '${definitions}';
import { fetchDoc } from './tools.js';
const wf = defineWorkflow({ name: '${name}', input: z.object({ url: z.string() }), steps: [{ tool: fetchDoc }] });
${exportAs === 'default' ? 'export default wf;' : `export const ${exportAs} = wf;`}
`;

describe('loadWorkflows', () => {
  it('loads default and named workflow exports from TS files, recursively, sharing imported tools', async () => {
    const dir = project({
      'tools.ts': tools,
      'summarise.ts': workflow('summarise'),
      'nested/report.mts': (
        workflow('report', 'report') +
        `
import { z as zz } from 'zod';
import { defineWorkflow as dw } from '${definitions}';
import { fetchDoc as fd } from '../tools.js';
export const audit = dw({ name: 'audit', input: zz.object({}), steps: [{ tool: fd, name: 'fetch' }] });
export default report;
export const notAWorkflow = { kind: 'tool' };
`
      ).replace("from './tools.js'", "from '../tools.js'"),
      'plain.mjs': 'export const answer = 42;\n',
      '_draft.ts': "throw new Error('a draft is never loaded');\n",
      '.hidden/x.ts': "throw new Error('a hidden folder is never loaded');\n",
      '_private/x.ts': "throw new Error('an underscore folder is never loaded');\n",
      'summarise.test.ts': "throw new Error('a test file is never loaded');\n",
      'types.d.ts': 'export type X = 1;\n',
    });
    const workflows = await loadWorkflows(dir);
    expect(workflows.map((w) => w.name).sort()).toEqual(['audit', 'report', 'summarise']);
    const byName = Object.fromEntries(workflows.map((w) => [w.name, w]));
    expect(byName.summarise?.sourceFile).toBe(join(dir, 'summarise.ts'));
    expect(byName.report?.sourceFile).toBe(join(dir, 'nested/report.mts'));
    expect(byName.audit?.sourceFile).toBe(join(dir, 'nested/report.mts'));
    for (const w of workflows) {
      expect(Object.isFrozen(w)).toBe(true);
      expect(w.hash).toMatch(/^[0-9a-f]{64}$/);
    }
    // One module graph: both files hold the very same tool object, so a registry accepts them.
    expect(byName.summarise?.steps[0]?.tool).toBe(byName.report?.steps[0]?.tool);
    const registry = createRegistry(workflows);
    expect(registry.tool('fetch_doc')?.name).toBe('fetch_doc');
    expect(registry.toolClasses().map((c) => c.name)).toEqual(['io']);
    // The loaded tool runs (it came through tsx).
    await expect(registry.tool('fetch_doc')?.run({ url: 'u' }, {} as never)).resolves.toEqual({ text: 'u' });
  });

  it('loads the same folder again', async () => {
    const dir = project({ 'tools.ts': tools, 'a.ts': workflow('a') });
    expect((await loadWorkflows(dir)).map((w) => w.name)).toEqual(['a']);
    expect((await loadWorkflows(dir)).map((w) => w.name)).toEqual(['a']);
  });

  it('refuses one workflow name in two files, naming both', async () => {
    const dir = project({ 'tools.ts': tools, 'one.ts': workflow('same'), 'two.ts': workflow('same', 'named') });
    const err = await loadWorkflows(dir).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InvalidDefinitionError);
    expect((err as Error).message).toContain(join(dir, 'one.ts'));
    expect((err as Error).message).toContain(join(dir, 'two.ts'));
    expect((err as Error).message).toContain('"same"');
  });

  it('refuses a missing folder clearly', async () => {
    const missing = join(tmpdir(), 'ratchet-no-such-folder-' + process.pid);
    const err = await loadWorkflows(missing).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InvalidInputError);
    expect((err as InvalidInputError).code).toBe('invalid_input');
    expect((err as Error).message).toContain(`the workflows folder ${missing} does not exist`);
  });

  it('names the file whose definition is refused at import', async () => {
    const dir = project({
      'bad.ts': `
import { defineToolClass } from '${definitions}';
export const broken = defineToolClass({ name: 'io', lease: '10s', heartbeat: '5s', timeout: '1s', maxDuration: '1m' });
`,
    });
    const err = await loadWorkflows(dir).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(WorkflowLoadError);
    expect((err as WorkflowLoadError).code).toBe('invalid_definition');
    expect((err as Error).message).toContain(join(dir, 'bad.ts'));
    expect((err as Error).message).toContain('lease 10000 ms must exceed missedHeartbeats 2 × heartbeat 5000 ms');
    expect((err as WorkflowLoadError).details.cause).toMatchObject({ code: 'invalid_definition' });
  });

  it('returns nothing for an empty folder', async () => {
    expect(await loadWorkflows(project({ 'README.md': '# none' }))).toEqual([]);
  });

  it('loads through tsx in a plain Node process, in the host module graph (one copy of tools and errors)', async () => {
    const dir = project({
      'tools.ts': tools + `export { PermanentError } from '${errors}';\n`,
      'a.ts': workflow('a'),
      'b.ts': workflow('b', 'b'),
    });
    const script = join(dir, '..', 'check.ts');
    writeFileSync(
      script,
      `
import { loadWorkflows } from '${new URL('../../src/definitions/loader.ts', import.meta.url).href}';
import { PermanentError } from '${errors}';
import * as tools from './workflows/tools.ts';
const workflows = await loadWorkflows(${JSON.stringify(dir)});
console.log(JSON.stringify({
  names: workflows.map((w) => w.name),
  sameTool: workflows.every((w) => w.steps[0]?.tool === tools.fetchDoc),
  samePermanentError: tools.PermanentError === PermanentError,
}));
`,
    );
    const child = spawnTs(script, []);
    const out = await child.line((o) => 'names' in o, 30_000);
    expect(out).toEqual({ names: ['a', 'b'], sameTool: true, samePermanentError: true });
    expect((await child.exit).code).toBe(0);
  });
});
