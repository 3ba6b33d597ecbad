// The taskfence dashboard: plain browser JavaScript, no build step. It reads /api/config once,
// then renders every snapshot the server pushes on /api/events (server-sent events). Countdowns
// tick locally between snapshots on the store's clock (the offset from the last snapshot).
// Everything from the database is inserted as text, never as HTML.
const state = {
  config: null,
  snapshot: null,
  audit: [],
  offsetMs: 0,
  selectedRun: null,
  timeline: null,
  token: new URLSearchParams(location.hash.slice(1)).get('token'),
};
const EXPIRING_MS = 30_000;

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const child of children.flat()) if (child !== null && child !== undefined) el.append(child);
  return el;
}
const svgNs = 'http://www.w3.org/2000/svg';
function s(tag, attrs, ...children) {
  const el = document.createElementNS(svgNs, tag);
  for (const [k, v] of Object.entries(attrs ?? {})) el.setAttribute(k, String(v));
  for (const child of children) el.append(child);
  return el;
}

const now = () => Date.now() + state.offsetMs;
function duration(ms) {
  const abs = Math.abs(Math.round(ms));
  if (abs < 1000) return `${abs} ms`;
  const sec = Math.floor(abs / 1000);
  if (sec < 60) return `${sec} s`;
  const min = Math.floor(sec / 60);
  if (min < 60) return `${min} min ${sec % 60} s`;
  const hours = Math.floor(min / 60);
  return `${hours} h ${min % 60} min`;
}
function left(expiresAt) {
  const ms = expiresAt - now();
  return ms > 0 ? `in ${duration(ms)}` : `expired ${duration(ms)} ago`;
}
/** A cell that counts down to `expiresAt` (updated by tick()). */
function countdown(expiresAt) {
  return h('td', { class: 'left', dataset: { expires: expiresAt } }, left(expiresAt));
}
function table(el, header, rows, empty) {
  for (const row of rows) for (const cell of row.children) if (!cell.title) cell.title = cell.textContent;
  el.replaceChildren(
    h(
      'thead',
      {},
      h(
        'tr',
        {},
        header.map((c) => h('th', {}, c)),
      ),
    ),
    h('tbody', {}, rows.length ? rows : [h('tr', {}, h('td', { class: 'empty', colspan: header.length }, empty))]),
  );
}
function say(text) {
  document.getElementById('message').textContent = text;
}

async function act(name, body, confirmText) {
  if (!confirm(confirmText)) return;
  if (!state.token) {
    say('This action needs the token taskfence ui printed at start (paste it in the box above).');
    return;
  }
  const res = await fetch(`/api/actions/${name}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${state.token}` },
    body: JSON.stringify(body),
  });
  const answer = await res.json();
  say(res.ok ? `${name}: done (audit ${answer.auditId})` : `${name} refused: ${answer.error.message}`);
}
function actionButton(name, body, label, confirmText) {
  if (!state.config.actions) return null;
  return h(
    'button',
    { type: 'button', dataset: { action: name, ...body }, onclick: () => void act(name, body, confirmText) },
    label,
  );
}

function renderRuns(runs) {
  const rows = [...runs.running.items, ...runs.recentlyEnded.items].map((r) =>
    h(
      'tr',
      {
        class: ['selectable', r.stale ? 'stale' : '', state.selectedRun === r.id ? 'selected' : ''].join(' '),
        dataset: { run: r.id },
        onclick: () => {
          state.selectedRun = r.id;
          void loadTimeline();
          render();
        },
      },
      h('td', {}, r.stale ? 'STALE' : r.status),
      h('td', {}, r.targetKey ?? '(null target)'),
      h('td', {}, r.id),
      h('td', {}, r.status === 'running' ? `${duration(r.heartbeatAgeMs)} ago` : '-'),
      h(
        'td',
        {},
        Object.entries(r.tasks)
          .map(([k, n]) => `${n} ${k}`)
          .join(', ') || '-',
      ),
      h(
        'td',
        {},
        r.status === 'running'
          ? actionButton('fail-run', { runId: r.id }, 'fail run', `Fail run ${r.id}? Its target is freed.`)
          : null,
      ),
    ),
  );
  table(document.getElementById('runs'), ['state', 'target', 'run', 'heartbeat', 'tasks', ''], rows, 'no runs');
}

