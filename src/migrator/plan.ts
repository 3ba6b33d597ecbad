import type { CompiledQuery } from 'kysely';
import { describeBatches, firstBatchSize, type BatchSizing } from './batching.js';
import type { DataLoss } from '../errors.js';
import { schemaOf } from '../query/schema.js';
import type { MigrationDefinition } from '../migrations/types.js';
import type { Chain } from './chain.js';
import { recordMigration } from './checksum.js';
import { droppedRowsOf } from './data-loss.js';
import { inlineParameters } from './recording-driver.js';
import type { MigrationStatus, PlanStep } from './types.js';

const isRead = (query: CompiledQuery) => /^\s*select\b/i.test(query.sql);

/**
 * The steps from `status` to `target` (ups in version order, then downs newest first), each
 * with the exact statements it runs on this dialect: recorded through the same schema plugin
 * `migrate` runs under (so with a configured PostgreSQL schema every table is qualified with it),
 * the migration's reads answered by the live database.
 */
export async function planSteps(
  chain: Chain,
  status: MigrationStatus,
  target: number,
  now: number,
  sizing: BatchSizing,
): Promise<PlanStep[]> {
  const applied = new Set(status.applied.map((a) => a.version));
  const steps: PlanStep[] = [];
  for (const m of chain.migrations) {
    if (!applied.has(m.version) && m.version <= target) steps.push(await renderStep(chain, m, 'up', [], now, sizing));
  }
  const downs = [...chain.migrations].reverse().filter((m) => applied.has(m.version) && m.version > target);
  for (const m of downs) {
    steps.push(await renderStep(chain, m, 'down', await droppedRowsOf(chain, [m]), now, sizing));
  }
  return steps;
}

async function renderStep(
  chain: Chain,
  m: MigrationDefinition,
  direction: 'up' | 'down',
  destructive: readonly DataLoss[],
  now: number,
  sizing: BatchSizing,
): Promise<PlanStep> {
  const batchSize = firstBatchSize(sizing);
  const { dialect } = chain;
  const schema = schemaOf(dialect.db);
  const inSchema = schema === undefined ? {} : { schema };
  let reads = 0;
  let failedReads = 0;
  const answer = async (query: CompiledQuery) => {
    if (!isRead(query)) return undefined;
    try {
      const result = await dialect.db.executeQuery(query);
      reads++;
      return result;
    } catch {
      failedReads++;
      return undefined;
    }
  };
  const queries = await recordMigration(m, direction, dialect.kind, { now, answer, ...inSchema });
  const statements = queries.filter((q) => !isRead(q)).map((q) => inlineParameters(dialect.kind, q));
  const notes: string[] = [];
  let backfill: readonly string[] = [];
  if (direction === 'up' && m.backfill) {
    const first = await recordMigration(m, 'backfill', dialect.kind, { now, answer, batchSize, ...inSchema });
    backfill = first.filter((q) => !isRead(q)).map((q) => inlineParameters(dialect.kind, q));
    notes.push(
      `its backfill runs after the DDL commits, ${describeBatches(sizing)}, each its own transaction (resumable); the first batch is shown`,
    );
  }
  let concurrent: readonly string[] = [];
  if (direction === 'up' && m.concurrent?.length) {
    const steps = await recordMigration(m, 'concurrent', dialect.kind, { now, answer, ...inSchema });
    concurrent = steps.map((q) => inlineParameters(dialect.kind, q));
    notes.push(
      'its concurrent steps run after the DDL commits, each outside any transaction, without blocking writes (resumable)',
    );
  }
  // A statement that changes with `now` depends on the time migrate starts.
  const unanswered = async () => undefined;
  const record = async (at: number) => [
    ...(await recordMigration(m, direction, dialect.kind, { now: at, answer: unanswered, ...inSchema })),
    ...(direction === 'up' && m.backfill
      ? await recordMigration(m, 'backfill', dialect.kind, { now: at, answer: unanswered, batchSize, ...inSchema })
      : []),
  ];
  const later = await record(now + 1);
  const early = await record(now);
  if (later.some((q, i) => JSON.stringify(q.parameters) !== JSON.stringify(early[i]?.parameters))) {
    notes.push(
      `uses the time migrate starts, known only at run time; shown with the time of this plan, ${new Date(now).toISOString()} (${now})`,
    );
  }
  if (reads > 0)
    notes.push(
      `values read from the database now (${reads} reads); they change if the data changes before migrate runs`,
    );
  if (failedReads > 0)
    notes.push(`${failedReads} reads need tables that earlier steps create; shown as on empty tables`);
  if (direction === 'up' && m.minWriterRelease !== undefined)
    notes.push(
      `once applied, only taskfence ${m.minWriterRelease} or newer may write: roll every older release out first`,
    );
  return { version: m.version, name: m.name, direction, statements, concurrent, backfill, destructive, notes };
}
