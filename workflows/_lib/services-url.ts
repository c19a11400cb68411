/**
 * Where the example services live (examples/services.ts). Read at call time, not at import:
 * `ratchet run --with-services` starts them on a free port after the workflows are loaded.
 */
export const SERVICES_URL_ENV = 'RATCHET_EXAMPLE_SERVICES_URL';
export const DEFAULT_SERVICES_URL = 'http://127.0.0.1:4100';

/** `path` (starting with "/") on the services' base URL. */
export function servicesUrl(path: string): string {
  const base = process.env[SERVICES_URL_ENV] || DEFAULT_SERVICES_URL;
  return `${base.replace(/\/+$/, '')}${path}`;
}
