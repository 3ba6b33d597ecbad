import type { StoreContext } from './context.js';

/** Worker/coordinator messages (issue 3). */
// eslint-disable-next-line @typescript-eslint/no-empty-object-type
export interface MessageRepository {}

export function createMessageRepository(ctx: StoreContext): MessageRepository {
  void ctx;
  return {};
}
