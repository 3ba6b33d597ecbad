import type pg from 'pg';

/**
 * A host's `pg.Pool` as taskfence's driver sees it: every query carries taskfence's type parsers
 * (int8 as a number) unless it names its own, while the host's own queries keep the pool's; and
 * `end()` does nothing, so closing the store leaves the host's pool open.
 */
export function hostPool(pool: pg.Pool, types: pg.CustomTypesConfig): pg.Pool {
  // One wrapper per client, so per-client bookkeeping (error listeners) sees the same object.
  const wrapped = new WeakMap<pg.PoolClient, pg.PoolClient>();
  const wrap = (client: pg.PoolClient): pg.PoolClient => {
    let proxy = wrapped.get(client);
    if (!proxy) {
      proxy = new Proxy(client, {
        get(target, property) {
          if (property === 'query') {
            return (config: unknown, ...rest: unknown[]) => {
              const plain = typeof config === 'object' && config !== null && !('submit' in config) && (config as pg.QueryConfig).types === undefined;
              return (target.query as (...args: unknown[]) => unknown)(plain ? { ...(config as pg.QueryConfig), types } : config, ...rest);
            };
          }
          const value: unknown = Reflect.get(target, property, target);
          return typeof value === 'function' ? value.bind(target) : value;
        },
      });
      wrapped.set(client, proxy);
    }
    return proxy;
  };
  return {
    connect: async () => wrap(await pool.connect()),
    end: async () => {},
    on: () => undefined,
  } as unknown as pg.Pool;
}
