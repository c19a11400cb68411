import { z } from 'zod';
import { defineTool, defineToolClass, type ToolClassOptions } from '../../src/definitions/index.js';

/** A valid class (lease 90 s > 2 × 30 s + 1 s); override any option. */
export function makeClass(over: Partial<ToolClassOptions> = {}) {
  return defineToolClass({ name: 'io', lease: '90s', heartbeat: '30s', timeout: '60s', maxDuration: '10m', ...over });
}

export function makeTool(name: string, cls = makeClass(), over: { output?: z.ZodType; input?: z.ZodType } = {}) {
  return defineTool({
    name,
    description: `the ${name} tool`,
    class: cls,
    input: over.input ?? z.object({ url: z.string() }),
    output: over.output ?? z.object({ text: z.string() }),
    run: async () => ({ text: 'x' }),
  });
}
