import { defineUiSuite } from '../suites/ui.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineUiSuite(sqliteFixture, (url) => ({ url, secret: null }));
