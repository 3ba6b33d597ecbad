/**
 * `taskfence inspect` as text: one block per section, columns aligned, every line cut to the
 * terminal's width (long ids end in `…`; `--json` has them whole).
 */
import type { InspectSnapshot, PathNode, QueuedTaskView, TaskExplanation } from './types.js';

/** `850 ms`, `42 s`, `3 min 5 s`, `2 h 10 min`, `3 d 4 h`; negative durations as their absolute value. */
export function describeDuration(ms: number): string {
  const abs = Math.abs(Math.round(ms));
  if (abs < 1_000) return `${abs} ms`;
  const s = Math.floor(abs / 1_000);
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return s % 60 === 0 ? `${m} min` : `${m} min ${s % 60} s`;
  const h = Math.floor(m / 60);
  if (h < 24) return m % 60 === 0 ? `${h} h` : `${h} h ${m % 60} min`;
  const d = Math.floor(h / 24);
  return h % 24 === 0 ? `${d} d` : `${d} d ${h % 24} h`;
}

/** `in 42 s`, or `EXPIRED 3 s ago`. */
export function describeLeft(leftMs: number): string {
  return leftMs > 0 ? `in ${describeDuration(leftMs)}` : `EXPIRED ${describeDuration(leftMs)} ago`;
}

/** Cuts `line` to `width` characters, ending in `…` when cut. */
export function fit(line: string, width: number): string {
  const chars = [...line];
  return chars.length <= width ? line : `${chars.slice(0, Math.max(1, width - 1)).join('')}…`;
}

/**
 * Aligned columns within `width`: when the natural widths do not fit, the widest column gives up
 * characters first (cells cut with `…`), down to 6 each; whatever still does not fit is cut at the end.
 */
function table(header: readonly string[], rows: readonly (readonly string[])[], width: number): string[] {
  const all = [header, ...rows];
  const widths = header.map((_, i) => Math.max(...all.map((row) => [...(row[i] ?? '')].length)));
  const budget = width - 2 - 2 * (header.length - 1);
  for (let total = widths.reduce((a, b) => a + b, 0); total > budget; total--) {
    const widest = widths.indexOf(Math.max(...widths));
    if (widths[widest]! <= 6) break;
    widths[widest]!--;
  }
  return all.map((row) =>
    `  ${row.map((cell, i) => (i === row.length - 1 ? fit(cell, widths[i]!) : fit(cell, widths[i]!).padEnd(widths[i]!))).join('  ')}`.trimEnd(),
  );
}

/** Word-wraps `text` to `width`, the first line after `first`, the rest after `rest`. */
function wrap(text: string, width: number, first: string, rest: string): string[] {
  const lines: string[] = [];
  let line = first;
  for (const word of text.split(' ')) {
    const candidate = line === first || line === rest ? `${line}${word}` : `${line} ${word}`;
    if ([...candidate].length > width && line !== first && line !== rest) {
      lines.push(line);
      line = `${rest}${word}`;
    } else line = candidate;
  }
  lines.push(line);
  return lines;
}

function more(total: number, shown: number): string[] {
  return total > shown ? [`  … and ${total - shown} more (--limit N, or --json)`] : [];
}

function taskCounts(tasks: Readonly<Partial<Record<string, number>>>): string {
  const parts = Object.entries(tasks).map(([status, n]) => `${n} ${status}`);
  return parts.length === 0 ? '-' : parts.join(', ');
}

function treeLines(node: PathNode, prefix: string, out: string[]): void {
  node.children.forEach((child, i) => {
    const last = i === node.children.length - 1;
    out.push(`${prefix}${last ? '└─ ' : '├─ '}${child.name}${holders(child)}`);
    treeLines(child, `${prefix}${last ? '   ' : '│  '}`, out);
  });
}

function holders(node: PathNode): string {
  if (node.leases.length === 0) return '';
  return `  ${node.leases
    .map((l) => `${l.holder}${l.taskId === null ? '' : ` (task ${l.taskId})`} ${describeLeft(l.leftMs)}`)
    .join('; ')}`;
}

