/** `taskfence ui --db URL [--port N] [--host H] [--allow-actions]`: opens the store, serves the dashboard until SIGINT/SIGTERM. */
import { redactDatabaseUrl } from '../config.js';
import type { Io } from '../cli/commands.js';
import { opsTarget, type OpsArgs } from '../cli/ops.js';
import { schemaFor } from '../cli/args.js';
import { asParsedArgs } from '../cli/ops.js';
import { inspectStore } from '../inspect/index.js';
import { openStore } from '../store.js';
import { startDashboard } from './server.js';

/** Runs the dashboard; resolves to the exit code once a signal stops it. */
export async function runUiCommand(args: OpsArgs, io: Io): Promise<number> {
  const target = opsTarget(args, io.env);
  if (target.note) io.out(`taskfence: ${target.note}`);
  const schema = schemaFor(asParsedArgs(args), target.url);
  const store = await openStore({
    url: target.url,
    ...(schema === undefined ? {} : { schema }),
    ...(args.connectTimeoutMs === undefined ? {} : { connectTimeoutMs: args.connectTimeoutMs }),
  });
  try {
    // Fails now, in one line, on a database that is unreachable or behind this code.
    await inspectStore(store, { limit: 1 });
    const label = redactDatabaseUrl(target.url);
    const dashboard = await startDashboard({
      store,
      label,
      allowActions: args.allowActions,
      ...(args.host === undefined ? {} : { host: args.host }),
      ...(args.port === undefined ? {} : { port: args.port }),
      ...(args.staleAfterMs === undefined ? {} : { staleAfterMs: args.staleAfterMs }),
    });
    io.out(
      `taskfence ui: ${label} at ${dashboard.url} (${dashboard.actionToken === null ? 'read-only' : 'operator actions on'})`,
    );
    if (dashboard.actionToken !== null) {
      io.out(`taskfence ui: action token ${dashboard.actionToken}`);
      io.out(
        `taskfence ui: open ${dashboard.url}#token=${dashboard.actionToken} to act (the fragment never reaches the server's logs)`,
      );
    }
    await new Promise<void>((resolve) => {
      process.once('SIGINT', resolve);
      process.once('SIGTERM', resolve);
    });
    await dashboard.close();
    return 0;
  } finally {
    await store.close().catch(() => {});
  }
}
