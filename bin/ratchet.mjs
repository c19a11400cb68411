#!/usr/bin/env node
// The `ratchet` command in a clone of the repository: the TypeScript sources through tsx's loader (Node 20, no build step),
// so a change to src/ is live at once. The installed package's `ratchet` is the compiled dist/cli/main.js (package.json "bin").
import { register } from 'tsx/esm/api';

register();
await import('../src/cli/main.ts');