function renderLeases(locks) {
  const rows = [
    ...locks.workspaces.items.map((l) =>
      h(
        'tr',
        { dataset: { lease: `workspace:${l.workspaceId}`, expires: l.expiresAt } },
        h('td', {}, 'workspace'),
        h('td', {}, l.workspaceId),
        h('td', {}, l.runId ? `${l.holder} (run ${l.runId})` : l.holder),
        h('td', { class: 'token' }, String(l.token)),
        countdown(l.expiresAt),
        h(
          'td',
          {},
          actionButton(
            'release-workspace-lock',
            { workspaceId: l.workspaceId, token: l.token },
            'force release',
            `Release the lock on ${l.workspaceId} (token ${l.token}, held by ${l.holder})? The holder's token stops working.`,
          ),
        ),
      ),
    ),
    ...locks.tasks.items.map((l) =>
      h(
        'tr',
        { dataset: { lease: `task:${l.taskId}`, expires: l.expiresAt } },
        h('td', {}, 'task'),
        h('td', {}, l.taskId),
        h('td', {}, l.holder),
        h('td', { class: 'token' }, String(l.token)),
        countdown(l.expiresAt),
        h(
          'td',
          {},
          actionButton(
            'release-task-lease',
            { taskId: l.taskId, token: l.token },
            'force release',
            `Release the lease on task ${l.taskId} (token ${l.token}, held by ${l.holder})?`,
          ),
        ),
      ),
    ),
  ];
  table(
    document.getElementById('leases'),
    ['kind', 'on', 'holder', 'token', 'expires', ''],
    rows,
    'no workspace locks or task leases held',
  );
}

function treeNode(node, workspaceId) {
  const holders = node.leases.map((l) =>
    h(
      'span',
      { class: 'holder', dataset: { lease: `path:${workspaceId}:${node.path}:${l.holder}`, expires: l.expiresAt } },
      `${l.holder}${l.taskId ? ` (task ${l.taskId})` : ''} `,
      h('span', { class: 'left', dataset: { expires: l.expiresAt } }, left(l.expiresAt)),
    ),
  );
  return h(
    'li',
    {},
    h('span', {}, node.path === '' ? '/ (whole workspace)' : node.name),
    holders,
    node.children.length
      ? h(
          'ul',
          {},
          node.children.map((c) => treeNode(c, workspaceId)),
        )
      : null,
  );
}
function renderPaths(paths) {
  const el = document.getElementById('paths');
  if (paths.workspaces.items.length === 0) {
    el.replaceChildren(h('p', { class: 'empty' }, 'no live path leases'));
    return;
  }
  el.replaceChildren(
    ...paths.workspaces.items.map((w) =>
      h(
        'div',
        { dataset: { workspace: w.workspaceId } },
        h('h3', {}, `${w.workspaceId}: ${w.live} live, ${w.expired} expired`),
        h('ul', { class: 'tree' }, treeNode(w.tree, w.workspaceId)),
      ),
    ),
  );
}

function renderDispatches(dispatches) {
  table(
    document.getElementById('dispatches'),
    ['terminal', 'task', 'run', 'age', 'task lease'],
    dispatches.active.items.map((d) =>
      h(
        'tr',
        { dataset: { dispatch: d.id } },
        h('td', {}, d.terminalHandle),
        h('td', {}, `${d.taskId} ${d.taskTitle}`),
        h('td', {}, d.coordinatorRunId ?? '-'),
        h('td', {}, duration(d.ageMs)),
        d.lease ? countdown(d.lease.expiresAt) : h('td', {}, 'none'),
      ),
    ),
    'no active dispatches',
  );
}

