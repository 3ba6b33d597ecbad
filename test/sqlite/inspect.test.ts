import { defineInspectSuite } from '../suites/inspect.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineInspectSuite(sqliteFixture, (url) => ({ url, secret: null }));
