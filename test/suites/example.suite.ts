/** examples/embed/ run as a service: started on port 0, driven over HTTP, its invariants checked. */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startService } from '../../examples/embed/service.js';
import type { DialectFixture } from '../support/fixtures.js';

export function defineExampleSuite(makeFixture: () => DialectFixture) {
  describe('examples/embed service', () => {
    let fx: DialectFixture;
    let service: Awaited<ReturnType<typeof startService>>;
    const call = async (method: string, path: string, body?: unknown) => {
      const res = await fetch(`http://127.0.0.1:${service.port}${path}`, {
        method,
        ...(body === undefined ? {} : { body: JSON.stringify(body), headers: { 'content-type': 'application/json' } }),
      });
      return { status: res.status, body: (await res.json()) as Record<string, unknown> };
    };
    beforeAll(async () => {
      fx = makeFixture();
      service = await startService({ url: await fx.freshUrl() });
    });
    afterAll(async () => {
      await service?.close();
      await fx.cleanup();
    });

    it('puts, moves and lists items; refuses a move of an item that is elsewhere', async () => {
      expect(await call('POST', '/boxes/a/items', { item: 'hammer' })).toEqual({
        status: 201,
        body: { item: 'hammer', box: 'a' },
      });
      expect((await call('POST', '/boxes/b/items', { item: 'hammer' })).status).toBe(409);
      expect(await call('POST', '/moves', { item: 'hammer', from: 'a', to: 'b' })).toEqual({
        status: 200,
        body: { item: 'hammer', box: 'b' },
      });
      expect((await call('POST', '/moves', { item: 'hammer', from: 'a', to: 'c' })).status).toBe(409);
      expect(await call('GET', '/boxes/b')).toEqual({ status: 200, body: { items: ['hammer'] } });
      expect(await call('GET', '/boxes/a')).toEqual({ status: 200, body: { items: [] } });
      expect((await call('POST', '/moves', { item: 'x' })).status).toBe(400);
    });

    it('concurrent moves in opposite directions neither deadlock nor lose or duplicate an item', async () => {
      const items = Array.from({ length: 6 }, (_, i) => `item-${i}`);
      for (const item of items)
        expect(
          (
            await call(
              'POST',
              `/boxes/${item.endsWith('0') || item.endsWith('2') || item.endsWith('4') ? 'x' : 'y'}/items`,
              { item },
            )
          ).status,
        ).toBe(201);
      // Every item bounces x↔y a few times, all at once; a move finds its item where the last one left it or gets 409.
      const results = await Promise.all(
        items.flatMap((item) =>
          [0, 1, 2].flatMap(() => [
            call('POST', '/moves', { item, from: 'x', to: 'y' }),
            call('POST', '/moves', { item, from: 'y', to: 'x' }),
          ]),
        ),
      );
      expect(results.every((r) => r.status === 200 || r.status === 409)).toBe(true);
      const [x, y] = [await call('GET', '/boxes/x'), await call('GET', '/boxes/y')];
      const all = [...(x.body.items as string[]), ...(y.body.items as string[])].sort();
      expect(all).toEqual(items);
    });
  });
}
