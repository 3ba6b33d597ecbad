import type { DoctorTarget, Store, StoreDialect } from '../../src/index.js';

/**
 * A store's dialect with some methods replaced (a test-only faulty dialect, e.g. a lock that is a
 * no-op); every other member is the real one, bound to the real instance.
 */
export function dialectWith(dialect: StoreDialect, overrides: Partial<StoreDialect>): StoreDialect {
  return new Proxy(dialect, {
    get(target, property) {
      if (Object.prototype.hasOwnProperty.call(overrides, property)) return overrides[property as keyof StoreDialect];
      const value: unknown = Reflect.get(target, property, target);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
}

/** What `runDoctor` examines: the store's location and history, with `dialect` in place of its own. */
export function doctorTarget(store: Store, dialect: StoreDialect): DoctorTarget {
  return { dialect, location: store.location, migrationStatus: () => store.migrationStatus() };
}

/**
 * The store's write lock switched off: PostgreSQL's advisory lock becomes a no-op that reports
 * success (as on engines that accept the call and do nothing); SQLite's write transactions begin
 * deferred instead of IMMEDIATE.
 */
export function withoutWriteLock(store: Store): StoreDialect {
  const real = store.dialect;
  return real.kind === 'postgres'
    ? dialectWith(real, { lockKey: async () => {} })
    : dialectWith(real, { writeTransaction: (fn) => real.readTransaction(fn) });
}
