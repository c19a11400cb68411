/**
 * The files `ratchet init` writes. The workflow runs at once on the embedded default (no
 * services): `greet` is pure, `deliver` acts once — it writes the greeting to outbox/, keyed by
 * what the effect means and stamped with the attempt's fence, the way a real receiver is called.
 */

/** The starter workflow's name and an input that fits it (printed as the next command). */
export const STARTER_WORKFLOW = 'hello';
export const STARTER_INPUT = '{"name":"world"}';

export const STARTER_WORKFLOW_FILE = `/**
 * Your first Ratchet workflow: \`greet\` composes a greeting, then \`deliver\` hands it over once.
 * Each step is a stage: its result is committed before the next one starts, so a crash or a
 * lost lease costs one step, never the run.
 *
 *   npx ratchet run ${STARTER_WORKFLOW} --input '${STARTER_INPUT}'
 */
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from 'ratchet';

/**
 * A tool class is the operational profile its tools share: the lease a worker holds while a
 * tool runs and how often it is renewed (ownership), how long one attempt may take (progress),
 * and how failures are retried.
 */
const local = defineToolClass({
  name: 'local',
  lease: '30s', heartbeat: '10s', timeout: '10s', maxDuration: '1m',
  retry: { maxAttempts: 3, backoff: { initial: '500ms', factor: 2, max: '5s' } },
});

const greeting = z.object({ name: z.string(), text: z.string() });

/** Pure: running it twice does no harm. */
const greet = defineTool({
  name: 'greet',
  description: 'Composes a greeting for a name.',
  class: local,
  input: z.object({ name: z.string().min(1).max(100) }),
  output: greeting,
  run: async ({ name }) => ({ name, text: \`Hello, \${name}!\` }),
});

/** Where \`deliver\` puts greetings (a stand-in for a service that acts on the world). */
const OUTBOX = resolve(process.env.OUTBOX_DIR ?? 'outbox');

/**
 * Acts on the world, so it is fenced: \`ctx.idempotencyKey\` names the effect (here derived from
 * what it means, so a retried stage or a resubmitted run delivers once) and \`ctx.fence\` is the
 * attempt's fencing token, greater for every newer attempt. A real service gets both as headers
 * (\`Idempotency-Key\`, \`X-Execution-Fence\`) and checks them with createFenceGuard from
 * 'ratchet/receiver' (send \`ctx.traceparent\` as \`traceparent\` too: the service joins the run's
 * trace); this stand-in keeps one file per key.
 */
const deliver = defineTool({
  name: 'deliver',
  description: 'Delivers a greeting once, to the outbox.',
  class: local,
  input: greeting,
  output: z.object({ file: z.string(), fence: z.string(), delivered: z.boolean() }),
  idempotencyKey: (input) => \`greeting:\${input.name}\`,
  async run(input, ctx) {
    const file = join(OUTBOX, \`\${ctx.idempotencyKey.replace(/[^\\w.-]/g, '_')}.json\`);
    const earlier = await readFile(file, 'utf8').then((text) => JSON.parse(text) as { fence: string }, () => null);
    if (earlier) return { file, fence: earlier.fence, delivered: false }; // delivered before: answer as then
    ctx.beginEffect(\`outbox:\${ctx.idempotencyKey}\`); // throws if this attempt no longer owns the stage
    await mkdir(OUTBOX, { recursive: true });
    // 'wx': only one writer per key, ever.
    await writeFile(file, JSON.stringify({ key: ctx.idempotencyKey, fence: ctx.fence, text: input.text }) + '\\n', { flag: 'wx' });
    return { file, fence: ctx.fence, delivered: true };
  },
});

export default defineWorkflow({
  name: '${STARTER_WORKFLOW}',
  input: z.object({ name: z.string().min(1).max(100) }),
  steps: [
    { tool: greet },
    { tool: deliver, input: ({ results }) => results.greet },
  ],
});
`;

/** Type-checks the workflows with \`npx tsc\` (the engine loads them through tsx: no build step). */
export const STARTER_TSCONFIG = `${JSON.stringify(
  {
    compilerOptions: {
      target: 'ES2022',
      module: 'NodeNext',
      moduleResolution: 'NodeNext',
      strict: true,
      skipLibCheck: true,
      noEmit: true,
    },
    include: ['workflows'],
  },
  null,
  2,
)}\n`;

/** Makes the .ts files under workflows/ ES modules whatever the project's own package.json says (tsx and tsc read it). */
export const STARTER_WORKFLOWS_PACKAGE = `${JSON.stringify({ type: 'module' }, null, 2)}\n`;