function renderOwnership(ownership) {
  table(
    document.getElementById('ownership'),
    ['kind', 'id', 'owner task', 'generation', 'cleanup'],
    ownership.resources.items.map((r) =>
      h(
        'tr',
        {},
        h('td', {}, r.kind),
        h('td', {}, r.id),
        h('td', {}, r.ownerTaskId),
        h('td', {}, String(r.generation)),
        h('td', {}, r.cleanup === 'none' ? 'none' : `${r.cleanup} by ${r.cleanupClaimedBy}`),
      ),
    ),
    'no active environments or groups',
  );
}

function renderInbox(inbox) {
  table(
    document.getElementById('inbox'),
    ['handle', 'pending', 'in flight', 'redelivered', 'dead', 'oldest'],
    inbox.inboxes.items.map((i) =>
      h(
        'tr',
        { dataset: { inbox: i.handle } },
        h('td', {}, i.handle),
        h('td', {}, String(i.depth)),
        h('td', {}, String(i.inFlight)),
        h('td', {}, String(i.redelivered)),
        h('td', { class: i.dead > 0 ? 'expired' : '' }, String(i.dead)),
        h('td', {}, i.oldestAgeMs === null ? '-' : `${duration(i.oldestAgeMs)} ago`),
      ),
    ),
    'no pending messages',
  );
  table(
    document.getElementById('dead'),
    ['message', 'inbox', 'kind', 'attempts', 'dead since', 'last error', ''],
    inbox.dead.items.map((m) =>
      h(
        'tr',
        { dataset: { message: m.id } },
        h('td', {}, m.id),
        h('td', {}, m.handle),
        h('td', {}, m.kind),
        h('td', {}, String(m.attempts)),
        h('td', {}, `${duration(m.deadAgeMs)} ago`),
        h('td', {}, m.lastError ?? '-'),
        h(
          'td',
          {},
          actionButton(
            'requeue-message',
            { handle: m.handle, messageId: m.id },
            'requeue',
            `Requeue message ${m.id} in ${m.handle}? It is handed out again from attempt 1.`,
          ),
        ),
      ),
    ),
    'no dead messages',
  );
}

function renderSemaphores(semaphores) {
  table(
    document.getElementById('semaphores'),
    ['name', 'held / limit', 'token', 'holder', 'slot token', 'expires'],
    semaphores.semaphores.items.flatMap((m) => {
      const held = `${m.held}${m.limit === null ? '' : ` / ${m.limit}`}${m.expired ? ` (+${m.expired} expired)` : ''}`;
      const slots = m.slots.length ? m.slots : [null];
      return slots.map((slot, i) =>
        h(
          'tr',
          slot ? { dataset: { lease: `semaphore:${m.name}:${slot.token}`, expires: slot.expiresAt } } : {},
          h('td', {}, i === 0 ? m.name : ''),
          h('td', {}, i === 0 ? held : ''),
          h('td', {}, i === 0 ? String(m.token) : ''),
          h('td', {}, slot ? slot.holder : '-'),
          h('td', { class: 'token' }, slot ? String(slot.token) : '-'),
          slot ? countdown(slot.expiresAt) : h('td', {}, '-'),
        ),
      );
    }),
    'no semaphore slots held',
  );
}

function renderReadyQueue(q) {
  document.getElementById('ready-summary').textContent =
    `${q.ready.total} ready, ` +
    (q.dependenciesTracked
      ? `${q.blockedByDependency.total} blocked by a dependency, `
      : 'dependencies not tracked, ') +
    `${q.blockedByGate.total} blocked by a gate`;
  const row = (t, kind, why) =>
    h(
      'tr',
      { dataset: { queued: `${kind}:${t.id}` } },
      h('td', { class: `q-${kind}` }, kind),
      h('td', {}, `${t.id} ${t.title}`),
      h('td', {}, t.status),
      h('td', {}, duration(t.waitingMs)),
      h('td', {}, why),
    );
  table(
    document.getElementById('ready-queue'),
    ['queue', 'task', 'status', 'waiting', 'why'],
    [
      ...q.ready.items.map((t) => row(t, 'ready', 'next dispatch takes it')),
      ...q.blockedByDependency.items.map((t) =>
        row(t, 'dependency', `waits on ${t.waitingOn.map((d) => `${d.id} (${d.status})`).join(', ')}`),
      ),
      ...q.blockedByGate.items.map((t) =>
        row(t, 'gate', t.gates.map((g) => `gate ${g.id}: ${JSON.stringify(g.question)}`).join(', ')),
      ),
    ],
    'no task waiting',
  );
}

