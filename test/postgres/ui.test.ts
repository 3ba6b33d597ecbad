import { randomBytes } from 'node:crypto';
import { defineUiSuite } from '../suites/ui.suite.js';
import { postgresFixture } from '../support/dialects.js';

// The test server trusts local connections: a password in the URL is accepted and ignored, enough
// to prove that it appears in no response and no log line.
defineUiSuite(postgresFixture, (url) => {
  const parsed = new URL(url);
  if (parsed.password === '') parsed.password = `pw-${randomBytes(6).toString('hex')}`;
  return { url: parsed.toString(), secret: decodeURIComponent(parsed.password) };
});
