import { defineLifecycleSuite } from '../suites/lifecycle.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineLifecycleSuite(sqliteFixture);
