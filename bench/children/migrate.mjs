// Child process: migrates one database with taskfence (built dist) and prints time and peak RSS.
import { openStore } from '../../dist/index.js';

const [url, to] = process.argv.slice(2);
const store = await openStore(url);
const t0 = performance.now();
let progressEvents = 0;
await store.migrate({
  ...(to ? { to: Number(to) } : {}),
  onEvent: (e) => {
    if (e.type === 'progress') progressEvents++;
  },
});
const ms = performance.now() - t0;
const flagged =
  to && Number(to) >= 52
    ? Number(
        (
          await store.db
            .selectFrom('tasks')
            .select((eb) => eb.fn.countAll().as('n'))
            .where('requires_filesystem', '=', 1)
            .executeTakeFirst()
        ).n,
      )
    : null;
await store.close();
console.log(JSON.stringify({ ms, maxRssMB: process.resourceUsage().maxRSS / 1024, flagged, progressEvents }));
