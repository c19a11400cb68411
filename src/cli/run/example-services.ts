/**
 * `ratchet run --with-services`: the example services (examples/services.ts) in this process,
 * on a free loopback port, and RATCHET_EXAMPLE_SERVICES_URL pointed at them so the example
 * workflows' tools find them. Loaded only when asked for: the examples are a demo, not the engine.
 */
export async function startExampleServices(): Promise<{ url: string; storage: string; close(): Promise<void> }> {
  const mod = await import('../../../examples/services.js');
  const services = await mod.startServices({ onError: (err) => process.stderr.write(`example services: ${(err as Error).message}\n`) });
  process.env[mod.SERVICES_URL_ENV] = services.url;
  return services;
}
