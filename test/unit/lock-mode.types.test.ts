/**
 * Type-level tests for the lock-mode invariants; `npm run typecheck` (which includes test/) is
 * what enforces them: each `@ts-expect-error` line fails the typecheck if it compiles.
 */
import { describe, expectTypeOf, it } from 'vitest';
import type { CreateTaskInput, DispatchResult, Store, WorkspaceRecord, WorkspaceResolution } from '../../src/index.js';

// Reading the workspace without narrowing is a compile error: it may be null.
function readWithoutNarrowing(r: WorkspaceResolution): string {
  // @ts-expect-error -- 'r.workspace' is possibly 'null'
  return r.workspace.id;
}

// In the `none` branch the workspace is `null`, so reading it is a compile error.
function readInNoneBranch(r: WorkspaceResolution): string | undefined {
  if (r.lockMode === 'none') {
    // @ts-expect-error -- 'r.workspace' is 'null' here
    return r.workspace.id;
  }
  return undefined;
}

// In the `exclusive` branch it is always safe.
function readInExclusiveBranch(r: WorkspaceResolution): string | null {
  return r.lockMode === 'exclusive' ? r.workspace.id : null;
}

// A dispatch result only has a workspace lock when it was dispatched exclusively.
function readLockToken(r: DispatchResult): number | null {
  // @ts-expect-error -- not every outcome has a workspace lock
  void r.workspaceLock.token;
  return r.outcome === 'dispatched' && r.lockMode === 'exclusive' ? r.workspaceLock.token : null;
}

// Every task creation path must decide requiresFilesystem.
// @ts-expect-error -- requiresFilesystem is required
const missingFlag: CreateTaskInput = { companyId: 'c', title: 't' };

describe('lock-mode types', () => {
  it('exclusive carries a WorkspaceRecord, none carries null', () => {
    expectTypeOf<
      Extract<WorkspaceResolution, { lockMode: 'exclusive' }>['workspace']
    >().toEqualTypeOf<WorkspaceRecord>();
    expectTypeOf<Extract<WorkspaceResolution, { lockMode: 'none' }>['workspace']>().toEqualTypeOf<null>();
    expectTypeOf<WorkspaceResolution['workspace']>().toEqualTypeOf<WorkspaceRecord | null>();
    expectTypeOf<DispatchResult['outcome']>().toEqualTypeOf<'dispatched' | 'cancelled' | 'skipped'>();
  });

  it('store.scheduler.resolveWorkspaceWithLockMode returns the union', () => {
    expectTypeOf<ReturnType<Store['scheduler']['resolveWorkspaceWithLockMode']>>().toEqualTypeOf<
      Promise<WorkspaceResolution>
    >();
    void [readWithoutNarrowing, readInNoneBranch, readInExclusiveBranch, readLockToken, missingFlag];
  });
});