function renderAudit(audit) {
  const el = document.getElementById('audit');
  el.replaceChildren(
    ...(audit.length
      ? audit.map((e) =>
          h(
            'li',
            { dataset: { audit: e.id, action: e.action, subject: `${e.subjectKind}:${e.subjectId}` } },
            `${new Date(e.at).toISOString()} ${e.actor} ${e.action} ${e.subjectKind} ${e.subjectId}` +
              (e.token === null ? '' : ` token ${e.token}`),
          ),
        )
      : [h('li', { class: 'empty' }, 'nothing recorded yet')]),
  );
}

/** The run's dispatches on a time axis, one row per task. */
function renderTimeline(t) {
  const svg = document.getElementById('timeline');
  const start = t.run.startedAt;
  const end = Math.max(t.run.endedAt ?? now(), start + 1000);
  const width = svg.clientWidth || 900;
  const labelW = 220;
  const rowH = 20;
  const x = (ms) => labelW + ((ms - start) / (end - start)) * (width - labelW - 10);
  const rows = t.tasks.map((task, i) => {
    const y = 10 + i * rowH;
    const bars = t.dispatches
      .filter((d) => d.taskId === task.id)
      .map((d) =>
        s(
          'rect',
          {
            x: x(d.createdAt),
            y,
            width: Math.max(3, x(d.endedAt ?? now()) - x(d.createdAt)),
            height: rowH - 6,
            class: `s-${d.status}`,
            'data-dispatch': d.id,
          },
          s('title', {}, `${d.terminalHandle}: ${d.status}`),
        ),
      );
    const label = s('text', { x: 4, y: y + 11 }, `${task.title.slice(0, 28)}`);
    return s('g', { 'data-task': task.id }, label, ...bars);
  });
  svg.setAttribute('height', String(20 + Math.max(1, t.tasks.length) * rowH));
  svg.replaceChildren(...rows);
}

/**
 * The run's tasks as a graph coloured by status. Edges are the dependencies (`task_dependencies`):
 * an arrow from a task to each task that waits for it. A task's column is the length of its
 * longest chain of dependencies among the tasks shown, so every arrow points right.
 */
