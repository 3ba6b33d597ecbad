/**
 * The source tree (src/ and test/) transpiled to plain JavaScript once, for the child processes
 * tests start (the race helper's contenders). A child started with tsx's loader spent about 1.7 s
 * of CPU starting, most of it in the loader's hooks (every module of kysely and pg passes through
 * them); the same child on transpiled files starts in about 0.6 s, and CI starts hundreds of them
 * on two saturated cores.
 *
 * The tree sits in `.tmp/children/<hash>/`, the hash taken over every source file's path and
 * text (and package.json), so an edited source (a mutant) gets a tree of its own on the next
 * start and a child never runs stale code. Transpiling is TypeScript's `transpileModule`, file by
 * file, types erased and nothing else changed (the same per-file transform tsx applies, which
 * `isolatedModules` and `verbatimModuleSyntax` in tsconfig.json guarantee is enough). Two test
 * workers that need a missing tree at once each build one in a folder of their own and rename it
 * into place: the first rename wins and the other's copy is removed.
 */
import { createHash, randomBytes } from 'node:crypto';
import {
  existsSync,
  mkdirSync,
  readFileSync,
  readdirSync,
  renameSync,
  rmSync,
  statSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, relative, sep } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const TREES = join(ROOT, '.tmp', 'children');
/** A tree not used for this long (its folder's time, set at each use) is removed when a new one is built. */
const STALE_MS = 60 * 60 * 1000;

function sources(): string[] {
  const files: string[] = [];
  const walk = (dir: string) => {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const path = join(dir, entry.name);
      if (entry.isDirectory()) walk(path);
      else if (entry.name.endsWith('.ts') && !entry.name.endsWith('.d.ts')) files.push(path);
    }
  };
  walk(join(ROOT, 'src'));
  walk(join(ROOT, 'test'));
  return files.sort();
}

let tree: string | undefined;

/** The folder of the transpiled tree for the sources as they are now, built if missing. */
export function compiledTree(): string {
  if (tree !== undefined && existsSync(join(tree, '.complete'))) return used(tree);
  const files = sources();
  const texts = files.map((file) => readFileSync(file, 'utf8'));
  const packageJson = readFileSync(join(ROOT, 'package.json'), 'utf8');
  const hash = createHash('sha256').update(packageJson);
  files.forEach((file, i) => hash.update('\0').update(relative(ROOT, file)).update('\0').update(texts[i]!));
  const dir = join(TREES, hash.digest('hex').slice(0, 16));
  if (!existsSync(join(dir, '.complete'))) build(dir, files, texts, packageJson);
  tree = dir;
  return used(dir);
}

/** Marks `dir` as used now, so another run's clean-up keeps it. */
function used(dir: string): string {
  const now = new Date();
  utimesSync(dir, now, now);
  return dir;
}

function build(dir: string, files: readonly string[], texts: readonly string[], packageJson: string): void {
  // typescript is loaded only here: most test files never need to build a tree.
  const ts = createRequire(import.meta.url)('typescript') as typeof import('typescript');
  const options: import('typescript').CompilerOptions = {
    module: ts.ModuleKind.ESNext,
    target: ts.ScriptTarget.ES2022,
    verbatimModuleSyntax: true,
    isolatedModules: true,
  };
  const tmp = `${dir}.${process.pid}.${randomBytes(4).toString('hex')}`;
  files.forEach((file, i) => {
    const out = join(tmp, relative(ROOT, file)).replace(/\.ts$/, '.js');
    mkdirSync(dirname(out), { recursive: true });
    writeFileSync(out, ts.transpileModule(texts[i]!, { compilerOptions: options, fileName: file }).outputText);
  });
  // "type": "module" for the .js files, and the release src/release.ts reads one level up.
  writeFileSync(join(tmp, 'package.json'), packageJson);
  writeFileSync(join(tmp, '.complete'), '');
  try {
    try {
      renameSync(tmp, dir);
    } catch (error) {
      if (existsSync(join(dir, '.complete'))) throw error; // another worker's tree won
      // A folder without `.complete` is what an interrupted clean-up leaves: remove it, once.
      rmSync(dir, { recursive: true, force: true });
      renameSync(tmp, dir);
    }
  } catch (error) {
    rmSync(tmp, { recursive: true, force: true });
    if (!existsSync(join(dir, '.complete'))) throw error;
    return; // another worker's tree won
  }
  for (const name of readdirSync(TREES)) {
    const other = join(TREES, name);
    if (other === dir) continue;
    try {
      if (Date.now() - statSync(other).mtimeMs > STALE_MS) rmSync(other, { recursive: true, force: true });
    } catch {
      // removed meanwhile
    }
  }
}

/** The transpiled counterpart of a `.ts` file of this repository (a path or a file URL), as a path. */
export function compiledPath(file: string): string {
  const path = file.startsWith('file:') ? fileURLToPath(file) : file;
  const rel = relative(ROOT, path);
  if (rel.startsWith('..') || rel.startsWith(sep) || !rel.endsWith('.ts'))
    throw new Error(`${file} is not a .ts file of this repository`);
  return join(compiledTree(), rel.replace(/\.ts$/, '.js'));
}

/** `compiledPath` as a file URL. */
export function compiledUrl(file: string): string {
  return pathToFileURL(compiledPath(file)).href;
}
