import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { InvalidInputError } from '../../errors.js';

/** What this command uses of examples/services.ts (typed here: the examples are not part of the compiled package). */
interface ExampleServicesModule {
  SERVICES_URL_ENV: string;
  startServices(opts: { onError?: (err: unknown) => void }): Promise<{ url: string; storage: string; close(): Promise<void> }>;
}

/**
 * The repository's examples/services.ts, found from this file (src/cli/run or dist/cli/run): a URL built at run time, so the
 * compiled package does not pull the examples in. The workflows loader has registered tsx's hooks by the time it is imported.
 */
const EXAMPLE_SERVICES = new URL('../../../examples/services.ts', import.meta.url);

/**
 * `ratchet run --with-services`: the example services (examples/services.ts) in this process,
 * on a free loopback port, and RATCHET_EXAMPLE_SERVICES_URL pointed at them so the example
 * workflows' tools find them. Loaded only when asked for: the examples are a demo, not the engine,
 * and they come with a clone of the repository, not with the installed package.
 */
export async function startExampleServices(): Promise<{ url: string; storage: string; close(): Promise<void> }> {
  if (!existsSync(fileURLToPath(EXAMPLE_SERVICES))) {
    throw new InvalidInputError(
      '--with-services starts the example services of a clone of the Ratchet repository (examples/services.ts); ' +
        'the installed package does not include them',
      'with-services',
      { reason: 'no_example_services' },
    );
  }
  const mod = (await import(EXAMPLE_SERVICES.href)) as ExampleServicesModule;
  const services = await mod.startServices({ onError: (err) => process.stderr.write(`example services: ${(err as Error).message}\n`) });
  process.env[mod.SERVICES_URL_ENV] = services.url;
  return services;
}
