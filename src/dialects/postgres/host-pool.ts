import type pg from 'pg';
import type { KyselyPlugin } from 'kysely';
import { extend } from '../../objects.js';

/**
 * A host's `pg.Pool` as taskfence's driver sees it: every query carries taskfence's type parsers
 * (int8 as a number) unless it names its own, while the host's own queries keep the pool's; and
 * `end()` leaves the host's pool open.
 *
 * While the store is open, `onIdleError` listens to the pool's `error` event (an idle client
 * lost its server): pg-pool throws that event when nobody listens, which would crash a host
 * that attached no listener of its own. `end()` (the store's `close()`) removes it again; the
 * host's own listeners run as before either way.
 */
export function hostPool(pool: pg.Pool, types: pg.CustomTypesConfig, onIdleError: (error: Error) => void): pg.Pool {
  pool.on('error', onIdleError);
  // One wrapper per client, so per-client bookkeeping (error listeners) sees the same object.
  const wrapped = new WeakMap<pg.PoolClient, pg.PoolClient>();
  const wrap = (client: pg.PoolClient): pg.PoolClient => {
    let proxy = wrapped.get(client);
    if (!proxy) {
      proxy = new Proxy(client, {
        get(target, property) {
          if (property === 'query') {
            return (config: unknown, ...rest: unknown[]) => {
              const plain =
                typeof config === 'object' &&
                config !== null &&
                !('submit' in config) &&
                (config as pg.QueryConfig).types === undefined;
              return (target.query as (...args: unknown[]) => unknown)(
                plain ? extend(config as pg.QueryConfig, { types }) : config,
                ...rest,
              );
            };
          }
          const value: unknown = Reflect.get(target, property, target);
          // eslint-disable-next-line @typescript-eslint/no-unsafe-return -- a proxy forwards whatever the pool has
          return typeof value === 'function' ? value.bind(target) : value;
        },
      });
      wrapped.set(client, proxy);
    }
    return proxy;
  };
  return {
    connect: async () => wrap(await pool.connect()),
    end: async () => {
      pool.off('error', onIdleError);
    },
    on: () => undefined,
  } as unknown as pg.Pool;
}

const INT8_KEY = /(_at|^token|_token|generation)$/;
const INTEGER_TEXT = /^-?\d{1,16}$/;

/**
 * For a host's transaction joined with `store.withTransaction`: the host's pg connection parses
 * int8 as strings, and taskfence's int8 columns (epoch-ms `*_at` columns, fencing tokens and
 * generations) must read back as numbers, as on taskfence's own pool. No text column of
 * taskfence's schema has such a name.
 */
export const int8AsNumbers: KyselyPlugin = {
  transformQuery: (args) => args.node,
  transformResult: async ({ result }) => {
    for (const row of result.rows as Record<string, unknown>[]) {
      for (const key in row) {
        const value = row[key];
        if (typeof value === 'string' && INT8_KEY.test(key) && INTEGER_TEXT.test(value)) row[key] = Number(value);
      }
    }
    return result;
  },
};
