import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { CONTROL_CLASS_NAME, defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRegistry } from '../../src/definitions/registry.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { withControl } from '../../src/worker/worker.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * `$control` (child-run stages, workflow tools, waits) joins a worker's classes when it serves a
 * workflow with such stages, also with explicit `classes`; never for a worker whose workflows have none.
 */
const cls = (name: string) =>
  defineToolClass({ name, lease: '3s', heartbeat: '500ms', jitter: '100ms', timeout: '5s', maxDuration: '10s', retry: { maxAttempts: 1 } });
const io = cls('ctl_io');
const gpu = cls('ctl_gpu');
const any = z.object({}).passthrough();
const t = (name: string, c: typeof io) =>
  defineTool({ name, description: name, class: c, input: any, output: z.unknown(), run: async (i) => ({ ...i, [name]: true }) });
const kid = defineWorkflow({ name: 'ctl_kid', input: any, steps: [{ tool: t('kid_step', io) }] });
const parent = defineWorkflow({ name: 'ctl_parent', input: any, steps: [{ tool: t('first', io) }, { name: 'sub', workflow: 'ctl_kid' }] });
const plain = defineWorkflow({ name: 'ctl_plain', input: any, steps: [{ tool: t('render', gpu) }] });

describe('the $control class joins a worker that serves workflows with child steps', () => {
  it('withControl: added for a class of a workflow with child steps, not for one without', () => {
    const reg = createRegistry([kid, parent, plain]);
    expect(withControl(reg, ['ctl_io'])).toEqual(['ctl_io', CONTROL_CLASS_NAME]);
    expect(withControl(reg, ['ctl_gpu'])).toEqual(['ctl_gpu']);
    expect(withControl(reg, ['ctl_io', CONTROL_CLASS_NAME])).toEqual(['ctl_io', CONTROL_CLASS_NAME]);
  });

  let db: TestDatabase;
  let r: Ratchet;
  beforeAll(async () => {
    db = await createTestDatabase('control_class');
    r = await createRatchet({ databaseUrl: db.url, workflows: [kid, parent, plain], logger: silentLogger() });
  });
  afterAll(async () => {
    await r?.close();
    await db?.drop();
  });

  it('a worker started with explicit classes runs a parent and its child to the end alone', async () => {
    const w = r.worker({ classes: ['ctl_io'], pollIntervalMs: 50 });
    expect(w.classes).toContain(CONTROL_CLASS_NAME);
    expect(r.worker({ classes: ['ctl_gpu'] }).classes).toEqual(['ctl_gpu']);
    await w.start();
    const { id } = await r.submit('ctl_parent', {});
    let run = (await r.store.getRun(id))!;
    for (let i = 0; i < 400 && run.state !== 'succeeded' && run.state !== 'failed'; i++) {
      await new Promise((res) => setTimeout(res, 25));
      run = (await r.store.getRun(id))!;
    }
    expect(run.state).toBe('succeeded');
    expect(run.result).toMatchObject({ kid_step: true });
  });
});
