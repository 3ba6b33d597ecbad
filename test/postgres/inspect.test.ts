import { randomBytes } from 'node:crypto';
import { defineInspectSuite } from '../suites/inspect.suite.js';
import { postgresFixture } from '../support/dialects.js';

// The test server trusts local connections, so a password in the URL is accepted and ignored:
// enough to prove that it is never printed.
defineInspectSuite(postgresFixture, (url) => {
  const parsed = new URL(url);
  if (parsed.password === '') parsed.password = `pw-${randomBytes(6).toString('hex')}`;
  return { url: parsed.toString(), secret: decodeURIComponent(parsed.password) };
});