/** The text of `taskfence inspect`, each line at most `width` characters. */
export function formatSnapshot(snapshot: InspectSnapshot, header: string, width: number): string[] {
  const { runs, dispatches, locks, paths, semaphores, ownership, inbox, readyQueue } = snapshot;
  const lines: string[] = [
    `${header} at ${new Date(runs.at).toISOString()} (runs stale after ${describeDuration(runs.staleAfterMs)})`,
  ];

  lines.push('', `RUNS: ${runs.running.total} running, ${runs.recentlyEnded.total} ended`);
  if (runs.running.items.length > 0)
    lines.push(
      ...table(
        ['state', 'target', 'run', 'handle', 'heartbeat', 'tasks'],
        runs.running.items.map((r) => [
          r.stale ? 'STALE' : 'live',
          r.targetKey ?? '(null target)',
          r.id,
          r.coordinatorHandle,
          `${describeDuration(r.heartbeatAgeMs)} ago`,
          taskCounts(r.tasks),
        ]),
        width,
      ),
      ...more(runs.running.total, runs.running.items.length),
    );
  if (runs.recentlyEnded.items.length > 0) {
    lines.push('  recently ended:');
    lines.push(
      ...table(
        ['target', 'run', 'status', 'ended', 'tasks'],
        runs.recentlyEnded.items.map((r) => [
          r.targetKey ?? '(null target)',
          r.id,
          r.status,
          r.endedAt === null ? '-' : `${describeDuration(runs.at - r.endedAt)} ago`,
          taskCounts(r.tasks),
        ]),
        width,
      ),
    );
  }

  lines.push('', `DISPATCHES: ${dispatches.active.total} active`);
  if (dispatches.active.items.length > 0)
    lines.push(
      ...table(
        ['terminal', 'dispatch', 'task', 'run', 'age', 'task lease'],
        dispatches.active.items.map((d) => [
          d.terminalHandle,
          d.id,
          d.taskId,
          d.coordinatorRunId ?? '-',
          describeDuration(d.ageMs),
          d.lease === null ? 'none' : `token ${d.lease.token}, expires ${describeLeft(d.lease.leftMs)}`,
        ]),
        width,
      ),
      ...more(dispatches.active.total, dispatches.active.items.length),
    );

  lines.push('', `LOCKS: ${locks.workspaces.total} workspace locks, ${locks.tasks.total} task leases held`);
  if (locks.workspaces.items.length + locks.tasks.items.length > 0)
    lines.push(
      ...table(
        ['kind', 'on', 'holder', 'token', 'expires'],
        [
          ...locks.workspaces.items.map((l) => [
            'workspace',
            l.workspaceId,
            l.runId === null ? l.holder : `${l.holder} (run ${l.runId})`,
            String(l.token),
            describeLeft(l.leftMs),
          ]),
          ...locks.tasks.items.map((l) => ['task', l.taskId, l.holder, String(l.token), describeLeft(l.leftMs)]),
        ],
        width,
      ),
      ...more(locks.workspaces.total, locks.workspaces.items.length),
      ...more(locks.tasks.total, locks.tasks.items.length),
    );

  lines.push('', `PATHS: ${paths.workspaces.total} workspaces with live path leases`);
  for (const w of paths.workspaces.items) {
    lines.push(`  workspace ${w.workspaceId}: ${w.live} live, ${w.expired} expired (not yet pruned)`);
    lines.push(`    /${holders(w.tree)}`);
    treeLines(w.tree, '    ', lines);
  }
  lines.push(...more(paths.workspaces.total, paths.workspaces.items.length));

  lines.push('', `SEMAPHORES: ${semaphores.semaphores.total} with slots`);
  if (semaphores.semaphores.items.length > 0)
    lines.push(
      ...table(
        ['name', 'held / limit', 'token', 'holders (soonest to free first)'],
        semaphores.semaphores.items.map((m) => [
          m.name,
          `${m.held}${m.limit === null ? '' : ` / ${m.limit}`}${m.expired === 0 ? '' : ` (+${m.expired} expired)`}`,
          String(m.token),
          m.slots.length === 0
            ? '-'
            : m.slots
                .slice(0, 3)
                .map((h) => `${h.holder} #${h.token} ${describeLeft(h.leftMs)}`)
                .join('; ') + (m.slots.length > 3 ? `; … ${m.slots.length - 3} more` : ''),
        ]),
        width,
      ),
      ...more(semaphores.semaphores.total, semaphores.semaphores.items.length),
    );

  lines.push(
    '',
    `INBOX: ${inbox.pendingTotal} pending messages in ${inbox.inboxes.total} inboxes, ${inbox.redeliveredTotal} redelivered, ${inbox.deadTotal} dead`,
  );
  if (inbox.inboxes.items.length > 0)
    lines.push(
      ...table(
        ['handle', 'pending', 'in flight', 'redelivered', 'dead', 'oldest'],
        inbox.inboxes.items.map((i) => [
          i.handle,
          String(i.depth),
          String(i.inFlight),
          String(i.redelivered),
          i.dead === 0 ? '0' : `${i.dead} DEAD`,
          i.oldestAgeMs === null ? '-' : `${describeDuration(i.oldestAgeMs)} ago`,
        ]),
        width,
      ),
      ...more(inbox.inboxes.total, inbox.inboxes.items.length),
    );
  if (inbox.dead.items.length > 0) {
    lines.push('  dead messages (requeueDeadMessages(handle, ids) revives them):');
    lines.push(
      ...table(
        ['message', 'inbox', 'kind', 'attempts', 'dead since', 'last error'],
        inbox.dead.items.map((m) => [
          m.id,
          m.handle,
          m.kind,
          String(m.attempts),
          `${describeDuration(m.deadAgeMs)} ago`,
          m.lastError ?? '-',
        ]),
        width,
      ),
      ...more(inbox.dead.total, inbox.dead.items.length),
    );
  }

  lines.push(
    '',
    `OWNERSHIP: ${ownership.resources.total} active resources, ${ownership.admissions.total} cleanup admissions, ${ownership.snapshots.total} unfinished cleanup snapshots`,
  );
  if (ownership.resources.items.length > 0)
    lines.push(
      ...table(
        ['kind', 'id', 'owner task', 'generation', 'cleanup'],
        ownership.resources.items.map((r) => [
          r.kind,
          r.id,
          r.ownerTaskId,
          String(r.generation),
          r.cleanup === 'none'
            ? 'none'
            : `${r.cleanup} by ${r.cleanupClaimedBy} (${describeLeft(r.cleanupClaimLeftMs ?? 0)})`,
        ]),
        width,
      ),
      ...more(ownership.resources.total, ownership.resources.items.length),
    );
  if (ownership.snapshots.items.length > 0)
    lines.push(
      ...table(
        ['snapshot', 'task', 'resource', 'generation', 'state', 'attempts', 'last error'],
        ownership.snapshots.items.map((s) => [
          s.id,
          s.taskId,
          `${s.resourceKind} ${s.resourceId}`,
          String(s.generation),
          s.state,
          String(s.attempts),
          s.lastError ?? '-',
        ]),
        width,
      ),
    );

  const q = readyQueue;
  lines.push(
    '',
    `READY QUEUE: ${q.ready.total} ready, ${q.dependenciesTracked ? `${q.blockedByDependency.total} blocked by a dependency` : 'dependencies not tracked'}, ${q.blockedByGate.total} blocked by a gate`,
  );
  const queued = (t: QueuedTaskView) => [t.id, t.status, t.coordinatorRunId ?? '-', `${describeDuration(t.waitingMs)}`];
  if (q.ready.items.length > 0)
    lines.push(
      '  ready:',
      ...table(['task', 'status', 'run', 'waiting'], q.ready.items.map(queued), width),
      ...more(q.ready.total, q.ready.items.length),
    );
  if (q.blockedByDependency.items.length > 0)
    lines.push(
      '  blocked by a dependency:',
      ...table(
        ['task', 'status', 'run', 'waiting', 'waits on'],
        q.blockedByDependency.items.map((t) => [
          ...queued(t),
          t.waitingOn.map((d) => `${d.id} (${d.status})`).join(', ') +
            (t.openDependencies > t.waitingOn.length ? `, … ${t.openDependencies - t.waitingOn.length} more` : ''),
        ]),
        width,
      ),
      ...more(q.blockedByDependency.total, q.blockedByDependency.items.length),
    );
  if (q.blockedByGate.items.length > 0)
    lines.push(
      '  blocked by a gate:',
      ...table(
        ['task', 'status', 'run', 'waiting', 'open gate'],
        q.blockedByGate.items.map((t) => [
          ...queued(t),
          t.gates.map((g) => `${g.id} ${JSON.stringify(g.question)}`).join(', '),
        ]),
        width,
      ),
      ...more(q.blockedByGate.total, q.blockedByGate.items.length),
    );
  return lines.map((line) => fit(line, width));
}

