import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium, type BrowserContext } from 'playwright-core';

/** Debian's chromium (installed by .ci/run when missing): the browser tests drive it with playwright-core. */
export const CHROMIUM = process.env.RATCHET_TEST_CHROMIUM ?? '/usr/bin/chromium';
/** Screenshots and other files a test leaves for people to look at (not committed). */
export const ARTEFACTS_DIR = fileURLToPath(new URL('../../test-artefacts', import.meta.url));

export interface Browser {
  context: BrowserContext;
  close(): Promise<void>;
}

/** Headless Chromium with a fresh profile of its own, nothing reaching out (no sync, updates, QUIC). */
export async function launchBrowser(): Promise<Browser> {
  if (!existsSync(CHROMIUM))
    throw new Error(`Chromium is required for the browser tests and is not at ${CHROMIUM} (apt-get install chromium; .ci/run does)`);
  const profile = mkdtempSync(join(tmpdir(), 'ratchet-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1400, height: 1000 },
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  return {
    context,
    async close() {
      await context.close().catch(() => {});
      rmSync(profile, { recursive: true, force: true });
    },
  };
}

export function artefactPath(name: string): string {
  mkdirSync(ARTEFACTS_DIR, { recursive: true });
  return join(ARTEFACTS_DIR, name);
}
