import { describe, expect, it } from 'vitest';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { MIGRATIONS } from '../../src/index.js';
import { renderSchemaDoc } from '../../scripts/docs-schema.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const run = promisify(execFile);

async function script(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await run(process.execPath, ['--import', 'tsx', 'scripts/docs-schema.ts', ...args], {
      cwd: ROOT,
    });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

describe('docs/schema.md', () => {
  it('is what the generator renders from the current chain (regenerate with `npm run docs:schema`)', async () => {
    const { text, unexplained } = await renderSchemaDoc();
    expect(unexplained).toEqual([]);
    expect(readFileSync(join(ROOT, 'docs/schema.md'), 'utf8')).toBe(text);
  });

  it('renders deterministically: an erDiagram entity per table, a relationship per foreign key, who introduced each table', async () => {
    const { text } = await renderSchemaDoc(MIGRATIONS);
    expect((await renderSchemaDoc(MIGRATIONS)).text).toBe(text);
    expect(text).toContain('```mermaid\nerDiagram\n');
    expect(text).toContain(
      '  path_leases {\n    text workspace_id PK, FK\n    text lease_key PK\n    text holder PK\n',
    );
    expect(text).toContain('  workspaces ||--o{ path_leases : "workspace_id"');
    expect(text).toContain('  tasks |o--o{ decision_gates : "task_id"');
    expect(text).toMatch(
      /^\| `path_leases` \| .* \| 0055 path_leases \| 0095 path_lease_tokens, 0110 path_lease_grant_index, 0111 drop_path_lease_holder_index \|$/m,
    );
    expect(text).toMatch(/^\| `coordinator_runs` \| .* \| 0005 baseline \| 0007 run_target_guard \|$/m);
    expect(text).toContain(
      "| `coordinator_runs` | `coordinator_runs_one_running_per_target` | `(coalesce(target_key, ''))` | yes | `status = 'running'` |",
    );
    // A shorter chain describes its own latest version.
    const early = await renderSchemaDoc(MIGRATIONS.filter((m) => m.version <= 8));
    expect(early.text).toContain('The schema at version 0008 task_target_key: 15 tables');
    expect(early.text).not.toContain('path_leases');
  });

  it('--check exits 1 on a stale file and 0 once regenerated', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'taskfence-docs-'));
    try {
      const out = join(dir, 'schema.md');
      writeFileSync(out, '# Schema\n\nold\n');
      const stale = await script('--check', '--out', out);
      expect(stale.code).toBe(1);
      expect(stale.stderr).toContain('is stale: run `npm run docs:schema`');
      expect((await script('--out', out)).code).toBe(0);
      const fresh = await script('--check', '--out', out);
      expect(fresh).toMatchObject({ code: 0 });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
