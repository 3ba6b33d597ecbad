/**
 * The package under measurement: the build in `dist/`, as users install it, not `src/` compiled
 * on the fly by tsx. tsx compiles with esbuild's `keepNames`, which makes every named closure a
 * call creates also call `Object.defineProperty(fn, 'name', …)`: up to five per lock cycle on the
 * hot paths, a cost the published build does not have (1–5% of a SQLite cycle on tmpfs, measured
 * 2026-12-05). The benchmark's child processes load `dist/` too. (`lib/deploy.ts` seeds through
 * `src/`, since the deploy test suite shares it; what `bench:deploy` times is the built CLI.)
 *
 * `npm run bench` builds first. A `dist/` older than any file in `src/` is refused, so a
 * benchmark never reports on code other than the checkout's.
 */
import { readdirSync, statSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type * as Taskfence from '../../src/index.js';

const SRC = fileURLToPath(new URL('../../src/', import.meta.url));
const ENTRY = new URL('../../dist/index.js', import.meta.url);

function newestMtimeMs(dir: string): number {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (entry.isFile()) newest = Math.max(newest, statSync(`${entry.parentPath}/${entry.name}`).mtimeMs);
  }
  return newest;
}

function builtMtimeMs(): number {
  try {
    return statSync(ENTRY).mtimeMs;
  } catch {
    throw new Error(`The benchmark measures the build, and ${fileURLToPath(ENTRY)} is missing: run npm run build.`);
  }
}

if (builtMtimeMs() < newestMtimeMs(SRC)) {
  throw new Error('The benchmark measures the build, and dist/ is older than src/: run npm run build.');
}

const taskfence = (await import(ENTRY.href)) as typeof Taskfence;

/** `openStore` of the built package. */
export const openStore: typeof Taskfence.openStore = taskfence.openStore;