function renderDag(t) {
  const svg = document.getElementById('dag');
  const shown = new Set(t.tasks.map((task) => task.id));
  const edges = (t.dependencies ?? []).filter((e) => shown.has(e.taskId) && shown.has(e.dependsOnId));
  const waitsFor = new Map();
  for (const e of edges) waitsFor.set(e.taskId, [...(waitsFor.get(e.taskId) ?? []), e.dependsOnId]);
  const depth = new Map();
  const depthOf = (id, path = new Set()) => {
    if (depth.has(id)) return depth.get(id);
    if (path.has(id)) return 0; // a cycle (the store refuses them): cut it
    path.add(id);
    const d = Math.max(-1, ...(waitsFor.get(id) ?? []).map((dep) => depthOf(dep, path))) + 1;
    path.delete(id);
    depth.set(id, d);
    return d;
  };
  const columns = new Map();
  const pos = new Map();
  for (const task of t.tasks) {
    const d = depthOf(task.id);
    const row = columns.get(d) ?? 0;
    columns.set(d, row + 1);
    pos.set(task.id, { x: 10 + d * 250, y: 10 + row * 40 });
  }
  const defs = s(
    'defs',
    {},
    s(
      'marker',
      { id: 'dag-arrow', viewBox: '0 0 10 10', refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto' },
      s('path', { d: 'M0,0 L10,5 L0,10 z', fill: '#7d8b99' }),
    ),
  );
  const lines = edges.map((e) => {
    const a = pos.get(e.dependsOnId);
    const b = pos.get(e.taskId);
    return s(
      'line',
      {
        x1: a.x + 200,
        y1: a.y + 14,
        x2: b.x - 2,
        y2: b.y + 14,
        stroke: '#7d8b99',
        'marker-end': 'url(#dag-arrow)',
        'data-edge': `${e.dependsOnId}>${e.taskId}`,
      },
      s('title', {}, 'waits for'),
    );
  });
  const nodes = t.tasks.map((task) => {
    const p = pos.get(task.id);
    return s(
      'g',
      { 'data-task': task.id, 'data-status': task.status },
      s('rect', { x: p.x, y: p.y, width: 200, height: 28, rx: 4, class: `s-${task.status}` }),
      s('text', { x: p.x + 6, y: p.y + 18 }, `${task.status}: ${task.title.slice(0, 22)}`),
    );
  });
  svg.setAttribute('height', String(20 + Math.max(1, ...columns.values()) * 40));
  svg.replaceChildren(defs, ...lines, ...nodes);
}

async function loadTimeline() {
  if (!state.selectedRun) return;
  const res = await fetch(`/api/runs/${encodeURIComponent(state.selectedRun)}`);
  state.timeline = res.ok ? await res.json() : null;
  render();
}

function render() {
  const snap = state.snapshot;
  if (!snap) return;
  renderRuns(snap.runs);
  renderLeases(snap.locks);
  renderPaths(snap.paths);
  renderSemaphores(snap.semaphores);
  renderReadyQueue(snap.readyQueue);
  renderDispatches(snap.dispatches);
  renderOwnership(snap.ownership);
  renderInbox(snap.inbox);
  renderAudit(state.audit);
  const section = document.getElementById('run-section');
  section.hidden = !state.timeline;
  if (state.timeline) {
    document.getElementById('run-title').textContent = state.timeline.run.id;
    renderTimeline(state.timeline);
    renderDag(state.timeline);
  }
  tick();
}

/** Counts every lease down and marks the ones about to expire. */
function tick() {
  document.getElementById('clock').textContent = new Date(now()).toISOString().slice(11, 19) + ' (store clock)';
  for (const el of document.querySelectorAll('[data-expires]')) {
    const ms = Number(el.dataset.expires) - now();
    el.classList.toggle('expiring', ms > 0 && ms <= EXPIRING_MS);
    el.classList.toggle('expired', ms <= 0);
    if (el.classList.contains('left')) el.textContent = left(Number(el.dataset.expires));
  }
}

async function start() {
  state.config = await (await fetch('/api/config')).json();
  document.getElementById('label').textContent = state.config.label;
  const mode = document.getElementById('mode');
  mode.textContent = state.config.actions ? 'operator actions on' : 'read-only';
  if (state.config.actions && !state.token) {
    const form = document.getElementById('token-form');
    form.hidden = false;
    document.getElementById('token').addEventListener('change', (e) => (state.token = e.target.value.trim()));
  }
  const live = document.getElementById('live');
  const events = new EventSource('/api/events');
  events.addEventListener('snapshot', (e) => {
    const frame = JSON.parse(e.data);
    state.snapshot = frame.snapshot;
    state.audit = frame.audit;
    state.offsetMs = frame.snapshot.runs.at - Date.now();
    state.selectedRun ??= frame.snapshot.runs.running.items[0]?.id ?? null;
    live.textContent = 'live';
    live.className = 'badge on';
    render();
    if (state.selectedRun) void loadTimeline();
  });
  events.addEventListener('failure', (e) => say(JSON.parse(e.data).error.message));
  events.addEventListener('error', () => {
    live.textContent = 'disconnected (retrying)';
    live.className = 'badge off';
  });
  setInterval(tick, 250);
}

void start();
