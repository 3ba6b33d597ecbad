import { readFileSync } from 'node:fs';

/** This taskfence's release (package.json `version`), read once; `0.0.0` if it cannot be found. */
export const TASKFENCE_RELEASE: string = readRelease();

function readRelease(): string {
  // src/release.ts and dist/release.js both sit one level below package.json.
  for (const rel of ['../package.json', '../../package.json']) {
    try {
      const pkg = JSON.parse(readFileSync(new URL(rel, import.meta.url), 'utf8')) as {
        name?: string;
        version?: string;
      };
      if (pkg.name === 'taskfence' && pkg.version) return pkg.version;
    } catch {
      // try the next place
    }
  }
  return '0.0.0';
}

/**
 * Compares two releases `major.minor.patch` (a pre-release suffix sorts before its release):
 * negative when `a` is older than `b`, 0 when equal, positive when newer.
 */
export function compareReleases(a: string, b: string): number {
  const parse = (r: string) => {
    const [core = '', pre] = r.split('-', 2);
    return { parts: core.split('.').map((p) => Number.parseInt(p, 10) || 0), pre };
  };
  const x = parse(a);
  const y = parse(b);
  for (let i = 0; i < 3; i++) {
    const d = (x.parts[i] ?? 0) - (y.parts[i] ?? 0);
    if (d !== 0) return d;
  }
  if (x.pre === y.pre) return 0;
  if (x.pre === undefined) return 1;
  if (y.pre === undefined) return -1;
  return x.pre < y.pre ? -1 : 1;
}