/** The text of `taskfence inspect task <id>`; the reasons wrap, every other line is cut to `width`. */
export function formatExplanation(e: TaskExplanation, width: number): string[] {
  const { task } = e;
  const lines = [
    `task ${task.id}: ${JSON.stringify(task.title)}`,
    `  status ${task.status}, run ${task.coordinatorRunId ?? '(none)'}${e.run ? ` (${e.run.status}, heartbeat ${describeDuration(e.run.heartbeatAgeMs)} ago)` : ''}`,
    `  target ${task.targetKey ?? '(null)'}, workspace ${task.workspaceId ?? '(none)'}, writes ${task.writes === null ? '(whole workspace)' : task.writes.join(', ') || '(nothing)'}`,
    '',
    'WHY',
    ...e.reasons.flatMap((r) => wrap(r, width, '  - ', '    ')),
    ...(e.dependencies === null
      ? []
      : ['', `DEPENDENCIES: ${e.dependencies.length}`, ...e.dependencies.map((d) => `  ${d.id}  ${d.status}`)]),
    '',
    `GATES: ${e.gates.length}`,
    ...e.gates.map(
      (g) =>
        `  ${g.id}  ${g.status}  ${JSON.stringify(g.question)}${g.resolution === null ? '' : ` → ${JSON.stringify(g.resolution)}`}`,
    ),
    '',
    `DISPATCHES: ${e.dispatches.length}`,
    ...table(
      ['dispatch', 'terminal', 'status', 'started', 'error'],
      e.dispatches.map((d) => [
        d.id,
        d.terminalHandle,
        d.status,
        `${describeDuration(e.at - d.createdAt)} ago`,
        d.error ?? '-',
      ]),
      width,
    ).slice(e.dispatches.length === 0 ? 1 : 0),
    '',
    'LEASES',
    `  task lease: ${e.leases.task === null ? 'not held' : `${e.leases.task.holder}, token ${e.leases.task.token}, expires ${describeLeft(e.leases.task.leftMs)}`}`,
    ...(e.leases.workspaces.length === 0
      ? ['  workspace lock: none held for its workspace or run']
      : e.leases.workspaces.map(
          (l) => `  workspace lock ${l.workspaceId}: ${l.holder}, token ${l.token}, expires ${describeLeft(l.leftMs)}`,
        )),
    ...e.leases.paths.map((p) => `  path ${p.workspaceId}:/${p.path}  ${p.holder}, expires ${describeLeft(p.leftMs)}`),
  ];
  if (e.ownership.resources.length > 0 || e.ownership.cleanupAdmission !== null) {
    lines.push(
      '',
      `OWNERSHIP${e.ownership.cleanupAdmission === null ? '' : ` (admitted for ${e.ownership.cleanupAdmission})`}`,
    );
    for (const r of e.ownership.resources)
      lines.push(`  ${r.kind} ${r.id}  generation ${r.generation}, ${r.status}, cleanup ${r.cleanup}`);
  }
  return lines.map((line) => fit(line, width));
}
